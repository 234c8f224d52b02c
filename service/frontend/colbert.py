"""A ColBERT's two tasks over the front door: each text's token vectors in query or document mode, and MaxSim scores
of documents against a query. The items of one request (a query and its documents, or a long document's windows) go
to the engine together, batched with every other route's work; routes of any shape call these and only format."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.errors import ServiceError
from service.frontend import answer_size
from service.frontend.colbert_inputs import (ColbertInput, ColbertTokens, LongInput, Mode, colbert_inputs,
                                             vectors_per_text)
from service.frontend.frontdoor import FrontDoor, Waiter
from service.frontend.inputs import check_texts
from service.frontend.maxsim import maxsim


@dataclass
class ColbertVectors:
    tokens: list[str]  # the token each vector belongs to
    vectors: np.ndarray  # (vectors, dim) float32, L2-normalised
    token_count: int  # tokens the model read for it (markers, expansion and every window included)


class ColbertDoor:
    def __init__(self, door: FrontDoor, tokens: ColbertTokens):
        self.door = door
        self.tokens = tokens

    @property
    def dim(self) -> int:
        return self.tokens.recipe.dim

    async def vectors(self, texts: list[str], mode: Mode, long_input: LongInput, base64: bool = False,
                      gone: Waiter = None, field: str = "inputs") -> list[ColbertVectors]:
        check_texts(texts, self.door.limits, field)
        made = await self._prepare(texts, mode, long_input, field)
        answer_size.check_vectors([len(m.tokens) for m in made], self.dim, False, base64,
                                  self.door.limits.max_response_mb)
        results = await self.door.compute([item for m in made for item in m.items], gone)
        return [ColbertVectors(m.tokens, vectors, m.length)
                for m, vectors in zip(made, vectors_per_text(made, results))]

    async def scores(self, query: str, documents: list[str], long_input: LongInput, gone: Waiter = None,
                     field: str = "documents") -> np.ndarray:
        """(N,) MaxSim scores of `documents` against `query`, all of them computed in one request."""
        limits = self.door.limits
        if not documents:
            raise ServiceError("empty", f"{field} is empty; send at least one document to rank", param=field)
        check_texts(documents, limits, field)
        if not query.strip():
            raise ServiceError("validation", "query is empty or whitespace only", param="query")
        if len(query) > limits.max_input_chars:
            raise ServiceError("validation", f"query has {len(query)} characters; the limit is "
                                             f"{limits.max_input_chars}", param="query")
        queried = (await self._prepare([query], "query", "refuse", "query"))[0]
        made = await self._prepare(documents, "document", long_input, field)
        results = await self.door.compute(queried.items + [item for m in made for item in m.items], gone)
        return maxsim(results[0].vectors, vectors_per_text(made, results[1:]))

    async def _prepare(self, texts: list[str], mode: Mode, long_input: LongInput, field: str) -> list[ColbertInput]:
        overlap = self.door.long_input_overlap
        made = await self.door.prepare(texts, lambda: colbert_inputs(self.tokens, texts, mode, long_input, overlap,
                                                                     field))
        windows, limit = sum(len(m.items) for m in made), self.door.limits.max_inputs_per_request
        if windows > limit:
            raise ServiceError("validation", f"{field} make {windows} windows of the model's document length; the "
                                             f"limit is {limit} per request: send fewer or shorter texts", param=field)
        return made

