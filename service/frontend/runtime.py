"""The HTTP side's view of the served model: loading, ready, draining, stopped, or failed.

`Runtime` owns what a front end has once the engine is ready (the checkpoint's text files, the
engine's facts, the front door over its `EngineLink`) and the one `Lifecycle` whose named transitions
every other module calls; nothing else writes the service's state. Which engine the link reaches (in
this process or the engine process) is the caller's choice (`service.app`, `service.frontend.worker`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from model.checkpoint_files import Checkpoint, load_checkpoint_files, with_labels
from model.hub import ResolvedCheckpoint, resolve_checkpoint
from service.errors import ServiceError
from service.frontend.colbert import ColbertDoor
from service.frontend.colbert_inputs import ColbertTokens
from service.frontend.frontdoor import FrontDoor
from service.frontend.inputs import Limits
from service.frontend.long_inputs import window_length
from service.frontend.rerankers import Reranker, reranker_for
from service.frontend.link import EngineLink
from service.messages import ModelFacts
from service.metrics import Metrics
from service.settings import Settings

log = logging.getLogger("service")


class Lifecycle:
    """loading -> ready -> draining, or loading -> failed; draining may also start while loading."""

    def __init__(self, loading_detail: Callable[[], str] = str) -> None:
        self.state = "loading"
        self.failure: str | None = None
        self.loading_detail = loading_detail  # what loading is doing now (download progress, warm-up)

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
            raise ServiceError("unavailable", f"the server cannot compute: {self.failure}; see the server log")
        if self.state == "loading":
            detail = f" ({self.loading_detail()})" if self.loading_detail() else ""
            raise ServiceError("unavailable", f"the model is still loading{detail}", retry_after_s=1)


@dataclass
class RequestCounts:
    accepted: int = 0  # HTTP requests that reached the app
    answered: int = 0  # ... and whose response was sent in full


def _load_text_files(directory: Path) -> Checkpoint:
    checkpoint = load_checkpoint_files(directory)
    checkpoint.tokenizer.vocab  # noqa: B018 - built here (tens of ms), not by the first request
    return checkpoint


def reads_pairs(checkpoint: Checkpoint, setting: str) -> bool:
    """Whether the checkpoint's classifier takes [a, b] pairs (see the classifier_pairs setting)."""
    if checkpoint.labels is None or setting == "no":
        return False
    if setting == "yes":
        return True
    names = " ".join(checkpoint.labels.labels).lower()
    return len(checkpoint.labels.labels) == 1 or "entail" in names or "contradict" in names


class Runtime:
    def __init__(self, settings: Settings, link: EngineLink, metrics: Metrics | None = None):
        self.settings = settings
        self.link = link
        self.metrics = metrics or Metrics()
        self.lifecycle = Lifecycle(loading_detail=lambda: self.progress or link.detail)
        self.requests = RequestCounts()
        self.checkpoint: Checkpoint | None = None  # without weights: those live with the engine
        self.facts: ModelFacts | None = None
        self.frontdoor: FrontDoor | None = None
        self.colbert: ColbertDoor | None = None  # a ColBERT's token vectors and MaxSim scores
        self.reranker: Reranker | None = None  # what every rerank route scores with
        self.source: ResolvedCheckpoint | None = None  # set when the checkpoint was resolved before the port was bound
        self.progress = ""  # a Hub download's files and bytes, while it runs

    @property
    def model_name(self) -> str:
        return self.source.hub_id if self.source and self.source.hub_id else Path(self.settings.checkpoint).name

    def _show_progress(self, progress) -> None:
        self.progress = str(progress)

    async def start(self) -> None:
        """Wait for the engine, then open the front door (the server already answers /health with 503)."""
        started = time.perf_counter()
        s = self.settings
        # Requests tokenize on the event loop. The tokenizers library would spread each request over a
        # pool of its own threads that spin while they wait: under load they took CPU from the compute
        # threads and stalled the event loop while it waited for them (py-spy). One thread is plenty for
        # the inputs of one request. A value the user set is kept.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        if self.source is None:  # a Hub id is downloaded here while /health answers 503 with the progress
            self.source = await asyncio.to_thread(resolve_checkpoint, s.checkpoint, progress=self._show_progress)
            self.progress = ""
        # The tokenizer loads while the engine does: a front end that hears "ready" then only builds its front
        # door, so the front ends of one server turn ready within a millisecond of each other. The engine's
        # error, if both fail, is the one reported (it names the weights).
        files = asyncio.ensure_future(asyncio.to_thread(_load_text_files, self.source.path))
        try:
            facts = await self.link.start(self.source.path)
        except BaseException:
            files.cancel()
            raise
        checkpoint = with_labels(await files, facts.num_labels or facts.num_token_labels)  # one classifier or none
        limits = Limits(s.max_inputs_per_request, s.max_input_chars, s.max_top_k, s.max_response_mb)
        recipe = checkpoint.late_interaction  # a ColBERT's markers, lengths, skiplist and projection
        self.checkpoint, self.facts = checkpoint, facts
        self.frontdoor = FrontDoor(checkpoint.tokenizer, self.link, limits, self.metrics, s.queue_timeout_s,
                                   facts.has_mlm_head, facts.has_nsp_head, checkpoint.config.hidden_size,
                                   facts.num_labels,
                                   reads_pairs(checkpoint, s.classifier_pairs) and facts.num_labels > 0,
                                   deadline_grace_s=s.deadline_grace_s, num_token_labels=facts.num_token_labels,
                                   has_qa_head=facts.has_qa_head,
                                   late_interaction_dim=recipe.dim if recipe else 0,
                                   long_input_window=window_length(checkpoint.tokenizer, checkpoint.pooling),
                                   long_input_overlap=s.long_input_overlap)
        if recipe is not None:
            self.colbert = ColbertDoor(self.frontdoor, ColbertTokens.of(checkpoint.tokenizer, recipe))
        self.reranker = reranker_for(self.frontdoor, checkpoint.labels, self.colbert)
        self.lifecycle.ready()
        log.info("serving %s on %s (%s), ready in %.1f s", self.model_name, facts.device, facts.dtype,
                 time.perf_counter() - started)

    def health(self) -> dict:
        """Readiness: loaded, not draining, and an engine that can compute (not dead, not stuck)."""
        self.lifecycle.require_ready()
        failure = self.link.failure()
        if failure is not None:
            raise ServiceError("unavailable", failure)
        return {"status": "ok"}

    def live(self) -> dict:
        """Liveness, which is not readiness: loading, busy and draining servers are alive (restarting them would
        only lose work); a failed load, a dead packing/compute thread or engine process, or an engine that has had
        work and made no progress for stall_timeout_s is not (the last may recover by itself; a restart will)."""
        state = self.lifecycle.state
        if state == "failed":
            raise ServiceError("unavailable", f"the server cannot compute: {self.lifecycle.failure}")
        failure = self.link.failure() if state != "loading" else None
        if failure is not None:
            raise ServiceError("unavailable", failure)
        return {"status": "alive", "state": state}

    def ready_frontdoor(self) -> FrontDoor:
        self.lifecycle.require_ready()
        return self.frontdoor

    async def shutdown(self) -> None:
        self.lifecycle.drain()
        await self.link.stop()

    def info(self) -> dict:
        """/info: the model, how it was trained (file names only: no path of this or the training host),
        where it runs, and every limit."""
        checkpoint, facts = self.checkpoint, self.facts
        metadata = checkpoint.metadata if checkpoint else {}
        body = {
            "model": self.model_name,
            "ready": self.lifecycle.is_ready,
            "config": checkpoint.config.to_dict() if checkpoint else None,
            "heads": {"mlm": bool(facts and facts.has_mlm_head), "nsp": bool(facts and facts.has_nsp_head),
                      "classifier": bool(facts and facts.num_labels),
                      "token_classifier": bool(facts and facts.num_token_labels),
                      "question_answering": bool(facts and facts.has_qa_head),
                      "late_interaction": bool(checkpoint and checkpoint.late_interaction)},
            # a ColBERT's vectors: their width, the query and document lengths (null for any other model)
            "late_interaction": checkpoint.late_interaction.describe()
            if checkpoint and checkpoint.late_interaction else None,
            "device": facts.device if facts else None,
            "dtype": facts.dtype if facts else None,
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
        body["limits"]["batch_tokens_in_force"] = facts.batch_tokens_in_force if facts else None
        body["limits"]["batch_size_in_force"] = facts.batch_size_in_force if facts else None
        # tokens of each window of an input read with "long_input": "chunk" (service.frontend.long_inputs)
        body["limits"]["long_input_window"] = self.frontdoor.long_input_window if self.frontdoor else None
        body["limits"]["cuda_graphs_in_force"] = facts.cuda_graphs if facts else None  # graphs live; 0: eager
        body["limits"]["cuda_graphs"] = {"live": facts.cuda_graphs_live, "eager": facts.cuda_graphs_eager} \
            if facts else None  # which graphs replay, and which fell back to eager at the start-up check (why)
        return body


    def _tei_info(self, checkpoint: Checkpoint) -> dict:
        """The fields text-embeddings-inference's /info has (its clients read them), beside ours."""
        s, labels = self.settings, checkpoint.labels
        if labels is not None and self.facts is not None and self.facts.num_labels:  # TEI has no token classifiers
            id2label = dict(enumerate(labels.labels))
            kind = "reranker" if len(labels.labels) == 1 else "classifier"
            model_type = {kind: {"id2label": {str(i): n for i, n in id2label.items()},
                                 "label2id": {n: i for i, n in id2label.items()}}}
        else:
            model_type = {"embedding": {"pooling": checkpoint.pooling.mode}}
        return {
            "model_id": self.model_name,
            "model_sha": self.source.commit if self.source else None,  # the Hub commit served
            "model_dtype": self.facts.dtype if self.facts else None,
            "model_type": model_type,
            "prompts": dict(checkpoint.pooling.prompts) or None,
            "max_concurrent_requests": s.max_concurrent_requests,
            "max_input_length": checkpoint.tokenizer.model_max_length,
            "max_batch_tokens": self.facts.batch_tokens_in_force if self.facts else s.max_batch_tokens,
            "max_batch_requests": self.facts.batch_size_in_force if self.facts else s.max_batch_size,
            "max_client_batch_size": s.max_inputs_per_request,
            "auto_truncate": False,
            "tokenization_workers": s.workers if isinstance(s.workers, int) and s.workers > 0 else 1,
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
