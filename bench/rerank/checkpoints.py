"""The benchmark's models, all of all-MiniLM-L6-v2's shape (6 layers, 384 wide): a ColBERT built by PyLate, one built
by colbert-ai (both from all-MiniLM-L6-v2 with a fresh 128-wide projection: real ColBERT weights cannot be fetched
here, and the figures measure fidelity and speed, not retrieval quality), and a cross-encoder (all-MiniLM-L6-v2 with
a one-output classifier) for the peers' cross-encoder rerank."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from devkit import colbert_reference
from devkit.paths import minilm_dir


@dataclass(frozen=True)
class Models:
    pylate: Path
    colbert_ai: Path
    cross_encoder: Path


def build(work: Path) -> Models:
    """The three models under `work` (built once: a later run reuses them)."""
    work = work.resolve()  # the references run in a scratch folder of their own: a relative path would land there
    models = Models(work / "pylate-minilm", work / "colbert-ai-minilm", work / "cross-encoder-minilm")
    commands = []
    if not models.pylate.is_dir():
        commands.append({"command": "build_pylate", "base": str(minilm_dir()), "output": str(models.pylate),
                         "settings": {"seed": 0}})
    if not models.colbert_ai.is_dir():
        commands.append({"command": "build_colbert_ai", "base": str(minilm_dir()), "output": str(models.colbert_ai),
                         "settings": {"dim": 128, "seed": 0}})
    if commands:
        colbert_reference.run(commands)
    if not models.cross_encoder.is_dir():
        _cross_encoder(models.cross_encoder)
    return models


def _cross_encoder(directory: Path) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification.from_pretrained(minilm_dir(), num_labels=1).eval()
    model.save_pretrained(directory, safe_serialization=True)
    transformers.AutoTokenizer.from_pretrained(minilm_dir()).save_pretrained(directory)
