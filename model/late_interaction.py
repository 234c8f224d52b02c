"""A ColBERT checkpoint's recipe, read from its text files (no torch): how queries and documents become tokens,
which tokens give vectors, and the projection that shrinks each token's hidden state to the vector it scores with.

Two formats carry it:
- PyLate's: a sentence-transformers directory whose `modules.json` lists the Transformer, then one or more Dense
  modules (`1_Dense/config.json`: in_features, out_features, bias, activation), and whose
  `config_sentence_transformers.json` holds `query_prefix`, `document_prefix`, `query_length`,
  `document_length`, `do_query_expansion`, `attend_to_expansion_tokens` and `skiplist_words`
  (pylate/models/colbert.py: `ColBERT.save`, `_load_sbert_model`, and the defaults of `ColBERT.__init__`).
- Stanford colbert-ai's: a BERT whose `config.json` names the architecture `HF_ColBERT`, with a bias-free `linear`
  projection stored beside the encoder's weights and the settings in `artifact.metadata` (`query_token_id`,
  `doc_token_id`, `query_maxlen`, `doc_maxlen`, `dim`, `mask_punctuation`, `attend_to_mask_tokens`; colbert-ai's
  defaults, colbert/infra/config/settings.py, where the file or a field is missing).

What the encoder does with the recipe, in both formats: a query is `[CLS] [Q] pieces [SEP]`, cut to `query_length`
tokens and filled up to it with [MASK] (query expansion); the [MASK]s read the query but are not read by it unless
`attend_to_expansion_tokens`; every query token gives a vector. A document is `[CLS] [D] pieces [SEP]`, cut to
`document_length`, and its tokens in the skiplist (punctuation) give none. Each vector is the projection of the
token's last hidden state, L2-normalised.
"""

from __future__ import annotations

import json
import string
import struct
from dataclasses import dataclass
from pathlib import Path

from model.files import read_json_object

SENTENCE_TRANSFORMERS_CONFIG = "config_sentence_transformers.json"
COLBERT_AI_METADATA = "artifact.metadata"
COLBERT_AI_ARCHITECTURE = "HF_ColBERT"
COLBERT_AI_PROJECTION = "linear.weight"  # stored beside the encoder's tensors in the checkpoint's weights
IDENTITY_ACTIVATIONS = ("torch.nn.modules.linear.Identity", "Identity")
# PyLate's keys in config_sentence_transformers.json; one of them (or model_type ColBERT) marks a PyLate model.
PYLATE_KEYS = ("query_prefix", "document_prefix", "query_length", "document_length", "do_query_expansion",
               "attend_to_expansion_tokens", "skiplist_words")


# Each recipe field under each library's own name, with that library's default where its file has no value
# (pylate/models/colbert.py, ColBERT.__init__; colbert/infra/config/settings.py): the one table of renamings.
PYLATE_NAMES = {"query_prefix": ("query_prefix", str, "[Q] "), "document_prefix": ("document_prefix", str, "[D] "),
                "query_length": ("query_length", int, 32), "document_length": ("document_length", int, 180),
                "do_query_expansion": ("do_query_expansion", bool, True),
                "attend_to_expansion_tokens": ("attend_to_expansion_tokens", bool, False)}
COLBERT_AI_NAMES = {"query_prefix": ("query_token_id", str, "[unused0]"),
                    "document_prefix": ("doc_token_id", str, "[unused1]"),
                    "query_length": ("query_maxlen", int, 32), "document_length": ("doc_maxlen", int, 220),
                    "attend_to_expansion_tokens": ("attend_to_mask_tokens", bool, False)}


class LateInteractionError(ValueError):
    """The checkpoint's ColBERT files are unreadable or ask for something this server does not do."""


@dataclass(frozen=True)
class Projection:
    """One linear layer of the projection, in order: where its weights are and its shape."""

    weights: str  # a directory relative to the checkpoint's (PyLate's `1_Dense`), or "" for the checkpoint's own
    in_features: int
    out_features: int
    bias: bool


@dataclass(frozen=True)
class LateInteraction:
    format: str  # "pylate" or "colbert-ai"
    query_prefix: str  # the marker token's text, put after [CLS] ("" for none)
    document_prefix: str
    query_length: int  # tokens of every query, markers and [MASK] expansion included
    document_length: int  # most tokens of a document, markers included
    do_query_expansion: bool  # fill queries up to query_length with [MASK]
    attend_to_expansion_tokens: bool  # whether the query's tokens read its [MASK]s
    skiplist_words: tuple[str, ...]  # tokens whose document vectors are left out
    projections: tuple[Projection, ...]

    @property
    def dim(self) -> int:
        """The width of every token vector."""
        return self.projections[-1].out_features

    def describe(self) -> dict:
        """What /info says of it."""
        return {"format": self.format, "dim": self.dim, "query_length": self.query_length,
                "document_length": self.document_length, "query_prefix": self.query_prefix,
                "document_prefix": self.document_prefix, "query_expansion": self.do_query_expansion,
                "attend_to_expansion_tokens": self.attend_to_expansion_tokens,
                "skiplist_size": len(self.skiplist_words), "similarity": "MaxSim"}


def read_late_interaction(directory: Path) -> LateInteraction | None:
    """The checkpoint's ColBERT recipe, or None when it is not a ColBERT."""
    config = read_json_object(directory / "config.json", LateInteractionError)
    if COLBERT_AI_ARCHITECTURE in (config.get("architectures") or []):
        return _colbert_ai(directory)
    return _pylate(directory)


def _pylate(directory: Path) -> LateInteraction | None:
    modules_file = directory / "modules.json"
    if not modules_file.is_file():
        return None
    try:
        modules = json.loads(modules_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise LateInteractionError(f"{modules_file}: not valid JSON ({exc})") from None
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        return None  # the pooling reader (model.pooling) names this problem
    settings = read_json_object(directory / SENTENCE_TRANSFORMERS_CONFIG, LateInteractionError)
    dense = [m for m in modules if str(m.get("type", "")).rsplit(".", 1)[-1] == "Dense"]
    if not dense or not (settings.get("model_type") == "ColBERT" or any(k in settings for k in PYLATE_KEYS)):
        return None
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if kinds[0] != "Transformer" or any(kind != "Dense" for kind in kinds[1:]):
        raise LateInteractionError(f"{modules_file}: a ColBERT here is a Transformer followed by Dense modules; "
                                   f"this one has {kinds}")
    if str(dense[0].get("path", "")) in ("", "."):
        raise LateInteractionError(f"{modules_file}: a Dense module needs a directory of its own")
    projections = tuple(_dense(directory, str(m.get("path", ""))) for m in dense)
    for before, after in zip(projections, projections[1:]):
        if before.out_features != after.in_features:
            raise LateInteractionError(f"{directory / after.weights}: reads {after.in_features}-wide vectors but "
                                       f"{before.weights} gives {before.out_features}")
    values = _settings(settings, PYLATE_NAMES, directory)
    values["attend_to_expansion_tokens"] &= values["do_query_expansion"]  # as PyLate: no expansion, nothing to attend
    return LateInteraction(format="pylate", skiplist_words=tuple(_words(settings, "skiplist_words", directory)),
                           projections=projections, **values)


def _dense(directory: Path, path: str) -> Projection:
    config_file = directory / path / "config.json"
    config = read_json_object(config_file, LateInteractionError, missing_ok=False)
    activation = config.get("activation_function", IDENTITY_ACTIVATIONS[0])
    if activation not in IDENTITY_ACTIVATIONS:
        raise LateInteractionError(f"{config_file}: activation_function {activation!r} is not supported; a ColBERT "
                                   "projection here is linear (Identity)")
    if config.get("use_residual"):
        raise LateInteractionError(f"{config_file}: use_residual is not supported")
    widths = [config.get(k) for k in ("in_features", "out_features")]
    if not all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in widths):
        raise LateInteractionError(f"{config_file}: in_features and out_features must be positive integers")
    return Projection(path, widths[0], widths[1], bool(config.get("bias", True)))


def _colbert_ai(directory: Path) -> LateInteraction:
    metadata = read_json_object(directory / COLBERT_AI_METADATA, LateInteractionError)
    metadata = metadata.get("config", metadata) if isinstance(metadata.get("config"), dict) else metadata
    shape = _stored_shape(directory, COLBERT_AI_PROJECTION)
    if shape is None or len(shape) != 2:
        raise LateInteractionError(f"{directory}: config.json names {COLBERT_AI_ARCHITECTURE} but its weights have no "
                                   f"2-D {COLBERT_AI_PROJECTION} (the projection)")
    dim = _field(metadata, "dim", int, shape[0], directory)
    if dim != shape[0]:
        raise LateInteractionError(f"{directory / COLBERT_AI_METADATA}: dim {dim} but {COLBERT_AI_PROJECTION} gives "
                                   f"{shape[0]}-wide vectors")
    punctuation = _field(metadata, "mask_punctuation", bool, True, directory)
    return LateInteraction(format="colbert-ai", do_query_expansion=True,
                           skiplist_words=tuple(string.punctuation) if punctuation else (),
                           projections=(Projection("", shape[1], shape[0], False),),
                           **_settings(metadata, COLBERT_AI_NAMES, directory))


def _stored_shape(directory: Path, name: str) -> list[int] | None:
    """A tensor's shape from a safetensors file's JSON header, without reading the tensor (nor importing torch)."""
    path = directory / "model.safetensors"
    if not path.is_file():
        index = read_json_object(directory / "model.safetensors.index.json", LateInteractionError)
        shard = (index.get("weight_map") or {}).get(name)
        if not isinstance(shard, str):
            return None
        path = directory / shard
    try:
        with open(path, "rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(min(size, 100_000_000)))
    except (OSError, struct.error, ValueError) as exc:
        raise LateInteractionError(f"{path}: not a safetensors file ({exc})") from None
    entry = header.get(name) if isinstance(header, dict) else None
    return entry.get("shape") if isinstance(entry, dict) else None


def _field(values: dict, key: str, kind: type, default, directory: Path):
    value = values.get(key, default)
    if value is None:
        return default
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise LateInteractionError(f"{directory}: {key} must be a {kind.__name__}, got {value!r}")
    return value


def _settings(values: dict, names: dict, directory: Path) -> dict:
    """The recipe's fields read from a library's `values` under its `names`."""
    found = {field: _field(values, key, kind, default, directory) for field, (key, kind, default) in names.items()}
    for field in ("query_length", "document_length"):
        if found[field] < 4:  # [CLS], the marker, one piece, [SEP]
            raise LateInteractionError(f"{directory}: {names[field][0]} must be at least 4 tokens, got {found[field]}")
    return found


def _words(values: dict, key: str, directory: Path) -> list[str]:
    words = values.get(key)
    if words is None:
        return list(string.punctuation)  # PyLate's default skiplist
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise LateInteractionError(f"{directory}: {key} must be a list of strings")
    return words
