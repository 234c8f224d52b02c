"""Foundation figures: parameter counts of each preset, and forward throughput of our network vs
transformers.BertModel with the same weights, measured in one run with interleaved repeats.

    python -m bench.forward --preset mini --batch 32 --seq-len 128
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import transformers

from model import PRESETS, BertConfig, BertForPreTraining
from model.flops import count_parameters


def parameter_table(vocab_sizes=(30522, 8192)) -> str:
    lines = ["| preset | layers/hidden/heads/FFN | " + " | ".join(f"params, vocab {v:,}" for v in vocab_sizes) +
             " | non-embedding params |", "|---|---|" + "---|" * (len(vocab_sizes) + 1)]
    for name in PRESETS:
        counts = []
        for vocab in vocab_sizes:
            model = BertForPreTraining(BertConfig.preset(name, vocab_size=vocab))
            counts.append(count_parameters(model))
        c = BertConfig.preset(name)
        body = count_parameters(BertForPreTraining(BertConfig.preset(name, vocab_size=vocab_sizes[0])), exclude_embeddings=True)
        lines.append(f"| {name} | {c.num_hidden_layers}/{c.hidden_size}/{c.num_attention_heads}/{c.intermediate_size} | "
                     + " | ".join(f"{n / 1e6:.2f} M" for n in counts) + f" | {body / 1e6:.2f} M |")
    return "\n".join(lines)


@torch.inference_mode()
def throughput(preset: str, batch: int, seq_len: int, repeats: int, vocab: int) -> dict:
    torch.manual_seed(0)
    ours = BertForPreTraining(BertConfig.preset(preset, vocab_size=vocab)).eval()
    hf = transformers.BertModel(transformers.BertConfig(**ours.config.to_dict()), add_pooling_layer=True).eval()
    hf.load_state_dict({k.removeprefix("bert."): v for k, v in ours.state_dict().items() if k.startswith("bert.")},
                       strict=False)
    ids = torch.randint(5, vocab, (batch, seq_len))
    mask = torch.ones_like(ids)
    mask[batch // 2 :, seq_len * 3 // 4 :] = 0  # half the batch padded, as real batches are
    runs = {"ours": lambda: ours.bert(ids, None, mask), "transformers": lambda: hf(input_ids=ids, attention_mask=mask)}
    with torch.no_grad():
        diff = (runs["ours"]()[0] - runs["transformers"]().last_hidden_state)[mask.bool()].abs().max().item()
    times: dict[str, list[float]] = {k: [] for k in runs}
    for fn in runs.values():
        fn()  # warm-up
    for _ in range(repeats):
        for name, fn in runs.items():  # interleaved, so drift in machine load hits both alike
            started = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - started)
    medians = {k: statistics.median(v) for k, v in times.items()}
    return {"medians": medians, "max_abs_diff": diff,
            "seq_per_s": {k: batch / v for k, v in medians.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="mini")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--vocab", type=int, default=8192)
    args = parser.parse_args()
    print(parameter_table())
    result = throughput(args.preset, args.batch, args.seq_len, args.repeats, args.vocab)
    print(f"\n{args.preset}, batch {args.batch} x {args.seq_len} tokens, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; median of {args.repeats} interleaved runs")
    print("| model | median ms/batch | sequences/s |\n|---|---|---|")
    for name, seconds in result["medians"].items():
        print(f"| {name} | {seconds * 1000:.1f} | {result['seq_per_s'][name]:.1f} |")
    ratio = result["seq_per_s"]["ours"] / result["seq_per_s"]["transformers"]
    print(f"\nours / transformers = {ratio:.2f}x; max |difference| of last hidden states = {result['max_abs_diff']:.1e}")


if __name__ == "__main__":
    main()
