"""Where int8's error in a ColBERT's vectors comes from, and what keeping the order of 64 passages would ask of any
reduced precision (BENCHMARKS.md, "Reranking"):

    python -m bench.rerank.int8_budget            # ~2 min on 2 cores; builds the PyLate model under runs/rerank once
    python -m bench.rerank.int8_budget --checkpoint DIR      # a ColBERT of yours, in PyLate's or colbert-ai's format

A ColBERT is judged per token vector, where int8's rounding does not average out over a sentence as it does in one
pooled embedding. Each row quantizes one part of the encoder and leaves the rest in float32, on the benchmark's PyLate
model: the served scheme itself (`kernels.quantize` as `--dtype int8` runs it on a ColBERT: the feed-forward output
layer's input in 12 bits, smoothed less), the same with that layer smoothed as the others, the same with every input
in 8 bits (what an embedder gets); then the 8-bit scheme's rounding simulated in float32 on the weights alone, on the
Linear layers' inputs alone, on the feed-forward output layer's input alone (GELU's output, 1,536 wide), and on every
input but that one; the 8-bit scheme with that layer kept in float32, and bfloat16 throughout. The real encoders are also timed on the 64 passages as one padded batch, in process. Queries
and documents are itemised as the service does (service.frontend.colbert_inputs); the scores are MaxSim sums.

The first line printed is the float32 reference's spacing: the smallest and the median score difference between
neighbours in a query's ranking. Keeping a whole ranking needs every score's error under the smallest.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.rerank import checkpoints, texts
from bench.rerank.exactness import kendall_tau
from bench.serving.timing import best_ms
from devkit.paths import REPO_ROOT
from kernels.quantize import calibrate, is_feed_forward_output, quantize, smoothing
from model.checkpoint import load_checkpoint
from service.engine.precision import CALIBRATION_TEXT, INT8_ALPHA, INT8_SCHEME, LATE_INTERACTION_FEED_FORWARD_OUTPUT_ALPHA, \
    LATE_INTERACTION_FEED_FORWARD_OUTPUT_BITS
from service.frontend.colbert_inputs import ColbertTokens, colbert_inputs


def items(checkpoint, passages: list[str], queries: list[str]) -> tuple[list, list]:
    colbert = ColbertTokens.of(checkpoint.tokenizer, checkpoint.late_interaction)
    def made(texts_: list[str], mode: str) -> list:
        return [m.items[0] for m in colbert_inputs(colbert, texts_, mode, "truncate", 0, mode)]
    return made(queries, "query"), made(passages, "document")


@torch.inference_mode()
def vectors(model, made: list) -> list[np.ndarray]:
    """Each item's kept tokens' normalised projections, one item at a time (no batching to differ)."""
    found = []
    for item in made:
        ids = torch.tensor([item.input_ids])
        mask = torch.ones_like(ids)
        if item.keys is not None:  # a query that does not attend to its expansion
            mask[0, item.keys:] = 0
        hidden = model.bert(ids, torch.zeros_like(ids), mask)[0][0]
        kept = item.kept if item.kept is not None else range(len(item))
        found.append(F.normalize(model.projection(hidden[list(kept)]).float(), dim=-1).numpy())
    return found


@torch.inference_mode()
def batch_ms(model, made: list, repeats: int = 3) -> float:
    """The encoder's time for `made` as one padded batch (the fastest of `repeats`, after a warm-up)."""
    longest = max(len(item) for item in made)
    ids = torch.tensor([item.input_ids + [0] * (longest - len(item)) for item in made])
    mask = torch.tensor([[1] * len(item) + [0] * (longest - len(item)) for item in made])
    return best_ms(lambda: model.bert(ids, torch.zeros_like(ids), mask), repeats, warm_ups=1)


def maxsim(queries: list[np.ndarray], documents: list[np.ndarray]) -> np.ndarray:
    return np.array([[float((q @ d.T).max(axis=1).sum()) for d in documents] for q in queries])


def rounded_rows(x: torch.Tensor) -> torch.Tensor:
    """Symmetric int8 rounding with one scale per row (per token for inputs, per output channel for weights)."""
    scale = x.abs().amax(-1, keepdim=True).clamp(min=1e-8) / 127
    return (x / scale).round() * scale


def simulated(base, stats: dict, weights: bool, inputs: str) -> nn.Module:
    """`base` with the served scheme's smoothing, and its int8 rounding on the weights (`weights`) and on the inputs of
    "all" Linear layers, "ffn-out" (the feed-forward output layers) alone, "not-ffn-out", or "none"."""
    model = copy.deepcopy(base)
    for name, linear in model.bert.encoder.named_modules():
        if not isinstance(linear, nn.Linear):
            continue
        ffn_out = is_feed_forward_output(name)
        s = smoothing(stats[name], linear.weight, INT8_ALPHA)
        linear.weight.data = linear.weight.data * s[None, :]
        if weights:
            linear.weight.data = rounded_rows(linear.weight.data)
        round_input = {"all": True, "none": False, "ffn-out": ffn_out, "not-ffn-out": not ffn_out}[inputs]

        def smoothed(_module, args, s=s, round_input=round_input):
            x = args[0] / s
            return (rounded_rows(x) if round_input else x,)
        linear.register_forward_pre_hook(smoothed)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=REPO_ROOT / "runs" / "rerank", help="where the models are built")
    parser.add_argument("--checkpoint", type=Path, help="a ColBERT of yours (default: the benchmark's PyLate model)")
    parser.add_argument("--queries", type=int, default=8)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    checkpoint = load_checkpoint(args.checkpoint or checkpoints.build(args.work).pylate)
    if checkpoint.late_interaction is None:
        raise SystemExit(f"{args.checkpoint}: not a ColBERT checkpoint (no late-interaction recipe)")
    passages = texts.passages(64)
    queries_made, documents_made = items(checkpoint, passages, texts.queries(passages, args.queries))
    base = checkpoint.model.float().eval()
    reference = vectors(base, queries_made), vectors(base, documents_made)
    want = maxsim(*reference)
    gaps = -np.diff(np.sort(want, axis=1)[:, ::-1], axis=1)
    print(f"float32 reference: neighbours' score gap smallest {gaps.min():.5f}, median {np.median(gaps):.4f}\n")
    sentences = [line for line in CALIBRATION_TEXT.read_text(encoding="utf-8").splitlines() if line.strip()]
    batches = [(torch.tensor([e.ids]), torch.tensor([e.type_ids]))
               for e in checkpoint.tokenizer.encode_batch(sentences, truncate=True)]
    stats = calibrate(copy.deepcopy(base), batches)
    ffn_out = tuple(f"layer.{i}.output.dense" for i in range(checkpoint.config.num_hidden_layers))
    rows = [
        (f"int8 as served (feed-forward output's input {LATE_INTERACTION_FEED_FORWARD_OUTPUT_BITS}-bit, alpha "
         f"{LATE_INTERACTION_FEED_FORWARD_OUTPUT_ALPHA} there)",
         lambda: quantize(copy.deepcopy(base), INT8_SCHEME, stats, alpha=INT8_ALPHA,
                          feed_forward_output_bits=LATE_INTERACTION_FEED_FORWARD_OUTPUT_BITS,
                          feed_forward_output_alpha=LATE_INTERACTION_FEED_FORWARD_OUTPUT_ALPHA), True),
        (f"int8, that input {LATE_INTERACTION_FEED_FORWARD_OUTPUT_BITS}-bit, alpha {INT8_ALPHA} throughout",
         lambda: quantize(copy.deepcopy(base), INT8_SCHEME, stats, alpha=INT8_ALPHA,
                          feed_forward_output_bits=LATE_INTERACTION_FEED_FORWARD_OUTPUT_BITS), False),
        ("int8, every input 8-bit", lambda: quantize(copy.deepcopy(base), INT8_SCHEME, stats, alpha=INT8_ALPHA), True),
        ("simulated: weights only", lambda: simulated(base, stats, True, "none"), False),
        ("simulated: every Linear's input only", lambda: simulated(base, stats, False, "all"), False),
        ("simulated: feed-forward output's input only", lambda: simulated(base, stats, False, "ffn-out"), False),
        ("simulated: every input but that one", lambda: simulated(base, stats, False, "not-ffn-out"), False),
        ("int8, feed-forward output layers in float32",
         lambda: quantize(copy.deepcopy(base), INT8_SCHEME, stats, alpha=INT8_ALPHA, keep=ffn_out), True),
        ("bfloat16", lambda: copy.deepcopy(base).to(torch.bfloat16), True),
        ("float32", lambda: base, True),
    ]
    print("| encoder | min / mean cosine | max score diff | Kendall tau | top-10 kept | 64 passages, ms |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, build, timed in rows:
        model = build()
        got = vectors(model, queries_made), vectors(model, documents_made)
        elapsed = batch_ms(model, documents_made) if timed else None
        cosines = np.concatenate([(a * b).sum(1) for a, b in zip(got[0] + got[1], reference[0] + reference[1])])
        scores = maxsim(*got)
        top10 = np.mean([(np.argsort(-m)[:10] == np.argsort(-w)[:10]).all() for m, w in zip(scores, want)])
        tau = np.mean([kendall_tau(m, w) for m, w in zip(scores, want)])
        print(f"| {name} | {cosines.min():.5f} / {cosines.mean():.5f} | {np.abs(scores - want).max():.3f} | "
              f"{tau:.3f} | {top10:.0%} | {'-' if elapsed is None else f'{elapsed:,.0f}'} |", flush=True)


if __name__ == "__main__":
    main()
