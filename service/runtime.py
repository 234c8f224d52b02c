"""The served model's life: loading (in the background), ready, draining, stopped, or failed to load.

`Runtime` owns everything that exists once the model is loaded (checkpoint, engine, batcher, front
door) and the one `Lifecycle` whose named transitions every other module calls; nothing else writes
the service's state.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from model.checkpoint import Checkpoint, load_checkpoint
from model.device import keep_freed_memory, pick_device
from model.hub import ResolvedCheckpoint, resolve_checkpoint
from service.batch_size import measure_batch_tokens
from service.batcher import Batcher, BatchPolicy
from service.engine import Engine
from service.errors import ServiceError
from service.frontdoor import FrontDoor
from service.inputs import Limits
from service.metrics import Metrics
from service.precision import Precision, PrecisionError, choose, prepare_model
from service.settings import Settings

log = logging.getLogger("service")


class Lifecycle:
    """loading -> ready -> draining, or loading -> failed; draining may also start while loading."""

    def __init__(self) -> None:
        self.state = "loading"
        self.failure: str | None = None
        self.progress: str | None = None  # what loading is doing now (a Hub download's files and bytes)

    def show_progress(self, progress) -> None:
        self.progress = str(progress)

    def ready(self) -> None:
        if self.state == "loading":
            self.state = "ready"

    def failed(self, message: str) -> None:
        self.state, self.failure = "failed", message

    def drain(self) -> None:
        if self.state != "failed":
            self.state = "draining"

    @property
    def is_ready(self) -> bool:
        return self.state == "ready"

    def require_ready(self) -> None:
        if self.state == "draining":
            raise ServiceError("unavailable", "the server is shutting down", retry_after_s=1)
        if self.state == "failed":
            raise ServiceError("unavailable", "the model failed to load; see the server log")
        if self.state == "loading":
            doing = f" ({self.progress})" if self.progress else ""
            raise ServiceError("unavailable", f"the model is still loading{doing}", retry_after_s=1)


@dataclass
class RequestCounts:
    accepted: int = 0  # HTTP requests that reached the app
    answered: int = 0  # ... and whose response was sent in full


def build_engine(checkpoint: Checkpoint, device: torch.device, precision: Precision, engine_factory=Engine) -> Engine:
    """The engine for `checkpoint` on `device` in `precision` (int8 quantizes, after calibration)."""
    return engine_factory(prepare_model(checkpoint.model, precision, checkpoint.tokenizer), device, precision.dtype)


def reads_pairs(checkpoint: Checkpoint, setting: str) -> bool:
    """Whether the checkpoint's classifier takes [a, b] pairs (see the classifier_pairs setting)."""
    if checkpoint.labels is None or setting == "no":
        return False
    if setting == "yes":
        return True
    names = " ".join(checkpoint.labels.labels).lower()
    return len(checkpoint.labels.labels) == 1 or "entail" in names or "contradict" in names


def plan_compute(concurrent_batches: int, device: torch.device) -> int:
    """How many batches run at once; on CPU, also splits torch's threads between them."""
    if device.type != "cpu":
        return concurrent_batches or 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    batches = concurrent_batches or (2 if cores >= 2 else 1)
    torch.set_num_threads(max(1, cores // batches))
    return batches


class Runtime:
    def __init__(self, settings: Settings, engine_factory=None):
        self.settings = settings
        self.metrics = Metrics()
        self.lifecycle = Lifecycle()
        self.requests = RequestCounts()
        self.engine_factory = engine_factory or Engine
        self.checkpoint: Checkpoint | None = None
        self.engine: Engine | None = None
        self.batcher: Batcher | None = None
        self.frontdoor: FrontDoor | None = None
        self.precision = None
        self.source: ResolvedCheckpoint | None = None  # set by __main__ when it resolved before binding the port
        self._stopped = threading.Event()

    @property
    def model_name(self) -> str:
        return self.source.hub_id if self.source and self.source.hub_id else Path(self.settings.checkpoint).name

    def load(self) -> None:
        """Load, warm up, start batching (blocking; runs in a thread while the server already answers)."""
        started = time.perf_counter()
        s = self.settings
        try:
            device = pick_device(s.device)
            precision = choose(s.dtype, device)
        except (ValueError, PrecisionError) as exc:
            raise RuntimeError(str(exc)) from None
        # Requests tokenize on the event loop. The tokenizers library would spread each request over a
        # pool of its own threads that spin while they wait: under load they took CPU from the compute
        # threads and stalled the event loop while it waited for them (py-spy). One thread is plenty for
        # the inputs of one request. A value the user set is kept.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        if device.type == "cpu" and s.cpu_keep_freed_memory and not keep_freed_memory():
            log.info("cpu_keep_freed_memory: not glibc, left to the system allocator")
        if self.source is None:  # a Hub id is downloaded here while /health answers 503 with the progress
            self.source = resolve_checkpoint(s.checkpoint, progress=self.lifecycle.show_progress)
            self.lifecycle.progress = None
        checkpoint = load_checkpoint(self.source.path, device="cpu")
        tokenizer = checkpoint.tokenizer
        engine = build_engine(checkpoint, device, precision, self.engine_factory)
        self.precision = precision
        if s.max_batch_tokens < tokenizer.model_max_length:
            raise ValueError(f"max_batch_tokens ({s.max_batch_tokens}) is below the model's maximum input length "
                             f"({tokenizer.model_max_length}); a long input could never be scheduled")
        runners = plan_compute(s.concurrent_batches, device)  # sets the threads each runner computes with
        if s.warmup:
            engine.warm_up(tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id)
        batch_tokens = s.max_batch_tokens
        if device.type == "cpu":
            batch_tokens = min(batch_tokens, s.cpu_batch_tokens or measure_batch_tokens(
                engine, tokenizer.token_to_id("the") or tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id,
                ceiling=s.max_batch_tokens))
        policy = BatchPolicy(batch_tokens, s.max_batch_size, s.max_wait_ms / 1000, s.max_queue_items,
                             s.max_padding_fraction, runners=runners, runner_niceness=s.compute_niceness)
        batcher = Batcher(engine, policy, self.metrics)
        batcher.start()
        limits = Limits(s.max_inputs_per_request, s.max_input_chars, s.max_top_k)
        self.checkpoint, self.engine, self.batcher = checkpoint, engine, batcher
        self.frontdoor = FrontDoor(tokenizer, batcher, limits, self.metrics, s.queue_timeout_s,
                                   engine.has_mlm_head, engine.has_nsp_head, checkpoint.config.hidden_size,
                                   engine.num_labels, reads_pairs(checkpoint, s.classifier_pairs))
        self.lifecycle.ready()
        log.info("serving %s on %s (%s), ready in %.1f s", self.model_name, device, precision.name,
                 time.perf_counter() - started)

    def live(self) -> dict:
        """Liveness, which is not readiness: loading, busy and draining servers are alive (restarting them would
        only lose work); a failed load or a dead packing/compute thread is not, since neither recovers."""
        state = self.lifecycle.state
        if state == "failed":
            raise ServiceError("unavailable", f"the model failed to load: {self.lifecycle.failure}")
        if state == "ready" and self.batcher is not None and not self.batcher.workers_alive:
            raise ServiceError("unavailable", "a batching thread has died; restart the server")
        return {"status": "alive", "state": state}

    def ready_frontdoor(self) -> FrontDoor:
        self.lifecycle.require_ready()
        return self.frontdoor

    def shutdown(self) -> None:
        self.lifecycle.drain()
        if self.batcher is not None:
            self.batcher.stop()

    def info(self) -> dict:
        """/info: the model, how it was trained (file names only: no path of this or the training host),
        where it runs, and every limit."""
        checkpoint, engine = self.checkpoint, self.engine
        metadata = checkpoint.metadata if checkpoint else {}
        body = {
            "model": self.model_name,
            "ready": self.lifecycle.is_ready,
            "config": checkpoint.config.to_dict() if checkpoint else None,
            "heads": {"mlm": bool(engine and engine.has_mlm_head), "nsp": bool(engine and engine.has_nsp_head),
                      "classifier": bool(engine and engine.num_labels)},
            "device": str(engine.device) if engine else None,
            "dtype": self.precision.name if self.precision else None,
            "max_input_tokens": checkpoint.tokenizer.model_max_length if checkpoint else None,
            # the pooling of /v1/embeddings and /embed (our /encode takes it per request)
            "pooling": {"mode": checkpoint.pooling.mode, "normalize": checkpoint.pooling.normalize,
                        "source": checkpoint.pooling.source} if checkpoint else None,
        }
        if checkpoint:
            body.update(self._tei_info(checkpoint))
        training = {k: metadata.get(k) for k in ("eval", "data", "progress", "created", "command") if k in metadata}
        body["training"] = _file_names_only(training)
        body["limits"] = {k: v for k, v in self.settings.public().items() if k not in ("checkpoint", "host", "port")}
        body["limits"]["batch_tokens_in_force"] = self.batcher.policy.max_batch_tokens if self.batcher else None
        return body


    def _tei_info(self, checkpoint: Checkpoint) -> dict:
        """The fields text-embeddings-inference's /info has (its clients read them), beside ours."""
        s, labels = self.settings, checkpoint.labels
        if labels is not None:
            id2label = dict(enumerate(labels.labels))
            kind = "reranker" if len(labels.labels) == 1 else "classifier"
            model_type = {kind: {"id2label": {str(i): n for i, n in id2label.items()},
                                 "label2id": {n: i for i, n in id2label.items()}}}
        else:
            model_type = {"embedding": {"pooling": checkpoint.pooling.mode}}
        return {
            "model_id": self.model_name,
            "model_sha": self.source.commit if self.source else None,  # the Hub commit served
            "model_dtype": self.precision.name if self.precision else None,
            "model_type": model_type,
            "prompts": dict(checkpoint.pooling.prompts) or None,
            "max_concurrent_requests": s.max_concurrent_requests,
            "max_input_length": checkpoint.tokenizer.model_max_length,
            "max_batch_tokens": self.batcher.policy.max_batch_tokens if self.batcher else s.max_batch_tokens,
            "max_batch_requests": s.max_batch_size,
            "max_client_batch_size": s.max_inputs_per_request,
            "auto_truncate": False,
            "tokenization_workers": 1,
            "version": "0.1.0",
            "sha": None,
            "docker_label": None,
        }


def _file_names_only(value):
    """The same JSON value with every string that looks like a path (and every path word of a command
    line) reduced to its last part: /info does not reveal the layout of the machines involved."""
    if isinstance(value, dict):
        return {k: _file_names_only(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_file_names_only(v) for v in value]
    if isinstance(value, str) and "/" in value:
        return " ".join(word.rstrip("/").rsplit("/", 1)[-1] if "/" in word else word for word in value.split(" "))
    return value
