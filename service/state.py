"""What the routes share: the loaded model, tokenizer, batcher and metrics, plus the dependencies
that hand them out (swapped or inspected in tests through `app.state.service`)."""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from pathlib import Path

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from model.checkpoint import load_checkpoint
from service.batcher import Batcher, Ticket
from service.engine import Engine, Item, ItemResult, pick_device, pick_dtype, plan_compute
from service.errors import ServiceError
from service.inputs import Limits
from service.metrics import Metrics
from service.settings import Settings

log = logging.getLogger("service")


class ServiceState:
    def __init__(self, settings: Settings, engine_factory=None):
        self.settings = settings
        self.metrics = Metrics()
        self.limits = Limits(settings.max_inputs_per_request, settings.max_input_chars, settings.max_top_k)
        self.engine_factory = engine_factory or Engine
        self.ready = False
        self.draining = False
        self.accepted = 0  # HTTP requests that reached the app
        self.answered = 0  # ... and whose response was sent in full
        self.load_error: str | None = None
        self.checkpoint = None
        self.engine: Engine | None = None
        self.batcher: Batcher | None = None

    # ---- life cycle ----------------------------------------------------------------------------

    def load(self) -> None:
        """Load, warm up, start batching (blocking; runs in a thread during the lifespan)."""
        started = time.perf_counter()
        s = self.settings
        device = pick_device(s.device)
        dtype = pick_dtype(s.dtype, device)
        checkpoint = load_checkpoint(s.checkpoint, device="cpu")
        engine = self.engine_factory(checkpoint.model, checkpoint.tokenizer.pad_id, device, dtype)
        longest = checkpoint.tokenizer.model_max_length
        if s.max_batch_tokens < longest:
            raise ValueError(f"max_batch_tokens ({s.max_batch_tokens}) is below the model's maximum input length "
                             f"({longest}); a long input could never be scheduled")
        if s.warmup:
            t = checkpoint.tokenizer
            engine.warm_up(t.cls_id, t.sep_id, t.mask_id)
        self.checkpoint, self.engine = checkpoint, engine
        runners = plan_compute(s.concurrent_batches, device)
        self.batcher = Batcher(engine, self.metrics, s.max_batch_tokens, s.max_batch_size, s.max_wait_ms,
                               s.max_queue_items, s.max_padding_fraction, runners=runners,
                               runner_niceness=s.compute_niceness)
        self.batcher.start()
        self.ready = True
        log.info("serving %s on %s (%s), ready in %.1f s", self.model_name, device, str(dtype).removeprefix("torch."),
                 time.perf_counter() - started)

    def shutdown(self) -> None:
        self.draining = True
        self.ready = False
        if self.batcher is not None:
            self.batcher.stop()

    # ---- for routes ----------------------------------------------------------------------------

    @property
    def tokenizer(self):
        return self.checkpoint.tokenizer

    @property
    def model_name(self) -> str:
        return Path(self.settings.checkpoint).name

    @property
    def hidden_size(self) -> int:
        return self.checkpoint.config.hidden_size

    def require_ready(self) -> None:
        if self.draining:
            raise ServiceError("unavailable", "the server is shutting down", retry_after_s=1)
        if self.load_error is not None:
            raise ServiceError("unavailable", "the model failed to load; see the server log")
        if not self.ready:
            raise ServiceError("unavailable", "the model is still loading", retry_after_s=1)

    def require_head(self, head: str) -> None:
        if head == "mlm" and not self.engine.has_mlm_head:
            raise ServiceError("unsupported", "this checkpoint has no masked-LM head, so /fill-mask is not available")
        if head == "nsp" and not self.engine.has_nsp_head:
            raise ServiceError("unsupported", "this checkpoint has no next-sentence head, so /nsp is not available")

    async def tokenize(self, build, inputs, *args):
        """`build(tokenizer, inputs, *args)` on the event loop for small inputs, else in a worker thread.

        A short sentence tokenizes in tens of microseconds, less than the hand-off to a thread and back
        costs; a large request would stall every other client, so it goes to the thread pool.
        """
        started = time.perf_counter()
        if _text_size(inputs) <= INLINE_TOKENIZE_CHARS:
            result = build(self.tokenizer, inputs, *args, limits=self.limits)
        else:
            result = await run_in_threadpool(build, self.tokenizer, inputs, *args, limits=self.limits)
        self.metrics.tokenize_seconds.observe(time.perf_counter() - started)
        return result

    async def compute(self, request: Request, items: list[Item]) -> list[ItemResult]:
        """Queue the items and wait for their results, or for the client to go away."""
        ticket = Ticket(deadline=time.monotonic() + self.settings.queue_timeout_s)
        futures = self.batcher.submit(items, ticket)
        results = asyncio.ensure_future(asyncio.gather(*futures))
        gone = asyncio.ensure_future(_client_gone(request))
        try:
            done, _ = await asyncio.wait({results, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if results in done:
            try:
                return results.result()
            except ServiceError:
                ticket.cancelled = True  # one input failed: do not compute the rest of this request
                raise
        ticket.cancelled = True  # the batcher drops this request's queued entries before compute
        results.cancel()
        raise ServiceError("unavailable", "client disconnected")

    def info(self) -> dict:
        config = self.checkpoint.config.to_dict() if self.checkpoint else None
        metadata = self.checkpoint.metadata if self.checkpoint else {}
        engine = self.engine
        return {
            "model": self.model_name,
            "ready": self.ready,
            "config": config,
            "training": {k: metadata.get(k) for k in ("eval", "data", "progress", "created", "command") if k in metadata},
            "heads": {"mlm": bool(engine and engine.has_mlm_head), "nsp": bool(engine and engine.has_nsp_head)},
            "device": str(engine.device) if engine else None,
            "dtype": str(engine.dtype).removeprefix("torch.") if engine else None,
            "max_input_tokens": self.tokenizer.model_max_length if self.checkpoint else None,
            "limits": {k: v for k, v in self.settings.public().items() if k not in ("checkpoint", "host", "port")},
        }


INLINE_TOKENIZE_CHARS = 4096


def _text_size(inputs) -> int:
    if isinstance(inputs, str):
        return len(inputs)
    return sum(_text_size(i) for i in inputs)


async def _client_gone(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


# The dependencies are coroutines on purpose: FastAPI runs plain-function dependencies in its thread
# pool, and those hops cost every request CPU time and GIL hand-offs that slow the device thread.
async def get_state(request: Request) -> ServiceState:
    return request.app.state.service


async def require_api_key(request: Request) -> None:
    key = request.app.state.service.settings.api_key
    if key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, supplied = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(supplied.strip().encode(), key.encode()):
        raise ServiceError("unauthorized", "missing or wrong API key; send 'Authorization: Bearer <key>'")


async def require_metrics_key(request: Request) -> None:
    if request.app.state.service.settings.metrics_require_key:
        await require_api_key(request)
