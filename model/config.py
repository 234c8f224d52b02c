"""BERT configuration with the Hugging Face `BertConfig` field names, validated on construction."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUPPORTED_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish")

# Keys that `transformers` writes into every config.json but that do not change the network.
# They are accepted and dropped; any other unknown key is an error, because silently ignoring a
# field we do not implement (say `is_decoder: true`) would serve a different model than asked for.
HF_BOOKKEEPING_KEYS = frozenset(
    {
        "_name_or_path", "architectures", "model_type", "transformers_version", "torch_dtype",
        "dtype", "use_cache", "classifier_dropout", "gradient_checkpointing", "id2label",
        "label2id", "problem_type", "output_attentions", "output_hidden_states", "return_dict",
        "torchscript", "use_return_dict", "chunk_size_feed_forward", "tie_word_embeddings",
        "bos_token_id", "eos_token_id", "sep_token_id", "cls_token_id", "mask_token_id",
        "tokenizer_class", "prefix", "task_specific_params", "finetuning_task", "pruned_heads",
        "add_cross_attention", "is_decoder", "is_encoder_decoder", "cross_attention_hidden_size",
        "directionality", "pooler_fc_size", "pooler_num_attention_heads", "pooler_num_fc_layers",
        "pooler_size_per_head", "pooler_type", "position_embedding_type", "layer_norm_type",
        "num_labels", "_attn_implementation_autoset", "tie_encoder_decoder", "output_past",
    }
)
# Bookkeeping keys whose value must still be the plain-BERT one for this implementation to be exact.
REQUIRED_VALUES = {
    "is_decoder": False,
    "add_cross_attention": False,
    "is_encoder_decoder": False,
    "position_embedding_type": "absolute",
    "tie_word_embeddings": True,
}


def served_embedding_layer(config) -> int:
    """How many layers make the served embeddings: `embedding_layer`, or all of them. `config` is ours or a
    `transformers` BertConfig (which keeps `embedding_layer` as a plain attribute when config.json has one)."""
    layer = getattr(config, "embedding_layer", None)
    return layer if layer is not None else config.num_hidden_layers


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field."""


@dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    # The layer whose output the embedding routes serve (`hidden_states[embedding_layer]` in transformers); None
    # = the last. Set when the heads read layers stacked on a sentence-embedding encoder (trainer --head-layers),
    # so that the encoder's embeddings stay as they were. Ours: transformers keeps it as a plain attribute.
    embedding_layer: int | None = None
    # Not part of the network; carried so that config.json round-trips what `transformers` wrote.
    extra: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        positive = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "intermediate_size", "max_position_embeddings", "type_vocab_size")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads}); use hidden_size = 64 x heads as the presets do"
            )
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            raise ConfigError(
                f"hidden_act {self.hidden_act!r} is not supported; choose one of {SUPPORTED_ACTIVATIONS}"
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {value!r}")
        if not isinstance(self.layer_norm_eps, (int, float)) or self.layer_norm_eps <= 0:
            raise ConfigError(f"layer_norm_eps must be > 0, got {self.layer_norm_eps!r}")
        if not isinstance(self.pad_token_id, int) or not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError(
                f"pad_token_id ({self.pad_token_id!r}) must be a token id below vocab_size ({self.vocab_size})"
            )
        if self.embedding_layer is not None and (isinstance(self.embedding_layer, bool) or not isinstance(
                self.embedding_layer, int) or not 1 <= self.embedding_layer <= self.num_hidden_layers):
            raise ConfigError(f"embedding_layer must be a layer number from 1 to num_hidden_layers "
                              f"({self.num_hidden_layers}), got {self.embedding_layer!r}")

    @property
    def served_embedding_layer(self) -> int:
        return served_embedding_layer(self)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    # ---- presets -------------------------------------------------------------------------------

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "BertConfig":
        """A named size from Turc et al. 2019: heads = hidden/64, FFN = 4 x hidden."""
        if name not in PRESETS:
            raise ConfigError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        layers, hidden = PRESETS[name]
        values: dict[str, Any] = dict(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=hidden // 64,
            intermediate_size=4 * hidden,
        )
        values.update(overrides)
        return cls(**values)

    # ---- JSON ----------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        if values["embedding_layer"] is None:  # a plain BERT's config.json stays as transformers writes it
            del values["embedding_layer"]
        out: dict[str, Any] = dict(self.extra)
        out.update(values)
        out["architectures"] = out.get("architectures") or ["BertForPreTraining"]
        out["model_type"] = "bert"
        out.setdefault("position_embedding_type", "absolute")
        return dict(sorted(out.items()))

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "BertConfig":
        if not isinstance(values, dict):
            raise ConfigError(f"config must be a JSON object, got {type(values).__name__}")
        if values.get("model_type", "bert") != "bert":
            raise ConfigError(f"model_type is {values['model_type']!r}; only 'bert' is supported")
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        unknown = sorted(set(values) - known - HF_BOOKKEEPING_KEYS)
        if unknown:
            raise ConfigError(f"unknown field(s) {unknown}; this BERT implementation does not know them")
        for key, required in REQUIRED_VALUES.items():
            if key in values and values[key] != required:
                raise ConfigError(f"{key} is {values[key]!r}; only {required!r} is supported")
        kwargs = {k: v for k, v in values.items() if k in known}
        extra = {k: v for k, v in values.items() if k not in known}
        return cls(**kwargs, extra=extra)

    def save(self, path: Path, architecture: str = "BertForPreTraining") -> None:
        """Write config.json for a checkpoint we saved: it always holds the pre-training heads (a warm start
        from a headless `BertModel` gains them), so that is the architecture it names unless a task head
        (token classification, question answering) says which one transformers should open; the source's
        `_name_or_path` named a different model and is dropped."""
        values = self.to_dict()
        values["architectures"] = [architecture]
        values.pop("_name_or_path", None)
        Path(path).write_text(json.dumps(values, indent=2) + "\n")


# name -> (layers, hidden)
PRESETS: dict[str, tuple[int, int]] = {
    "tiny": (2, 128),
    "mini": (4, 256),
    "small": (4, 512),
    "medium": (8, 512),
    "base": (12, 768),
}
