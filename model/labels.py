"""What a sequence-classification checkpoint's outputs mean: its labels and how logits become scores.

Read from `config.json` as `transformers` writes it for `BertForSequenceClassification`: `id2label`
(label names by output index), `problem_type`, and the number of outputs. Scores follow the rule of
transformers' text-classification pipeline: sigmoid for multi-label problems and for a single output
(a cross-encoder's relevance logit), softmax over the outputs otherwise, nothing for regression.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from model.config import BertConfig, ConfigError

Activation = Literal["softmax", "sigmoid", "none"]
PROBLEM_TYPES = ("single_label_classification", "multi_label_classification", "regression")


@dataclass(frozen=True)
class LabelSpec:
    labels: tuple[str, ...]  # by output index
    problem_type: str | None
    activation: Activation

    @classmethod
    def from_config(cls, config: BertConfig, num_labels: int) -> LabelSpec:
        raw = config.extra.get("id2label") or {}
        try:
            names = {int(key): str(value) for key, value in raw.items()}
        except (AttributeError, TypeError, ValueError):
            raise ConfigError(f"id2label must map output indices to names, got {raw!r}") from None
        if names and sorted(names) != list(range(num_labels)):
            raise ConfigError(f"id2label names outputs {sorted(names)}, but the classifier has {num_labels} outputs")
        labels = tuple(names.get(index, f"LABEL_{index}") for index in range(num_labels))
        problem = config.extra.get("problem_type")
        if problem is not None and problem not in PROBLEM_TYPES:
            raise ConfigError(f"problem_type {problem!r} is not one of {PROBLEM_TYPES}")
        if problem == "regression":
            activation: Activation = "none"
        elif problem == "multi_label_classification" or num_labels == 1:
            activation = "sigmoid"
        else:
            activation = "softmax"
        return cls(labels, problem, activation)

    def scores(self, logits: np.ndarray, raw: bool = False) -> np.ndarray:
        """(..., num_labels) logits -> scores in float64 (the logits themselves when `raw`)."""
        logits = np.asarray(logits, dtype=np.float64)
        if raw or self.activation == "none":
            return logits
        if self.activation == "sigmoid":
            return 1.0 / (1.0 + np.exp(-logits))
        shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return shifted / shifted.sum(axis=-1, keepdims=True)


__all__ = ["LabelSpec"]
