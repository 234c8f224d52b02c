"""Reranking and long inputs, in one run (BENCHMARKS.md, "Reranking: ColBERT and long inputs"):

- exactness: a ColBERT of all-MiniLM-L6-v2's shape built by PyLate, served here in float32, bfloat16 and int8, against
  PyLate's own encoder (vectors, MaxSim scores, each query's ranking of 64 passages); one built by colbert-ai against
  colbert-ai's encoder;
- speed: one query against 64 passages of about 100 words, one client, p50: the service's /v1/rerank against PyLate
  in process and Infinity (bench/rerank/speed.py says what each does);
- long inputs: a 4,000-word document in one /embed request against its windows embedded one by one, and its tokens/s
  against short passages'.

    python -m bench.rerank --infinity .venv-peers/bin/infinity_emb                    # ~15 min on 2 busy cores
    python -m bench.rerank --short --infinity .venv-peers/bin/infinity_emb            # the same, fewer repeats

Needs PyLate and colbert-ai (.venv-colbert-reference, made by `make test`); without --infinity the Infinity rows are
left out. The models are built once under --work and reused. On a shared machine keep other benchmarks off it while
it runs (flock on a lock file every benchmark takes) and read its ratios, not its milliseconds.
"""

from __future__ import annotations

import argparse
import json
import platform
from dataclasses import asdict
from pathlib import Path

from bench.rerank import checkpoints, exactness, long_inputs, speed, texts
from devkit.paths import REPO_ROOT, minilm_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--infinity", help="the infinity_emb command (requirements/peers.txt); its rows need it")
    parser.add_argument("--short", action="store_true", help="fewer queries, rounds and repeats (a smoke run)")
    parser.add_argument("--work", type=Path, default=REPO_ROOT / "runs" / "rerank", help="models and the report")
    parser.add_argument("--parts", nargs="+", default=["exactness", "speed", "long"],
                        choices=["exactness", "speed", "long"])
    parser.add_argument("--overlaps", nargs="+", type=int, metavar="N",
                        help="long inputs: measure with each --long-input-overlap (default: the service's default)")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    models = checkpoints.build(args.work)
    passages = texts.passages(64)
    queries = texts.queries(passages, 2 if args.short else 8)
    report: dict = {"machine": platform.processor() or platform.machine(), "short": args.short}
    if "exactness" in args.parts:
        found = exactness.measure(models, queries, passages, ("float32", "bfloat16", "int8"))
        report["exactness"] = [asdict(a) for a in found]
        print_exactness(found)
    if "speed" in args.parts:
        rounds, repeats = (1, 5) if args.short else (3, 10)
        timings, refusal = speed.measure(models, queries[0], passages, args.infinity, rounds, repeats)
        report["speed"] = {"timings": [{"system": t.system, "p50_ms": t.percentile(50), "p90_ms": t.percentile(90),
                                        "runs": len(t.seconds)} for t in timings], "infinity_on_pylate": refusal}
        print_speed(timings, refusal)
    if "long" in args.parts:
        runs = [long_inputs.measure(minilm_dir(), texts.long_document(4000), passages, 3 if args.short else 61,
                                    overlap) for overlap in args.overlaps or [None]]
        report["long_inputs"] = []
        for found in runs:
            cosines = {run.overlap: long_inputs.cosine(found.vector, run.vector) for run in runs}
            report["long_inputs"].append(
                {k: v for k, v in asdict(found).items() if k != "vector"}
                | {"ratio": found.ratio, "computed_ratio": found.computed_ratio, "best_of_ratio": found.best_of_ratio,
                   "cosine_to_other_overlaps": cosines})
            print_long(found, cosines)
    (args.work / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"\n(written to {args.work / 'report.json'})")


def print_exactness(found) -> None:
    print("\n| reference | served | vectors | min cosine | mean cosine | max score diff | vs rank.rerank "
          "| rankings kept | top-10 kept | top-1 kept | Kendall tau | median gap |\n"
          "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for a in found:
        rank = "-" if a.max_rank_rerank_difference is None else f"{a.max_rank_rerank_difference:.2g}"
        print(f"| {a.reference} | {a.served} | {a.vectors} | {a.min_cosine:.7f} | {a.mean_cosine:.7f} | "
              f"{a.max_score_difference:.2g} | {rank} | {a.rankings_kept:.0%} | {a.top10_kept:.0%} | "
              f"{a.top1_kept:.0%} | {a.kendall_tau:.3f} | {a.median_gap:.3f} |")


def print_speed(timings, refusal) -> None:
    ours = timings[0].percentile(50)
    print("\n| system | p50 ms | p90 ms | p50 / service ColBERT's |\n| --- | ---: | ---: | ---: |")
    for t in timings:
        print(f"| {t.system} | {t.percentile(50):.1f} | {t.percentile(90):.1f} | {t.percentile(50) / ours:.2f}x |")
    if refusal:
        print(f"\nInfinity on the PyLate checkpoint: {refusal}")


def print_long(found, cosines: dict[int, float]) -> None:
    print(f"\nlong input: {found.words} words, {found.tokens} tokens in {found.windows} windows overlapping by "
          f"{found.overlap}; cosine to the "
          f"windows' mean {found.cosine_to_windows:.7f}; {found.long_tokens_per_s:.0f} tokens/s "
          f"({found.computed_tokens_per_s:.0f} computed) against {found.short_tokens_per_s:.0f} for short passages, "
          f"each the best of {len(found.round_ratios)} rounds ({found.best_of_ratio:.2f}x); the rounds' median ratio "
          f"{found.ratio:.2f}x (quartiles {found.ratio_quartiles[0]:.2f}x-{found.ratio_quartiles[1]:.2f}x), "
          f"{found.computed_ratio:.2f}x counting the windows' tokens")
    others = [f"{overlap}: {cosine:.6f}" for overlap, cosine in cosines.items() if overlap != found.overlap]
    if others:
        print(f"  its vector's cosine to the document's vector read with other overlaps: {', '.join(others)}")


if __name__ == "__main__":
    main()
