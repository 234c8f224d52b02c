"""Export a trained checkpoint as a compact serving checkpoint: half-precision weights, the tokenizer,
the training metadata, the curves, and a model card (trainer/model_card.py). Resume state and old checkpoints are
left behind.

    python -m trainer.export runs/minilm-wikipedia checkpoints/minilm-wikipedia --dtype float16
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

from model.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from model.provenance import portable
from trainer.model_card import model_card


def export(source: Path, target: Path, dtype: torch.dtype) -> Path:
    checkpoint = load_checkpoint(source)
    metadata = portable(dict(checkpoint.metadata))  # a run recorded before model.provenance named its machine's paths
    metadata["exported_from"] = source.name
    metadata["exported_dtype"] = str(dtype).removeprefix("torch.")
    # A resumable checkpoint inside a run (RUN/checkpoints/step-N) keeps its run files two levels up.
    run_dir = source if (source / "metrics.jsonl").is_file() else source.parent.parent
    if not metadata.get("eval"):
        metadata["eval"] = _logged_eval(run_dir / "metrics.jsonl", metadata.get("progress", {}).get("step"))

    def write_extras(directory: Path) -> None:
        for name in ("metrics.jsonl", "training_curves.png"):
            if (run_dir / name).is_file():
                shutil.copy2(run_dir / name, directory / name)

    save_checkpoint(target, checkpoint.model, checkpoint.tokenizer, metadata=metadata, dtype=dtype,
                    write_extra=write_extras)
    # The card's answers come from the exported (half-precision) weights, which are what the service serves.
    (target / "README.md").write_text(model_card(target, metadata, load_checkpoint(target)))
    return target


def _logged_eval(path: Path, step: int | None) -> dict | None:
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return next((r["eval"] for r in rows if "eval" in r and r["step"] == step), None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], default="float16")
    args = parser.parse_args(argv)
    try:
        export(args.source, args.target, getattr(torch, args.dtype))
    except (CheckpointError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(json.loads((args.target / "training_metadata.json").read_text()).get("eval"), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
