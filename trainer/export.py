"""Export a trained checkpoint as a compact serving checkpoint: half-precision weights, the tokenizer,
the training metadata, the curves, and a model card. Resume state and old checkpoints are left behind.

    python -m trainer.export runs/mini-wikitext2 checkpoints/mini-wikitext2 --dtype float16
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

from model.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

CARD = """# {name}

A BERT `{preset}` model ({layers} layers, hidden size {hidden}, {heads} heads, {params:,} parameters,
{vocab:,}-token WordPiece vocabulary) pre-trained from scratch by this project's trainer with masked-LM and
next-sentence prediction. It is the service's bundled default model: small enough to ship in the repository
({size_mb:.1f} MB in {dtype}), there so that `make serve` works with no download.

## How it was trained

- Data: {train} ({train_tokens:,} word pieces in {train_docs:,} articles); evaluated on {eval}
  ({eval_tokens:,} word pieces, different articles).
- Recipe: {steps:,} optimizer steps of {batch} sequences of up to {seq_len} tokens, peak learning rate {lr},
  {passes:.2f} passes over the text (sentence pairs re-drawn each pass) with dynamic masking, {device}, {minutes:.0f} minutes.
- Command: `{command}`
- Curves: `training_curves.png`; every logged step and evaluation: `metrics.jsonl`.

## Measured quality (held-out, masked positions only)

| metric | value |
| --- | --- |
| masked-token accuracy | {mlm_accuracy:.1%} |
| MLM perplexity | {mlm_perplexity:.1f} |
| MLM loss | {mlm_loss:.3f} |
| next-sentence accuracy | {nsp_accuracy:.1%} |

Measured on {pairs:,} held-out pairs with {masked:,} masked tokens (fixed pairs and masks).

## Limits

Trained on about 0.2M words of Wikipedia text for minutes on a laptop-class CPU: it knows frequent English
words and common syntax, not facts, and its next-sentence head is weak. Lower-cased; 512 positions but
trained on sequences of at most {seq_len} tokens. Use it to try the service, not for applications: serve a
larger checkpoint (`--checkpoint`) for real work.

## Attribution

Trained on WikiText-2 (Merity et al., 2016, "Pointer Sentinel Mixture Models"), text from Wikipedia,
licensed under the Creative Commons Attribution-ShareAlike 3.0 Unported License
(https://creativecommons.org/licenses/by-sa/3.0/). The model weights are a derivative of that text and are
shared under the same license.
"""


def export(source: Path, target: Path, dtype: torch.dtype) -> Path:
    checkpoint = load_checkpoint(source)
    metadata = dict(checkpoint.metadata)
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
    (target / "README.md").write_text(model_card(target, metadata, checkpoint))
    return target


def _logged_eval(path: Path, step: int | None) -> dict | None:
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return next((r["eval"] for r in rows if "eval" in r and r["step"] == step), None)


def model_card(target: Path, metadata: dict, checkpoint) -> str:
    config = checkpoint.config
    options = metadata.get("options", {})
    data = metadata.get("data", {})
    progress = metadata.get("progress", {})
    evaluation = metadata.get("eval") or {}
    return CARD.format(
        name=target.name, preset=options.get("preset", "?"), layers=config.num_hidden_layers, hidden=config.hidden_size,
        heads=config.num_attention_heads, params=checkpoint.model.num_parameters(), vocab=config.vocab_size,
        size_mb=(target / "model.safetensors").stat().st_size / 1e6, dtype=metadata["exported_dtype"],
        train=Path(data.get("train", "?")).name, train_tokens=data.get("train_tokens", 0),
        train_docs=data.get("train_documents", 0), eval=Path(str(data.get("eval", "?"))).name,
        eval_tokens=data.get("eval_tokens", 0), steps=progress.get("step", 0), batch=options.get("batch_size", "?"),
        seq_len=options.get("max_seq_len", "?"), lr=options.get("lr", "?"), epochs=progress.get("epoch", 0) + 1,
        device=metadata.get("device", "?"), minutes=progress.get("elapsed_s", 0) / 60,
        command=metadata.get("command", "?"), mlm_accuracy=evaluation.get("mlm_accuracy", float("nan")),
        mlm_perplexity=evaluation.get("mlm_perplexity", float("nan")), mlm_loss=evaluation.get("mlm_loss", float("nan")),
        nsp_accuracy=evaluation.get("nsp_accuracy", float("nan")), pairs=evaluation.get("pairs", 0),
        masked=evaluation.get("masked_tokens", 0),
    )


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
