"""`--init-from`: start pre-training from any BERT encoder directory, creating the heads it lacks.

A `BertModel` directory (a sentence-transformers model such as all-MiniLM-L6-v2 is one) has no MLM or
NSP head and maybe no pooler; a `BertForMaskedLM` one has no NSP head. The run starts from the
encoder's weights and its own tokenizer, with the missing parts initialised as a new model's are (MLM
decoder tied to the word embeddings, zero bias), and says which parts are new.

Everything is checked before the trainer prepares data or writes anything: a directory that is not a
BERT checkpoint fails here with one line naming the file (CheckpointError).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from model.bert import BertForPreTraining, BertModel
from model.checkpoint import CONFIG_FILE, Checkpoint, CheckpointError, load_checkpoint, read_metadata
from model.files import read_json_object
from model.tokenizer import WordPieceTokenizer

log = logging.getLogger("trainer")
_LICENSE_LINE = re.compile(r"^license:\s*(\S+)\s*$", re.MULTILINE)
_TITLE_LINE = re.compile(r"^# (.+)$", re.MULTILINE)


@dataclass
class WarmStart:
    model: BertForPreTraining  # every head present, the encoder's weights loaded
    tokenizer: WordPieceTokenizer
    new_parts: list[str]  # what was created fresh, for the log and the model card
    source: dict  # what the run started from (name, architecture, licence, earlier training if ours)


def load_warm_start(directory: Path, dropout: float | None = None) -> WarmStart:
    """The starting point of an --init-from run (raises CheckpointError naming the file)."""
    checkpoint = load_checkpoint(directory)
    _check_vocabulary(checkpoint)
    loaded = checkpoint.model
    config = checkpoint.config
    if dropout is not None:
        config.hidden_dropout_prob = config.attention_probs_dropout_prob = dropout
    new_parts = []
    if loaded.bert.pooler is None:
        new_parts.append("pooler")
    if not loaded.has_mlm_head:
        new_parts.append("masked-LM head (decoder tied to the word embeddings)")
    if not loaded.has_nsp_head:
        new_parts.append("next-sentence head")
    if new_parts:
        model = BertForPreTraining(config)  # fresh heads, initialised as a new model's (seeded by the caller)
        missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
        assert not unexpected and all(name.startswith(("cls.", "bert.pooler.")) for name in missing), (missing, unexpected)
        model.tie_weights()
        log.info("--init-from %s: new %s; %s from the checkpoint", directory, ", ".join(new_parts),
                 "the encoder comes" if "pooler" in new_parts else "the encoder and pooler come")
    else:
        model = loaded
        log.info("--init-from %s: every head comes from the checkpoint", directory)
    _apply_dropout(model, config.hidden_dropout_prob, config.attention_probs_dropout_prob)
    return WarmStart(model.train(), checkpoint.tokenizer, new_parts, describe_source(directory, new_parts))


def frozen_encoder(directory: Path, device: torch.device) -> BertModel:
    """The starting checkpoint's encoder, frozen: the reference that --preserve-embeddings pulls towards."""
    encoder = load_checkpoint(directory).model.bert.to(device).eval()
    for param in encoder.parameters():
        param.requires_grad_(False)
    return encoder


def describe_source(directory: Path, new_parts: list[str]) -> dict:
    """Name, architecture and licence of the starting checkpoint, and its own training if we made it."""
    raw = read_json_object(directory / CONFIG_FILE, CheckpointError, missing_ok=False)
    card = directory / "README.md"
    licence = title = None
    if card.is_file():
        text = card.read_text(encoding="utf-8", errors="replace")
        found = _LICENSE_LINE.search(text[:4000])
        licence = found.group(1) if found else None
        heading = _TITLE_LINE.search(text)
        title = heading.group(1).strip() if heading else None
    earlier = read_metadata(directory)
    return {
        "directory": directory.name,
        # The model card's title names the model (a config's _name_or_path names what it was trained from).
        "name": title or directory.name,
        "config_name_or_path": raw.get("_name_or_path"),
        "architectures": raw.get("architectures"),
        "licence": licence,
        "new_parts": new_parts,
        "trained_by_us": {key: earlier.get(key) for key in ("command", "options", "progress", "device", "eval",
                                                            "started_from")} if earlier else None,
    }


def _check_vocabulary(checkpoint: Checkpoint) -> None:
    rows = checkpoint.model.bert.embeddings.word_embeddings.weight.shape[0]
    tokenizer = checkpoint.tokenizer
    if tokenizer.vocab_size > rows:
        raise CheckpointError(f"{checkpoint.directory / 'vocab.txt'}: {tokenizer.vocab_size} tokens, but the word "
                              f"embedding matrix has {rows} rows")


def _apply_dropout(model: BertForPreTraining, hidden: float, attention: float) -> None:
    from model.dropout import Dropout

    for module in model.modules():
        if isinstance(module, Dropout):
            module.p = hidden
        if hasattr(module, "dropout_prob"):
            module.dropout_prob = attention


__all__ = ["WarmStart", "describe_source", "frozen_encoder", "load_warm_start"]
