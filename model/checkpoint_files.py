"""The text files of a checkpoint directory, read without torch: config.json, the tokenizer's files, the pooling
recipe, a classifier's labels, a ColBERT's recipe and training_metadata.json. What a process that tokenizes and
formats needs (the HTTP front ends, up to one per core beside the engine); the weights are model/checkpoint.py's,
which builds on this.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from model.config import BertConfig, ConfigError
from model.files import read_json_object
from model.labels import LabelSpec
from model.late_interaction import LateInteraction, LateInteractionError, read_late_interaction
from model.pooling import PoolingConfigError, PoolingRecipe, read_pooling
from model.tokenizer import TokenizerError, WordPieceTokenizer

if TYPE_CHECKING:
    from model.bert import BertForPreTraining

CONFIG_FILE = "config.json"
METADATA_FILE = "training_metadata.json"


class CheckpointError(ValueError):
    """A checkpoint directory cannot be used; the message names the directory or file and the problem."""


@dataclass
class Checkpoint:
    directory: Path
    config: BertConfig
    model: BertForPreTraining | None  # None: loaded without weights (load_checkpoint_files)
    tokenizer: WordPieceTokenizer
    metadata: dict[str, Any] = field(default_factory=dict)
    pooling: PoolingRecipe = field(default_factory=lambda: PoolingRecipe("mean", False, "default"))
    labels: LabelSpec | None = None  # a sequence classifier's (cross-encoder's) labels and scoring rule
    late_interaction: LateInteraction | None = None  # a ColBERT's recipe (markers, lengths, skiplist, projection)


def load_config(directory: Path) -> BertConfig:
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{directory}: no {CONFIG_FILE} (files found: {listing(directory)})")
    values = read_json_object(path, CheckpointError, missing_ok=False)
    try:
        return BertConfig.from_dict(values)
    except (ConfigError, TypeError) as exc:
        raise CheckpointError(f"{path}: {exc}") from None


def load_checkpoint_files(directory: str | Path, num_labels: int = 0) -> Checkpoint:
    """A checkpoint without its weights (`model` is None): config, tokenizer, pooling, labels (for a
    classifier of `num_labels` outputs) and metadata. What a process that tokenizes and formats needs,
    at the cost of a few small files; the process that computes loads the whole checkpoint."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory")
    return with_labels(with_text_files(directory, load_config(directory), None, None), num_labels)


def with_labels(checkpoint: Checkpoint, num_labels: int) -> Checkpoint:
    """`checkpoint` read as a classifier of `num_labels` outputs (0: not a classifier); its config names them."""
    try:
        labels = LabelSpec.from_config(checkpoint.config, num_labels) if num_labels else None
    except ConfigError as exc:
        raise CheckpointError(f"{checkpoint.directory / CONFIG_FILE}: {exc}") from None
    return replace(checkpoint, labels=labels)


def with_text_files(directory: Path, config: BertConfig, model: BertForPreTraining | None,
                     labels: LabelSpec | None) -> Checkpoint:
    try:
        tokenizer = WordPieceTokenizer.load(directory, max_length_cap=config.max_position_embeddings)
    except TokenizerError as exc:
        raise CheckpointError(str(exc)) from None
    if tokenizer.vocab_size > config.vocab_size:
        raise CheckpointError(
            f"{directory}: the tokenizer has {tokenizer.vocab_size} tokens but {CONFIG_FILE} "
            f"says vocab_size {config.vocab_size}"
        )
    try:
        pooling = read_pooling(directory)
    except PoolingConfigError as exc:
        raise CheckpointError(str(exc)) from None
    late_interaction = late_interaction_recipe(directory)
    if late_interaction is not None:
        markers = [m for m in (late_interaction.query_prefix, late_interaction.document_prefix) if m]
        unknown = [m for m in markers if tokenizer.token_to_id(m) is None]
        if unknown:
            raise CheckpointError(f"{directory}: the ColBERT markers {unknown} are not tokens of its tokenizer")
    return Checkpoint(directory, config, model, tokenizer, read_metadata(directory), pooling, labels, late_interaction)


def late_interaction_recipe(directory: Path) -> LateInteraction | None:
    """The checkpoint's ColBERT recipe (model.late_interaction), or None when it is no ColBERT."""
    try:
        return read_late_interaction(directory)
    except LateInteractionError as exc:
        raise CheckpointError(str(exc)) from None


def read_metadata(directory: Path) -> dict[str, Any]:
    return read_json_object(directory / METADATA_FILE, CheckpointError)


def listing(directory: Path) -> str:
    try:
        names = sorted(p.name for p in directory.iterdir())
    except OSError:
        return "unreadable"
    return ", ".join(names[:20]) or "none"
