"""Checkpoint directories that Hugging Face tools open as-is, written atomically, read from safetensors only.

A checkpoint directory holds:
  config.json               BertConfig fields + "architectures"/"model_type" (transformers reads it)
  model.safetensors         weights, Hugging Face parameter names, tied tensors stored once
  vocab.txt, tokenizer.json, tokenizer_config.json, special_tokens_map.json
  training_metadata.json    ours: provenance and eval metrics (optional)
Other files (the trainer's resume state) may sit beside them.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from model.bert import BertForPreTraining
from model.checkpoint_files import (  # noqa: F401  (the text files' names, re-exported for the weights' readers)
    CONFIG_FILE,
    METADATA_FILE,
    Checkpoint,
    CheckpointError,
    late_interaction_recipe,
    load_checkpoint_files,
    load_config,
    read_metadata,
    listing,
    with_labels,
    with_text_files,
)
from model.config import BertConfig, ConfigError
from model.files import fsync_directory
from model.labels import LabelSpec
from model.projection import load_projection
from model.tokenizer import WordPieceTokenizer

WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
PICKLE_WEIGHT_FILES = ("pytorch_model.bin", "tf_model.h5", "model.ckpt.index", "flax_model.msgpack")

# Tensors stored twice in memory but once on disk (they are tied), as transformers does.
TIED_KEYS = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
# Old buffers some checkpoints still carry; they are derived, not learned.
IGNORED_KEYS = ("bert.embeddings.position_ids",)
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# ---- names ---------------------------------------------------------------------------------------


def canonical_name(name: str) -> str:
    """Map a tensor name from any BERT checkpoint layout onto ours.

    The single rename table: a bare `BertModel` stores names without the `bert.` prefix, and
    checkpoints converted from the original TensorFlow release call LayerNorm's parameters
    gamma/beta.
    """
    if name.startswith(("embeddings.", "encoder.", "pooler.")):
        name = "bert." + name
    if name.endswith(".gamma"):
        name = name[: -len(".gamma")] + ".weight"
    elif name.endswith(".beta"):
        name = name[: -len(".beta")] + ".bias"
    return name


# ---- saving --------------------------------------------------------------------------------------


def save_checkpoint(
    directory: str | Path,
    model: BertForPreTraining,
    tokenizer: WordPieceTokenizer,
    metadata: dict[str, Any] | None = None,
    dtype: torch.dtype | None = None,
    write_extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write a checkpoint directory atomically: everything goes to a hidden temporary directory
    beside the target, is flushed to disk, and only then renamed to `directory`. A crash at any
    point leaves either the previous complete checkpoint or none under that name, never half of one.

    `write_extra(tmp_dir)` may add files (the trainer's resume state) before the rename.
    """
    final = Path(directory)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        model.config.save(tmp / CONFIG_FILE, architecture="BertForTokenClassification" if model.num_token_labels else
                          "BertForQuestionAnswering" if model.qa_outputs is not None else "BertForPreTraining")
        save_file(_weights_to_save(model, dtype), str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        # transformers truncates to this: it must not exceed the model's position table
        tokenizer.save(tmp, model_max_length=min(tokenizer.model_max_length, model.config.max_position_embeddings))
        if metadata is not None:
            (tmp / METADATA_FILE).write_text(json.dumps(metadata, indent=2, default=str) + "\n")
        if write_extra is not None:
            write_extra(tmp)
        _fsync_tree(tmp)
        _replace_directory(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _weights_to_save(model: BertForPreTraining, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in model.state_dict().items():
        if name in TIED_KEYS:
            continue
        tensor = tensor.detach()
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        out[name] = tensor.contiguous().cpu()
    return out


def _fsync_tree(directory: Path) -> None:
    for path in directory.iterdir():
        if path.is_file():
            path.chmod(0o644)  # readable by the unprivileged user a container serves as
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    fsync_directory(directory)


def _replace_directory(tmp: Path, final: Path) -> None:
    if not final.exists():
        os.rename(tmp, final)
    else:
        # rename(2) cannot replace a non-empty directory; move the old one aside first. If we die
        # between the two renames the old checkpoint survives under the `.old-` name.
        old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    fsync_directory(final.parent)


# ---- loading -------------------------------------------------------------------------------------


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """All tensors of the checkpoint under canonical names, from safetensors only."""
    index = directory / WEIGHTS_INDEX_FILE
    if (directory / WEIGHTS_FILE).is_file():
        files = [directory / WEIGHTS_FILE]
    elif index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            files = sorted({directory / str(name) for name in weight_map.values()})
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{index}: not a valid safetensors index ({exc})") from None
    else:
        pickled = [name for name in PICKLE_WEIGHT_FILES if (directory / name).exists()]
        hint = (
            f"; found {pickled}, which this server never loads (pickle can run code): "
            "convert it with transformers' save_pretrained(safe_serialization=True)"
            if pickled
            else ""
        )
        raise CheckpointError(f"{directory}: no {WEIGHTS_FILE}{hint} (files found: {listing(directory)})")

    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        if not path.is_file():
            raise CheckpointError(f"{path}: listed in {WEIGHTS_INDEX_FILE} but missing")
        try:
            with safe_open(str(path), framework="pt") as handle:
                for name in handle.keys():
                    tensors[canonical_name(name)] = handle.get_tensor(name)
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"{path}: truncated or not a safetensors file ({exc})") from None
    return tensors


def load_checkpoint(
    directory: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
) -> Checkpoint:
    """Open a checkpoint written by us or by `transformers` for BertForPreTraining, BertForMaskedLM,
    BertModel, BertForSequenceClassification, BertForTokenClassification or BertForQuestionAnswering, or a ColBERT in
    PyLate's or colbert-ai's format (model.late_interaction; the model then carries its projection). Heads the
    checkpoint does not have are left out of the model, not invented."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory")
    config = load_config(directory)
    tensors = read_weights(directory)
    for name in IGNORED_KEYS:
        tensors.pop(name, None)
    # The decoder is tied to the word embeddings; an old checkpoint may store its bias only there.
    if "cls.predictions.decoder.bias" in tensors:
        tensors.setdefault("cls.predictions.bias", tensors["cls.predictions.decoder.bias"])
    for name in TIED_KEYS:
        tensors.pop(name, None)
    late_interaction = late_interaction_recipe(directory)
    # A ColBERT's projection (colbert-ai keeps it among these tensors) is the model's, not the BERT's.
    projection = load_projection(directory, late_interaction, config.hidden_size, tensors) if late_interaction else None

    weights_path = directory / WEIGHTS_FILE
    num_labels = tensors["classifier.weight"].shape[0] if "classifier.weight" in tensors else 0
    per_token = bool(num_labels) and classifies_tokens(config, tensors)
    if num_labels and not per_token and "bert.pooler.dense.weight" not in tensors:
        raise CheckpointError(f"{weights_path}: a classifier head but no pooler (bert.pooler.dense.*)")
    try:
        labels = LabelSpec.from_config(config, num_labels) if num_labels else None
    except ConfigError as exc:
        raise CheckpointError(f"{directory / CONFIG_FILE}: {exc}") from None
    # Built on the meta device: random initialisation would be overwritten anyway (2 s for base).
    with torch.device("meta"):
        model = BertForPreTraining(
            config,
            with_pooler="bert.pooler.dense.weight" in tensors,
            with_mlm=any(name.startswith("cls.predictions.") for name in tensors),
            with_nsp="cls.seq_relationship.weight" in tensors and "bert.pooler.dense.weight" in tensors,
            num_labels=num_labels,
            per_token=per_token,
            with_qa="qa_outputs.weight" in tensors,
        )
    expected = {name: p for name, p in model.state_dict().items() if name not in TIED_KEYS}
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing:
        raise CheckpointError(f"{weights_path}: missing tensors {_short(missing)}")
    if unexpected:
        raise CheckpointError(f"{weights_path}: tensors this BERT does not have {_short(unexpected)}")
    for name, param in expected.items():
        tensor = tensors[name]
        if tuple(tensor.shape) != tuple(param.shape):
            raise CheckpointError(
                f"{weights_path}: tensor {name} has shape {list(tensor.shape)} but {CONFIG_FILE} "
                f"implies {list(param.shape)}"
            )
        if tensor.dtype not in FLOAT_DTYPES:
            raise CheckpointError(f"{weights_path}: tensor {name} has dtype {tensor.dtype}; expected a float type")
        if not torch.isfinite(tensor).all():
            raise CheckpointError(f"{weights_path}: tensor {name} holds NaN or infinite values")
    model.load_state_dict({n: t.float() for n, t in tensors.items()}, strict=False, assign=True)
    model.tie_weights()
    model.projection = projection
    model.to(device=device, dtype=dtype or torch.float32)
    model.eval()
    return with_text_files(directory, config, model, labels)


def classifies_tokens(config: BertConfig, tensors: dict[str, torch.Tensor]) -> bool:
    """Whether the checkpoint's `classifier` reads every token (`BertForTokenClassification`, which transformers
    writes without a pooler) rather than the pooled [CLS] vector: its config's `architectures` says so, or,
    without one, the missing pooler does."""
    architectures = config.extra.get("architectures") or []
    if "BertForTokenClassification" in architectures:
        return True
    return "BertForSequenceClassification" not in architectures and "bert.pooler.dense.weight" not in tensors


def _short(names: list[str], limit: int = 6) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return str(names[:limit]) + more
