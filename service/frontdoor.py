"""The typed front door of a loaded model: one method per task, below HTTP and above the batcher.

Each method checks and tokenizes its inputs (`service.inputs`), queues the items with a deadline,
waits for their results (or for the caller to give up), and returns typed outputs that carry all a
response needs. Routes of any API shape (ours, OpenAI's, TEI's) call these and only format.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from starlette.concurrency import run_in_threadpool

from model.tokenizer import WordPieceTokenizer
from service.batcher import Batcher, Ticket
from service.errors import ServiceError
from service.inputs import Limits, Piece, encode_items, fill_mask_items, nsp_items, tokenize_texts
from service.metrics import Metrics
from service.tasks import FillMaskScores, Item, NspLogits, Pooling, PooledVector, TokenVectors

T = TypeVar("T")
# A short request tokenizes in tens of microseconds, less than a hand-off to a thread and back costs;
# a large one would stall every other client on the event loop, so it goes to the thread pool.
INLINE_TOKENIZE_CHARS = 4096


@dataclass
class EncodeOutput:
    tokens: list[str]
    result: TokenVectors | PooledVector


@dataclass
class Prediction:
    token_id: int
    token: str
    score: float
    sequence: str  # the input with this prediction in place of the mask (other masks stay visible)


@dataclass
class MaskOutput:
    position: int
    predictions: list[Prediction]


@dataclass
class NspOutput:
    logits: list[float]  # [is next, is random]
    score: float  # P(B follows A)

    @property
    def is_next(self) -> bool:
        return self.score >= 0.5


class FrontDoor:
    def __init__(self, tokenizer: WordPieceTokenizer, batcher: Batcher, limits: Limits, metrics: Metrics,
                 queue_timeout_s: float, has_mlm_head: bool, has_nsp_head: bool):
        self.tokenizer = tokenizer
        self.batcher = batcher
        self.limits = limits
        self.metrics = metrics
        self.queue_timeout_s = queue_timeout_s
        self.has_mlm_head = has_mlm_head
        self.has_nsp_head = has_nsp_head

    # ---- tasks ---------------------------------------------------------------------------------

    async def encode(self, inputs, pooling: Pooling, normalize: bool, truncate: bool,
                     gone: Callable[[], Awaitable[None]] | None = None, field: str = "inputs") -> list[EncodeOutput]:
        """`field` is what error messages call the inputs (the request's own name for them)."""
        items, tokens = await self._tokenize(inputs, lambda: encode_items(
            self.tokenizer, inputs, pooling, normalize, truncate, self.limits, field))
        results = await self._compute(items, gone)
        return [EncodeOutput(t, r) for t, r in zip(tokens, results)]

    async def fill_mask(self, inputs, top_k: int, targets: list[str] | None, truncate: bool,
                        gone: Callable[[], Awaitable[None]] | None = None) -> list[list[MaskOutput]]:
        if not self.has_mlm_head:
            raise ServiceError("unsupported", "this checkpoint has no masked-LM head, so /fill-mask is not available")
        items = await self._tokenize(inputs, lambda: fill_mask_items(
            self.tokenizer, inputs, top_k, targets, truncate, self.limits))
        results: list[FillMaskScores] = await self._compute(items, gone)
        return [self._predictions(item.input_ids, result) for item, result in zip(items, results)]

    async def nsp(self, inputs, truncate: bool, gone: Callable[[], Awaitable[None]] | None = None) -> list[NspOutput]:
        if not self.has_nsp_head:
            raise ServiceError("unsupported", "this checkpoint has no next-sentence head, so /nsp is not available")
        items = await self._tokenize(inputs, lambda: nsp_items(self.tokenizer, inputs, truncate, self.limits))
        results: list[NspLogits] = await self._compute(items, gone)
        return [_nsp_output(r) for r in results]

    async def tokenize(self, inputs, add_special_tokens: bool) -> list[list[Piece]]:
        """Each input's tokens with ids and character offsets (no model work)."""
        return await self._tokenize(inputs, lambda: tokenize_texts(self.tokenizer, inputs, add_special_tokens,
                                                                   self.limits))

    # ---- the steps ---------------------------------------------------------------------------

    async def _tokenize(self, inputs, build: Callable[[], T]) -> T:
        started = time.perf_counter()
        result = build() if _text_size(inputs) <= INLINE_TOKENIZE_CHARS else await run_in_threadpool(build)
        self.metrics.tokenize_seconds.observe(time.perf_counter() - started)
        return result

    async def _compute(self, items: list[Item], gone: Callable[[], Awaitable[None]] | None) -> list:
        """Queue the items and wait for their results, or until `gone()` returns (the caller left)."""
        ticket = Ticket(deadline=time.monotonic() + self.queue_timeout_s)
        results = asyncio.ensure_future(asyncio.gather(*self.batcher.submit(items, ticket)))
        if gone is None:
            waiting = {results}
        else:
            left = asyncio.ensure_future(gone())
            waiting = {results, left}
        try:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if gone is not None:
                left.cancel()
        if results in done:
            try:
                return results.result()
            except ServiceError:
                ticket.cancelled = True  # one input failed: do not compute the rest of this request
                raise
        ticket.cancelled = True  # the batcher drops this request's queued entries before compute
        results.cancel()
        raise ServiceError("unavailable", "client disconnected")

    def _predictions(self, input_ids: list[int], result: FillMaskScores) -> list[MaskOutput]:
        tokenizer = self.tokenizer
        specials = {tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id}
        masks = []
        for mask in result.masks:
            predictions = []
            for token_id, score in zip(mask.token_ids.tolist(), mask.scores.tolist()):
                filled = [token_id if p == mask.position else t for p, t in enumerate(input_ids) if t not in specials]
                predictions.append(Prediction(token_id, tokenizer.id_to_token(token_id), score,
                                              tokenizer.decode(filled, skip_special_tokens=False)))
            masks.append(MaskOutput(mask.position, predictions))
        return masks


def _nsp_output(result: NspLogits) -> NspOutput:
    logits = result.logits.astype(np.float64)
    shifted = np.exp(logits - logits.max())
    return NspOutput(logits.tolist(), float(shifted[0] / shifted.sum()))


def _text_size(inputs) -> int:
    if isinstance(inputs, str):
        return len(inputs)
    return sum(_text_size(i) for i in inputs)
