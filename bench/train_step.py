"""One training step, ours vs transformers: forward + backward + AdamW on the same batch and weights,
interleaved so that load drift hits both alike. The quick check behind the changes in BENCHMARKS.md;
`bench.training` is the full 10-minute comparison.

    python -m bench.train_step --preset mini --batch 32 --seq-len 128 --rounds 3
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from bench.train_peer import IGNORED, transformers_twin
from model import BertConfig, BertForPreTraining


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="mini")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round and system")
    parser.add_argument("--rounds", type=int, default=3)
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
        mlm, nsp = ours.pretraining_logits(ids, types, mask, positions)
        return F.cross_entropy(mlm, ids[positions]) + F.cross_entropy(nsp, nsp_labels)

    def peer_loss():
        return peer(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels,
                    next_sentence_label=nsp_labels).loss

    systems = {"ours": (ours, our_loss), "transformers": (peer, peer_loss)}
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-4) for name, (model, _) in systems.items()}
    print(f"{args.preset}, batch {args.batch} x {args.seq_len}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    for round_index in range(args.rounds):
        times = {}
        for name, (_, loss_fn) in systems.items():
            optimizer = optimizers[name]
            for step in range(args.steps + 2):  # two untimed warm-up steps
                if step == 2:
                    started = time.perf_counter()
                loss_fn().backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            times[name] = (time.perf_counter() - started) / args.steps
        print(f"round {round_index + 1}: ours {times['ours'] * 1000:.1f} ms/step, transformers "
              f"{times['transformers'] * 1000:.1f} ms/step, ratio {times['transformers'] / times['ours']:.2f}x")


if __name__ == "__main__":
    main()
