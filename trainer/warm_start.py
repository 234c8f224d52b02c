"""`--init-from`: start pre-training from any BERT encoder directory, creating the heads it lacks.

A `BertModel` directory (a sentence-transformers model such as all-MiniLM-L6-v2 is one) has no MLM or
NSP head and maybe no pooler; a `BertForMaskedLM` one has no NSP head. The run starts from the
encoder's weights and its own tokenizer, with the missing parts initialised as a new model's are (MLM
decoder tied to the word embeddings, zero bias), and says which parts are new.

Everything is checked before the trainer prepares data or writes anything: a directory that is not a
BERT checkpoint fails here with one line naming the file (CheckpointError).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from model.bert import BertForPreTraining, BertModel
from model.checkpoint import CONFIG_FILE, Checkpoint, CheckpointError, load_checkpoint, read_metadata
from model.config import served_embedding_layer
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


def load_warm_start(directory: Path, dropout: float | None = None, head_layers: int = 0,
                    head_layers_start: str = "identity") -> WarmStart:
    """The starting point of an --init-from run (raises CheckpointError naming the file), with `head_layers`
    new layers stacked on its encoder for the heads (`stack_head_layers`)."""
    checkpoint = load_checkpoint(directory)
    if head_layers and checkpoint.config.embedding_layer is not None:
        raise CheckpointError(f"{directory / CONFIG_FILE}: --head-layers: this checkpoint already has layers above "
                              f"its embedding layer ({checkpoint.config.embedding_layer}); continue it without the flag")
    if head_layers_start == "copy" and head_layers > checkpoint.config.num_hidden_layers:
        raise CheckpointError(f"{directory / CONFIG_FILE}: --head-layers-start copy: this checkpoint has "
                              f"{checkpoint.config.num_hidden_layers} layers to copy, not {head_layers}")
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
    if head_layers:
        model = stack_head_layers(model, head_layers, head_layers_start)
        start = "copies of its top layers" if head_layers_start == "copy" else "near the identity"
        new_parts.append(f"{head_layers} layer(s) on top that only the heads read, {start} (the encoder below "
                         "stays frozen)")
        log.info("--init-from %s: %d new layer(s) on top for the heads, %s; the embeddings stay those of layer %d",
                 directory, head_layers, start, model.config.embedding_layer)
    _apply_dropout(model, config.hidden_dropout_prob, config.attention_probs_dropout_prob)
    return WarmStart(model.train(), checkpoint.tokenizer, new_parts, describe_source(directory, new_parts))


def stack_head_layers(model: BertForPreTraining, count: int, start: str = "identity") -> BertForPreTraining:
    """`model` with `count` new encoder layers on top: its own last layer becomes `config.embedding_layer`
    (what the embedding routes serve), and the heads read the new top.

    `start` "copy": the new layers are copies of the top `count` layers, in order (for `count` equal to the
    depth this is Gong et al. 2019's progressive stacking, where a trained L-layer BERT becomes a 2L-layer one
    whose upper half repeats the lower): they transform from the first step, so the heads see something new
    and relearn. `start` "identity": each new layer starts close to the identity, so the heads see at first
    what they saw before: both residual branches (attention and feed-forward outputs) start at zero, and
    each post-LN LayerNorm is set to undo its own normalisation for a typical input of the layer below
    (whose last LayerNorm, weight g and bias b, gives each token mean ~mean(b) and spread
    ~sqrt(mean(g^2) + var(b))). Queries, keys, values and the feed-forward input start random
    (N(0, 0.02)), as in a new model, so that the zero branches get gradients from the first step on.
    """
    below = model.config
    config = dataclasses.replace(below, num_hidden_layers=below.num_hidden_layers + count,
                                 embedding_layer=below.num_hidden_layers, extra=dict(below.extra))
    stacked = BertForPreTraining(config, with_pooler=model.bert.pooler is not None, with_mlm=model.has_mlm_head,
                                 with_nsp=model.has_nsp_head, num_labels=model.num_labels)
    missing, unexpected = stacked.load_state_dict(model.state_dict(), strict=False)
    new_names = tuple(f"bert.encoder.layer.{index}." for index in range(below.num_hidden_layers, config.num_hidden_layers))
    assert not unexpected and all(name.startswith(new_names) for name in missing), (missing, unexpected)
    stacked.tie_weights()
    new_layers = stacked.bert.encoder.layer[below.num_hidden_layers:]
    if start == "copy":
        for new, old in zip(new_layers, model.bert.encoder.layer[below.num_hidden_layers - count:]):
            new.load_state_dict(old.state_dict())
        return stacked.train(model.training)
    last_norm = model.bert.encoder.layer[-1].output.LayerNorm
    with torch.no_grad():
        spread = torch.sqrt(last_norm.weight.pow(2).mean() + last_norm.bias.var(unbiased=False))
        centre = last_norm.bias.mean()
        for layer in new_layers:
            for branch in (layer.attention.output.dense, layer.output.dense):
                branch.weight.zero_()
                branch.bias.zero_()
            for norm in (layer.attention.output.LayerNorm, layer.output.LayerNorm):
                norm.weight.fill_(spread)
                norm.bias.fill_(centre)
    return stacked.train(model.training)


def embedding_parameter(name: str, config) -> bool:
    """Is this parameter one of those that make the served embeddings (the word, position and type
    embeddings, which the MLM decoder shares, and the encoder layers up to `config.embedding_layer`)?
    `config` is ours or a `transformers` one (bench.training.peer's model), which has no embedding layer."""
    if name.startswith("bert.embeddings."):
        return True
    if not name.startswith("bert.encoder.layer."):
        return False
    return int(name.split(".")[3]) < served_embedding_layer(config)


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


__all__ = ["WarmStart", "describe_source", "embedding_parameter", "frozen_encoder", "load_warm_start",
           "stack_head_layers"]
