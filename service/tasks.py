"""The work one input asks for, and what comes back: a typed item and a typed result per task.

Items travel front door -> batcher -> engine; results engine -> front door. The batcher only needs
`len(item)` (tokens); the engine dispatches on the item's type; a result's type says its shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

Pooling = Literal["none", "cls", "mean"]


@dataclass
class Tokens:
    """One tokenized input: [CLS] a [SEP] (b [SEP])."""

    # Lists where the items are made; read off the wire (service.messages) in the engine process, int32 memoryviews
    # of the request's one buffer, which index, iterate and measure as the lists do.
    input_ids: list[int]
    token_type_ids: list[int]

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class EncodeItem(Tokens):
    pooling: Pooling = "none"
    normalize: bool = False


@dataclass
class FillMaskItem(Tokens):
    mask_positions: list[int] = field(default_factory=list)
    top_k: int = 5
    target_ids: list[int] | None = None  # score only these tokens


@dataclass
class NspItem(Tokens):
    pass


@dataclass
class ClassifyItem(Tokens):
    """A text or a pair for a sequence classifier / cross-encoder."""


@dataclass
class SparseItem(Tokens):
    """A text for SPLADE-style sparse weights over the vocabulary (needs the MLM head)."""


@dataclass
class TokenClassifyItem(Tokens):
    """A text (or one window of a long one) for a token classifier: a label's logits at every token."""


@dataclass
class QaItem(Tokens):
    """[CLS] question [SEP] context window [SEP] for an extractive question-answering head."""


@dataclass
class WindowItem(EncodeItem):
    """One window of an input longer than the model's window (service.frontend.long_inputs). Pooled alone, never
    normalised; the engine folds the windows of each input into its one `PooledVector` before answering
    (service.engine.long_inputs): their mean weighted by tokens, normalised if `normalize_input`."""

    source: int = 0  # which input of the request this is a window of (its windows are consecutive items)
    normalize_input: bool = False


@dataclass
class LateInteractionItem(Tokens):
    """A ColBERT query or document, marked and expanded as its model's own encoder does (service.frontend.colbert):
    the projected, normalised vectors of its tokens at `kept` (`TokenVectors`, dim wide)."""

    keys: int | None = None  # the others attend to its first `keys` tokens (a query's [MASK]s are not read); None: all
    kept: list[int] | None = None  # the positions whose vectors come back (a document's skiplist left out); None: all


Item = (EncodeItem | FillMaskItem | NspItem | ClassifyItem | SparseItem | TokenClassifyItem | QaItem | WindowItem
        | LateInteractionItem)


@dataclass
class TokenVectors:
    vectors: np.ndarray  # (L, H) float32: one vector per token, special tokens included (a ColBERT's: (kept, dim))


@dataclass
class PooledVector:
    vector: np.ndarray  # (H,) float32


@dataclass
class MaskScores:
    position: int  # the [MASK]'s token index ([CLS] is 0)
    token_ids: np.ndarray  # (k,) best first
    scores: np.ndarray  # (k,) softmax over the whole vocabulary


@dataclass
class FillMaskScores:
    masks: list[MaskScores]


@dataclass
class NspLogits:
    logits: np.ndarray  # (2,): [is next, is random] (Hugging Face order)


@dataclass
class ClassLogits:
    logits: np.ndarray  # (num_labels,) float32


@dataclass
class SparseVector:
    indices: np.ndarray  # (K,) vocabulary ids with a non-zero weight, ascending
    values: np.ndarray  # (K,) float32 weights, max over tokens of log(1 + relu(MLM logit))


@dataclass
class TokenLogits:
    logits: np.ndarray  # (L, num_labels) float32: the token classifier's, special tokens included


@dataclass
class SpanLogits:
    start: np.ndarray  # (L,) float32: each token's logit of starting the answer
    end: np.ndarray  # (L,) float32: ... of ending it


Result = (TokenVectors | PooledVector | FillMaskScores | NspLogits | ClassLogits | SparseVector | TokenLogits
          | SpanLogits)
