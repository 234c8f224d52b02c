"""The typed front door of a loaded model: one method per task, below HTTP and above the engine link.

Each method checks and tokenizes its inputs (`service.frontend.inputs`), hands the items to the engine
(`service.frontend.link`) with a deadline, waits for their results (or for the caller to give up), and
returns typed outputs that carry all a response needs. Routes of any API shape (ours, OpenAI's, TEI's) call these and only format.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np
from starlette.concurrency import run_in_threadpool

from model.matryoshka import shorten
from model.tokenizer import EncodedText, WordPieceTokenizer
from service.errors import ServiceError
from service.frontend import answer_size
from service.frontend.deadlines import DeadlineWatch
from service.frontend.disconnects import Watch
from service.frontend.link import EngineLink
from service.frontend.inputs import (
    Limits,
    Piece,
    Preparation,
    classify_items,
    encode_items,
    fill_mask_items,
    nsp_items,
    sparse_items,
    tokenize_texts,
)
from service.logs import CURRENT_REQUEST
from service.metrics import Metrics
from service.tasks import (
    ClassLogits,
    FillMaskScores,
    Item,
    NspLogits,
    PooledVector,
    Pooling,
    SparseVector,
    TokenVectors,
)

T = TypeVar("T")
# A short request tokenizes in tens of microseconds, less than a hand-off to a thread and back costs;
# a large one would stall every other client on the event loop, so it goes to the thread pool.
INLINE_TOKENIZE_CHARS = 4096


@dataclass
class EncodeOutput:
    encoded: EncodedText
    result: TokenVectors | PooledVector

    @property
    def tokens(self) -> list[str]:
        return self.encoded.tokens

    @property
    def token_count(self) -> int:
        return len(self.encoded.ids)


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


Waiter = Watch | None  # how to learn that the caller has gone (service.frontend.disconnects)


class FrontDoor:
    def __init__(self, tokenizer: WordPieceTokenizer, engine: EngineLink, limits: Limits, metrics: Metrics,
                 queue_timeout_s: float, has_mlm_head: bool, has_nsp_head: bool, width: int, num_labels: int = 0,
                 classifier_pairs: bool = False, deadline_grace_s: float = 2.0, num_token_labels: int = 0,
                 has_qa_head: bool = False, late_interaction_dim: int = 0, long_input_window: int = 0,
                 long_input_overlap: int = 0, model: str = ""):
        self.tokenizer = tokenizer
        self.engine = engine
        self.limits = limits
        self.model = model  # the served model's name: what the engine computes these requests with
        self.metrics = metrics.for_model(model)
        self.queue_timeout_s = queue_timeout_s
        self.deadlines = DeadlineWatch(queue_timeout_s + deadline_grace_s, engine.computing, self._give_up)
        self.has_mlm_head = has_mlm_head
        self.has_nsp_head = has_nsp_head
        self.width = width  # the encoder's hidden size: the length of every vector
        self.num_labels = num_labels  # outputs of a sequence classifier / cross-encoder head (0: none)
        self.classifier_pairs = classifier_pairs  # whether the classifier reads [a, b] pairs (a cross-encoder)
        self.num_token_labels = num_token_labels  # outputs of a token-classification head (0: none)
        self.has_qa_head = has_qa_head  # an extractive question-answering head
        self.late_interaction_dim = late_interaction_dim  # a ColBERT projection's width (0: none)
        self.long_input_window = long_input_window or tokenizer.model_max_length  # tokens of a chunked input's window
        self.long_input_overlap = long_input_overlap  # pieces shared by neighbouring windows of a chunked input

    def heads(self) -> str:
        """What this checkpoint can do, for errors that refuse a route it cannot serve."""
        names = ["encoder (embeddings)"] + (["masked-LM head"] if self.has_mlm_head else []) + \
            (["next-sentence head"] if self.has_nsp_head else []) + \
            ([f"classification head ({self.num_labels} outputs)"] if self.num_labels else []) + \
            ([f"token-classification head ({self.num_token_labels} labels)"] if self.num_token_labels else []) + \
            (["question-answering head"] if self.has_qa_head else []) + \
            ([f"ColBERT projection ({self.late_interaction_dim} wide)"] if self.late_interaction_dim else [])
        return ", ".join(names)

    def _require(self, present: bool, route_needs: str) -> None:
        if not present:
            which = f" (model {self.model})" if self.model else ""
            raise ServiceError("unsupported", f"{route_needs}; this checkpoint has: {self.heads()}{which}")

    # ---- tasks ---------------------------------------------------------------------------------

    async def encode(self, inputs, pooling: Pooling, normalize: bool, prep: Preparation, gone: Waiter = None,
                     field: str = "inputs", dimensions: int | None = None, base64: bool = False,
                     limits: Limits | None = None) -> list[EncodeOutput]:
        """`field` is what error messages call the inputs (the request's own name for them). `dimensions`
        keeps the first N dimensions of pooled vectors, then normalises if asked (Matryoshka style). `base64`:
        the vectors go out base64-encoded (a smaller answer). `limits`: other than the server's (/similarity)."""
        if dimensions is not None and not 1 <= dimensions <= self.width:
            raise ServiceError("validation", f"dimensions must be between 1 and this model's width {self.width}, "
                                             f"got {dimensions}", param="dimensions")
        shortened = dimensions is not None and dimensions < self.width and pooling != "none"
        limits = limits or self.limits
        items, encoded = await self._tokenize(inputs, lambda: encode_items(
            self.tokenizer, inputs, pooling, normalize and not shortened, prep, limits, field,
            window=self.long_input_window, overlap=self.long_input_overlap))
        answer_size.check_vectors([len(e.ids) for e in encoded], dimensions if shortened else self.width,
                                  pooling != "none", base64, limits.max_response_mb)
        results = await self._compute(items, gone)
        if shortened:
            results = [PooledVector(shorten(r.vector, dimensions, normalize)) for r in results]
        return [EncodeOutput(e, r) for e, r in zip(encoded, results)]

    async def classify(self, entries: list, prep: Preparation, gone: Waiter = None,
                       field: str = "inputs") -> list[np.ndarray]:
        """(num_labels,) logits for each text or [a, b] pair, from the classification head."""
        self._require(self.num_labels > 0, "this route needs a sequence-classification (cross-encoder) head")
        if not self.classifier_pairs:
            pair = next((i for i, e in enumerate(entries) if isinstance(e, list)), None)
            if pair is not None:
                raise ServiceError("validation", f"{field}[{pair}] is a pair, but this classifier reads single texts "
                                                 "(serve it with --classifier-pairs yes if it was trained on pairs)",
                                   param=field)
        items = await self._tokenize(entries, lambda: classify_items(self.tokenizer, entries, prep, self.limits, field))
        results: list[ClassLogits] = await self._compute(items, gone)
        return [r.logits for r in results]

    def check_query(self, query: str, prep: Preparation) -> None:
        """A rerank query must fit the model on its own (with its pair it is cut only under truncate)."""
        if not query.strip():
            raise ServiceError("validation", "query is empty or whitespace only", param="query")
        if len(query) > self.limits.max_input_chars:
            raise ServiceError("validation", f"query has {len(query)} characters; the limit is "
                                             f"{self.limits.max_input_chars}", param="query")
        length = len(self.tokenizer.encode(query).ids)
        if length > self.tokenizer.model_max_length and not prep.truncate:
            raise ServiceError("validation", f"query is {length} tokens long; the model takes at most "
                                             f"{self.tokenizer.model_max_length} (send truncate: true to cut it)",
                               param="query")

    async def sparse(self, inputs, prep: Preparation, gone: Waiter = None) -> list[SparseVector]:
        """SPLADE weights over the vocabulary for each input, from the masked-LM head."""
        self._require(self.has_mlm_head, "sparse embeddings need a masked-LM head")
        items = await self._tokenize(inputs, lambda: sparse_items(self.tokenizer, inputs, prep, self.limits))
        vectors: list[SparseVector] = await self._compute(items, gone)
        # How many weights are not zero is known only now: the answer is bounded, the compute was spent.
        answer_size.check_sparse(sum(len(v.indices) for v in vectors), self.limits.max_response_mb)
        return vectors

    async def similarity(self, source: str, sentences: list[str], pooling: Pooling, prep: Preparation,
                         gone: Waiter = None) -> list[float]:
        """Cosine similarity of `source` to each of `sentences`, all embedded in one request."""
        if not sentences:
            raise ServiceError("empty", "sentences is empty; send at least one sentence to compare",
                               param="sentences")
        limit = self.limits.max_inputs_per_request
        if len(sentences) > limit:
            raise ServiceError("validation", f"sentences has {len(sentences)} entries; the limit is {limit} per "
                                             "request", param="sentences")
        # The source rides along: `sentences` alone counts against the limit (64 sentences work at 64).
        if not source.strip():
            raise ServiceError("validation", "source_sentence is empty or whitespace only", param="source_sentence")
        outputs = await self.encode([source, *sentences], pooling, True, prep, gone, field="sentences",
                                    limits=replace(self.limits, max_inputs_per_request=limit + 1))
        vectors = np.stack([o.result.vector for o in outputs])  # (1 + S, H), normalised
        return (vectors[1:] @ vectors[0]).astype(np.float64).tolist()

    def decode(self, sequences: list[list[int]], skip_special_tokens: bool) -> list[str]:
        """Token ids back to text (no model work)."""
        if not sequences or not all(sequences):
            raise ServiceError("empty", "ids is empty; send token ids to decode", param="ids")
        if len(sequences) > self.limits.max_inputs_per_request:
            raise ServiceError("validation", f"ids has {len(sequences)} entries; the limit is "
                                             f"{self.limits.max_inputs_per_request} per request", param="ids")
        size = self.tokenizer.vocab_size
        for index, ids in enumerate(sequences):
            bad = next((i for i in ids if not 0 <= i < size), None)
            if bad is not None:
                raise ServiceError("validation", f"ids[{index}] has token id {bad}, outside the vocabulary "
                                                 f"(0 to {size - 1})", param="ids")
        return [self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens) for ids in sequences]

    async def fill_mask(self, inputs, top_k: int, targets: list[str] | None, truncate: bool,
                        gone: Waiter = None) -> list[list[MaskOutput]]:
        self._require(self.has_mlm_head, "fill-mask needs a masked-LM head")
        items = await self._tokenize(inputs, lambda: fill_mask_items(
            self.tokenizer, inputs, top_k, targets, truncate, self.limits))
        answer_size.check_predictions([(len(i.mask_positions), len(i.input_ids), i.top_k) for i in items],
                                      self.limits.max_response_mb)
        results: list[FillMaskScores] = await self._compute(items, gone)
        return [self._predictions(item.input_ids, result) for item, result in zip(items, results)]

    async def nsp(self, inputs, truncate: bool, gone: Waiter = None) -> list[NspOutput]:
        self._require(self.has_nsp_head, "next-sentence scores need a next-sentence head")
        items = await self._tokenize(inputs, lambda: nsp_items(self.tokenizer, inputs, truncate, self.limits))
        results: list[NspLogits] = await self._compute(items, gone)
        return [_nsp_output(r) for r in results]

    async def tokenize(self, inputs, add_special_tokens: bool, prompt: str = "") -> list[list[Piece]]:
        """Each input's tokens with ids and character offsets (no model work); offsets count the prompt."""
        pieces = await self._tokenize(inputs, lambda: tokenize_texts(self.tokenizer, inputs, add_special_tokens,
                                                                     self.limits, prompt))
        answer_size.check_pieces(sum(map(len, pieces)), self.limits.max_response_mb)
        return pieces

    # ---- the steps (also those of the tasks beside this class: service.frontend.token_tasks) --------

    async def _tokenize(self, inputs, build: Callable[[], T]) -> T:
        started = time.monotonic()
        result = build() if _text_size(inputs) <= INLINE_TOKENIZE_CHARS else await run_in_threadpool(build)
        ended = time.monotonic()
        self.metrics.tokenize_seconds.observe(ended - started)
        record = CURRENT_REQUEST.get()  # the request's record (service.frontend.request_record), when one is kept
        if record is not None:
            record.tokenized_between(started, ended)
        return result

    async def _compute(self, items: list[Item], gone: Waiter) -> list:
        """Queue the items and wait for their results, until `gone` says the caller left, or until the deadline
        and its grace (`service.frontend.deadlines`): a stuck engine answers nothing, and no client waits on it.
        The request's record, when one is kept, may bring a sooner deadline (a gRPC client's) and a trace."""
        record = CURRENT_REQUEST.get()
        submitted = time.monotonic()
        deadline = submitted + self.queue_timeout_s
        if record is None:
            pending = self.engine.submit(items, deadline, self.model)
        else:
            deadline = min(deadline, record.deadline or deadline)
            record.model = self.model
            pending = self.engine.submit(items, deadline, self.model,
                                         record.trace.traceparent if record.trace else None)
        watched = self.deadlines.watch(pending)
        left = False

        def on_gone() -> None:
            nonlocal left
            left = True
            pending.cancel()  # the engine drops this request's queued entries before compute
            pending.result.cancel()

        stop_watching = gone(on_gone) if gone is not None else None
        try:
            results = await pending.result  # a failed item has already cancelled the rest of the request
            self.metrics.engine_round_trip.observe(time.monotonic() - submitted)
            if record is not None:
                record.computed_by(items, submitted, pending.timing())
            return results
        except asyncio.CancelledError:
            if not left:
                pending.cancel()  # this task itself was cancelled (a gRPC call that ended): nobody reads the results
                raise
            raise ServiceError("unavailable", "client disconnected") from None
        finally:
            self.deadlines.forget(watched)
            if stop_watching is not None:
                stop_watching()

    def _give_up(self, pending) -> None:
        """Answer a request the engine has not answered by its deadline and grace, and is not computing."""
        pending.cancel()  # the engine drops what it still holds of the request, should it wake up
        reason = self.engine.failure() or "the engine is not responding"
        pending.result.set_exception(ServiceError(
            "unavailable", f"no answer within the request's deadline ({self.queue_timeout_s:g} s): {reason}",
            retry_after_s=1))

    require, prepare, compute = _require, _tokenize, _compute

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
    """Characters of the request's texts (a token id counts as one)."""
    if isinstance(inputs, str):
        return len(inputs)
    if isinstance(inputs, int):
        return 1
    return sum(_text_size(i) for i in inputs)
