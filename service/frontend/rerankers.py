"""Whatever the served model reranks with, behind one call: documents -> one relevance score each, for every rerank
route (text-embeddings-inference's `/rerank`, Cohere's `/v1/rerank` and `/v2/rerank`).

- A cross-encoder (a classifier of [query, document] pairs with one output) scores each pair; its score is the
  sigmoid of the logit (or the logit with `raw_scores`), as /rerank has always answered.
- A ColBERT scores by MaxSim over the documents' token vectors (service.frontend.colbert): the scores are raw sums
  of cosines, between 0 and the query's length; `raw_scores` changes nothing.
Chosen once, when the model is loaded (`reranker_for`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from model.labels import LabelSpec
from service.errors import ServiceError
from service.frontend.colbert import ColbertDoor
from service.frontend.colbert_inputs import LongInput
from service.frontend.frontdoor import FrontDoor, Waiter
from service.frontend.inputs import Preparation


@dataclass(frozen=True)
class RerankOptions:
    prep: Preparation = Preparation()  # a cross-encoder's: truncate (and where), the checkpoint's prompt
    raw_scores: bool = False
    chunk: bool = False  # read documents longer than the model's window in windows (a ColBERT's only)
    field: str = "documents"  # what the request calls its documents, for errors

    @property
    def long_input(self) -> LongInput:
        if self.chunk and self.prep.truncate:
            raise ServiceError("validation", "send truncate: true or long_input: chunk, not both", param="long_input")
        return "chunk" if self.chunk else "truncate" if self.prep.truncate else "refuse"


class Reranker(Protocol):
    async def scores(self, query: str, documents: list[str], options: RerankOptions, gone: Waiter = None
                     ) -> np.ndarray:
        """(N,) relevance scores of `documents` for `query`, in the documents' order."""


class CrossEncoderReranker:
    def __init__(self, door: FrontDoor, labels: LabelSpec | None):
        self.door = door
        self.labels = labels

    async def scores(self, query: str, documents: list[str], options: RerankOptions, gone: Waiter = None
                     ) -> np.ndarray:
        door = self.door
        if door.num_labels and not door.classifier_pairs:
            raise ServiceError("unsupported", f"reranking needs a cross-encoder (a classifier of [query, text] pairs) "
                                              f"or a ColBERT; this checkpoint's classifier reads single texts. It has: "
                                              f"{door.heads()}")
        if door.num_labels > 1:
            raise ServiceError("unsupported", f"reranking needs one relevance score per pair; this checkpoint's "
                                              f"classifier has {door.num_labels} outputs (use /predict)")
        if options.chunk:
            raise ServiceError("validation", "long_input: chunk reads long documents in windows for a ColBERT; a "
                                             "cross-encoder reads each pair whole (send truncate: true to cut them)",
                               param="long_input")
        if not documents:
            raise ServiceError("empty", f"{options.field} is empty; send at least one text to rank",
                               param=options.field)
        door.check_query(query, options.prep)
        logits = await door.classify([[query, text] for text in documents], options.prep, gone=gone,
                                     field=options.field)
        return self.labels.scores(np.stack(logits)[:, 0], raw=options.raw_scores)


class ColbertReranker:
    def __init__(self, colbert: ColbertDoor):
        self.colbert = colbert

    async def scores(self, query: str, documents: list[str], options: RerankOptions, gone: Waiter = None
                     ) -> np.ndarray:
        return await self.colbert.scores(query, documents, options.long_input, gone, options.field)


def reranker_for(door: FrontDoor, labels: LabelSpec | None, colbert: ColbertDoor | None) -> Reranker:
    return ColbertReranker(colbert) if colbert is not None else CrossEncoderReranker(door, labels)


def best_first(scores: np.ndarray) -> np.ndarray:
    """Indices from the highest score down (ties keep the documents' order)."""
    return np.argsort(-scores, kind="stable")
