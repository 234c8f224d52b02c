"""One training step, ours vs transformers: forward + backward + AdamW on the same batch and weights,
interleaved so that load drift hits both alike, in float32 and (where the CPU has native bf16) under
bfloat16 autocast with float32 master weights, as the trainer's --precision runs it. The quick check
behind the changes in BENCHMARKS.md; `bench.training.speed` is the full 10-minute comparison.

    python -m bench.training.step_time --preset mini --batch 32 --seq-len 128 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
import torch.nn.functional as F

from bench.training.peer import IGNORED, transformers_twin
from model import BertConfig, BertForPreTraining
from model.device import cpu_has_native_bf16
from trainer.forward import pretraining_logits


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="mini")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round and system")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True,
                        help="also time both under bfloat16 autocast (CPUs with native bf16 only)")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    ours = BertForPreTraining(BertConfig.preset(args.preset, vocab_size=args.vocab)).train()
    peer = transformers_twin(ours.config).train()
    peer.load_state_dict(ours.state_dict(), strict=False)
    ids = torch.randint(5, args.vocab, (args.batch, args.seq_len))
    types = torch.zeros_like(ids)
    types[:, args.seq_len // 2 :] = 1
    mask = torch.ones_like(ids)
    positions = torch.rand(ids.shape) < 0.15
    positions[:, 0] = False
    nsp_labels = torch.randint(0, 2, (args.batch,))
    labels = torch.where(positions, ids, IGNORED)

    def our_loss():
        mlm, nsp, _ = pretraining_logits(ours, ids, types, mask, positions)
        return F.cross_entropy(mlm, ids[positions]) + F.cross_entropy(nsp, nsp_labels)

    def peer_loss():
        return peer(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels,
                    next_sentence_label=nsp_labels).loss

    precisions = ["float32"] + (["bfloat16"] if args.bf16 and cpu_has_native_bf16() else [])
    systems = {(name, precision): (model, loss_fn) for precision in precisions
               for name, (model, loss_fn) in {"ours": (ours, our_loss), "transformers": (peer, peer_loss)}.items()}
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-4) for name, model in
                  {"ours": ours, "transformers": peer}.items()}
    print(f"{args.preset}, batch {args.batch} x {args.seq_len}, {torch.get_num_threads()} threads, torch {torch.__version__}"
          f", precisions {', '.join(precisions)}")
    for round_index in range(args.rounds):
        times = {}
        for (name, precision), (_, loss_fn) in systems.items():
            optimizer = optimizers[name]
            autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bfloat16" else \
                contextlib.nullcontext()
            for step in range(args.steps + 2):  # two untimed warm-up steps
                if step == 2:
                    started = time.perf_counter()
                with autocast:
                    loss = loss_fn()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            times[name, precision] = (time.perf_counter() - started) / args.steps
        line = ", ".join(f"{name} {precision} {seconds * 1000:.1f} ms" for (name, precision), seconds in times.items())
        best = {name: min(s for (n, _), s in times.items() if n == name) for name in ("ours", "transformers")}
        print(f"round {round_index + 1}: {line}; best vs best {best['transformers'] / best['ours']:.2f}x"
              + "".join(f"; {name} bf16 vs float32 {times[name, 'float32'] / times[name, 'bfloat16']:.2f}x"
                        for name in ("ours", "transformers") if (name, "bfloat16") in times))


if __name__ == "__main__":
    main()
