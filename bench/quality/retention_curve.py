"""The embedding-preservation trade-off: the same warm start from all-MiniLM-L6-v2, trained with several
--preserve-embeddings weights for the same number of steps, each measured on held-out text by the
trainer's evaluation: whole-word fill-mask and masked-token accuracy against how well the served sentence
embeddings keep all-MiniLM-L6-v2's (nearest-neighbour agreement and rank correlation on 400 held-out
sentences, mean cosine to the original vectors).

    python -m bench.quality.retention_curve --weights 0 0.5 2 10 --steps 500 --work runs/curve
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from devkit.paths import REPO_ROOT, WIKIPEDIA_DIR, WIKITEXT_TEST, minilm_dir
from trainer.options import VECTOR_SOURCES

CORPORA = ["enwiki-2015-core.txt.xz", "enwiki-2021-recent.txt.xz", "brown.txt.xz", "austen.txt.xz"]


def run(weight: float, output: Path, args) -> dict:
    corpora = [arg for name in CORPORA for arg in ("--corpus", str(WIKIPEDIA_DIR / name))]
    command = [sys.executable, "-m", "trainer", *corpora,
               "--eval-corpus", str(WIKITEXT_TEST), "--output", str(output), "--init-from", str(minilm_dir()),
               "--preserve-embeddings", str(weight), "--lr", str(args.lr), "--dropout", "0", "--mask-rate",
               str(args.mask_rate), "--batch-size", "32", "--max-steps", str(args.steps), "--warmup-fraction", "0.06",
               "--eval-every", str(args.steps), "--save-every", str(min(100, args.steps)), "--no-progress", "--resume",
               "--freeze-encoder-steps", str(args.freeze_encoder_steps), "--encoder-lr-scale", str(args.encoder_lr_scale),
               "--preserve-over", args.preserve_over]
    started = time.perf_counter()
    subprocess.run(command, cwd=REPO_ROOT, check=True)
    metadata = json.loads((output / "training_metadata.json").read_text())
    return {"weight": weight, "encoder_lr_scale": args.encoder_lr_scale, "preserve_over": args.preserve_over,
            "steps": metadata["progress"]["step"], "minutes": metadata["progress"]["elapsed_s"] / 60,
            "wall_minutes": (time.perf_counter() - started) / 60, **metadata["eval"], "command": " ".join(command[1:])}


def table(rows: list[dict]) -> str:
    lines = [("| weight | pooled | encoder LR | steps | train min | whole-word top-1 | masked-token acc. | NSP acc. | NN agreement | "
              "similarity rank corr. | mean cosine |"), "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['weight']:g} | {r.get('preserve_over', 'all')} | {r.get('encoder_lr_scale', 1.0):g}× | {r['steps']} | {r['minutes']:.1f} | {r['whole_word_accuracy']:.1%} | "
                     f"{r['mlm_accuracy']:.1%} | {r['nsp_accuracy']:.1%} | {r['embedding_nn_agreement']:.3f} | "
                     f"{r['embedding_similarity_spearman']:.3f} | {r['embedding_mean_cosine']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", type=float, nargs="+", default=[0, 0.5, 2, 10])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--mask-rate", type=float, default=0.2)
    parser.add_argument("--freeze-encoder-steps", type=int, default=0, help="as the trainer's flag")
    parser.add_argument("--encoder-lr-scale", type=float, default=1.0, help="as the trainer's flag")
    parser.add_argument("--preserve-over", choices=VECTOR_SOURCES, default="all", help="as the trainer's flag")
    parser.add_argument("--work", type=Path, default=REPO_ROOT / "runs" / "retention-curve")
    args = parser.parse_args()
    rows = []
    for weight in args.weights:
        suffix = "" if args.encoder_lr_scale == 1 else f"-encoder-lr-{args.encoder_lr_scale:g}"
        suffix += "" if args.preserve_over == "all" else f"-{args.preserve_over}"
        rows.append(run(weight, args.work / f"weight-{weight:g}{suffix}", args))
        (args.work / "curve.json").write_text(json.dumps(rows, indent=1))
        print(table(rows), flush=True)


if __name__ == "__main__":
    main()
