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
from service.model_specs import ModelSpec
from service.settings import Settings
from service.tracing import Tracing

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


@dataclass
class ServedModel:
    """One served model as the HTTP side sees it: what it is, where it came from, its text files, what the engine
    says of it, and its front door (the last three once the engine is ready)."""

    spec: ModelSpec
    source: ResolvedCheckpoint | None = None
    checkpoint: Checkpoint | None = None  # without weights: those live with the engine
    facts: ModelFacts | None = None
    frontdoor: FrontDoor | None = None
    colbert: ColbertDoor | None = None  # a ColBERT's token vectors and MaxSim scores
    reranker: Reranker | None = None  # what every rerank route scores with

    @property
    def name(self) -> str:
        """The name requests route by (/models/{name}/..., OpenAI's `model`)."""
        return self.spec.name

    @property
    def display_name(self) -> str:
        """What answers call the model: its given name, else the Hub id, else the directory's name."""
        if self.spec.named:
            return self.spec.name
        if self.source is not None and self.source.hub_id:
            return self.source.hub_id
        return Path(self.spec.checkpoint).name or self.spec.name


class Runtime:
    def __init__(self, settings: Settings, link: EngineLink, metrics: Metrics | None = None,
                 tracing: Tracing | None = None):
        self.settings = settings
        self.link = link
        self.metrics = metrics or Metrics()
        self.tracing = tracing  # this process's trace recorder (service.tracing), None when traces are off
        self.lifecycle = Lifecycle(loading_detail=lambda: self.progress or link.detail)
        self.requests = RequestCounts()
        self.models = {spec.name: ServedModel(spec) for spec in settings.models()}  # the default first
        self.default = next(iter(self.models))
        self.progress = ""  # a Hub download's files and bytes, while it runs

    # ---- the default model (a server of one model has only it) ------------------------------------

    @property
    def default_model(self) -> ServedModel:
        return self.models[self.default]

    @property
    def checkpoint(self) -> Checkpoint | None:
        return self.default_model.checkpoint

    @property
    def facts(self) -> ModelFacts | None:
        return self.default_model.facts

    @property
    def model_name(self) -> str:
        return self.default_model.display_name

    def set_sources(self, sources: dict[str, ResolvedCheckpoint]) -> None:
        """Each model's checkpoint as resolved before the port was bound (the runtime does not ask the Hub again)."""
        for name, source in sources.items():
            self.models[name].source = source

    # ---- which model a request is for ----------------------------------------------------------

    def model(self, name: str | None = None) -> ServedModel:
        """The model `name` names (its name, or the Hub id it came from); the default for None or "". Raises
        ServiceError not_found naming the served models."""
        if not name:
            return self.default_model
        found = self._named(name)
        if found is None:
            raise ServiceError("not_found", f"no model named {name!r} is served here; the served models: "
                               f"{', '.join(self.models)}", param="model")
        return found

    def requested_model(self, path_name: str | None, body_name: str | None) -> ServedModel:
        """The model of an OpenAI-style request. Under /models/{name} it is that model, as if it were served alone
        (a body naming a model it does not serve is answered by it, as below); a body naming *another* served model
        is refused. Otherwise the body's `model` picks one of several (none: the default), and with one model any
        `model` is answered by it, as TEI and Infinity do (clients send `text-embedding-3-small` and the like by
        default)."""
        self.lifecycle.require_ready()
        if path_name:
            in_path = self.model(path_name)
            named = self._named(body_name) if body_name else None
            if named is not None and named is not in_path:
                raise ServiceError("validation", f"the body's model {body_name!r} is not the model of the path "
                                   f"({in_path.name}): leave one of them out", param="model")
            return in_path
        if not body_name or len(self.models) == 1:
            return self.default_model
        return self.model(body_name)

    def _named(self, name: str) -> ServedModel | None:
        return self.models.get(name) or next((m for m in self.models.values() if m.display_name == name), None)

    def ready_model(self, name: str | None = None) -> ServedModel:
        """`model(name)`, once the server is ready (503 while loading or shutting down)."""
        self.lifecycle.require_ready()
        return self.model(name)

    def ready_frontdoor(self, name: str | None = None) -> FrontDoor:
        return self.ready_model(name).frontdoor

    def _show_progress(self, progress) -> None:
        self.progress = str(progress)

    async def start(self) -> None:
        """Wait for the engine, then open the front doors (the server already answers /health with 503)."""
        started = time.perf_counter()
        s = self.settings
        # Requests tokenize on the event loop. The tokenizers library would spread each request over a
        # pool of its own threads that spin while they wait: under load they took CPU from the compute
        # threads and stalled the event loop while it waited for them (py-spy). One thread is plenty for
        # the inputs of one request. A value the user set is kept.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        for served in self.models.values():
            if served.source is None:  # a Hub id is downloaded here while /health answers 503 with the progress
                served.source = await asyncio.to_thread(resolve_checkpoint, served.spec.checkpoint,
                                                        progress=self._show_progress)
        self.progress = ""
        # The tokenizers load while the engine does: a front end that hears "ready" then only builds its front
        # doors, so the front ends of one server turn ready within a millisecond of each other. The engine's
        # error, if both fail, is the one reported (it names the weights).
        files = {name: asyncio.ensure_future(asyncio.to_thread(_load_text_files, served.source.path))
                 for name, served in self.models.items()}
        try:
            facts = await self.link.start({name: served.source.path for name, served in self.models.items()})
        except BaseException:
            for pending in files.values():
                pending.cancel()
            raise
        limits = Limits(s.max_inputs_per_request, s.max_input_chars, s.max_top_k, s.max_response_mb)
        for served, model_facts in zip(self.models.values(), facts):
            # one classifier or none
            checkpoint = with_labels(await files[served.name], model_facts.num_labels or model_facts.num_token_labels)
            recipe = checkpoint.late_interaction  # a ColBERT's markers, lengths, skiplist and projection
            served.checkpoint, served.facts = checkpoint, model_facts
            served.frontdoor = FrontDoor(
                checkpoint.tokenizer, self.link, limits, self.metrics, s.queue_timeout_s, model_facts.has_mlm_head,
                model_facts.has_nsp_head, checkpoint.config.hidden_size, model_facts.num_labels,
                reads_pairs(checkpoint, served.spec.classifier_pairs) and model_facts.num_labels > 0,
                deadline_grace_s=s.deadline_grace_s, num_token_labels=model_facts.num_token_labels,
                has_qa_head=model_facts.has_qa_head, late_interaction_dim=recipe.dim if recipe else 0,
                long_input_window=window_length(checkpoint.tokenizer, checkpoint.pooling),
                long_input_overlap=s.long_input_overlap, model=served.name)
            if recipe is not None:
                served.colbert = ColbertDoor(served.frontdoor, ColbertTokens.of(checkpoint.tokenizer, recipe))
            served.reranker = reranker_for(served.frontdoor, checkpoint.labels, served.colbert)
        self.lifecycle.ready()
        log.info("serving %s on %s, ready in %.1f s", ", ".join(
            f"{m.display_name} ({m.facts.dtype})" for m in self.models.values()), self.facts.device,
            time.perf_counter() - started)

    def health(self) -> dict:
        """Readiness: loaded (every model), not draining, and an engine that can compute (not dead, not stuck)."""
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

    async def shutdown(self) -> None:
        self.lifecycle.drain()
        await self.link.stop()
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)

    def info(self, name: str | None = None) -> dict:
        """/info: the model (the default, or the one `name` names), how it was trained (file names only: no path
        of this or the training host), where it runs, and every limit; with several models, each one's summary."""
        body = self._model_info(self.model(name))
        body["limits"] = {k: v for k, v in self.settings.public().items()
                          if k not in ("checkpoint", "model_setting", "host", "port")} | body.pop("model_limits")
        body["models"] = [self._model_summary(m) for m in self.models.values()]
        body["default_model"] = self.default
        return body

    def _model_info(self, served: ServedModel) -> dict:
        checkpoint, facts = served.checkpoint, served.facts
        metadata = checkpoint.metadata if checkpoint else {}
        body = {
            "model": served.display_name,
            "name": served.name,
            "ready": self.lifecycle.is_ready,
            "config": checkpoint.config.to_dict() if checkpoint else None,
            "heads": _heads(facts, checkpoint),
            # a ColBERT's vectors: their width, the query and document lengths (null for any other model)
            "late_interaction": checkpoint.late_interaction.describe()
            if checkpoint and checkpoint.late_interaction else None,
            "device": facts.device if facts else None,
            "dtype": facts.dtype if facts else None,
            "dtype_reason": facts.dtype_reason if facts else None,  # what --dtype auto measured and chose
            "max_input_tokens": checkpoint.tokenizer.model_max_length if checkpoint else None,
            # the pooling of /v1/embeddings and /embed (our /encode takes it per request)
            "pooling": {"mode": checkpoint.pooling.mode, "normalize": checkpoint.pooling.normalize,
                        "source": checkpoint.pooling.source} if checkpoint else None,
        }
        if checkpoint:
            body.update(self._tei_info(served))
        training = {k: metadata.get(k) for k in ("eval", "data", "progress", "created", "command") if k in metadata}
        body["training"] = _file_names_only(training)
        body["model_limits"] = {  # what differs between models: the batches in force, the graphs, its own settings
            "dtype": served.spec.dtype, "root_task": served.spec.root_task,
            "classifier_pairs": served.spec.classifier_pairs, "max_queue_items": served.spec.max_queue_items,
            "weight": served.spec.weight,
            "batch_tokens_in_force": facts.batch_tokens_in_force if facts else None,
            "batch_size_in_force": facts.batch_size_in_force if facts else None,
            # tokens of each window of an input read with "long_input": "chunk" (service.frontend.long_inputs)
            "long_input_window": served.frontdoor.long_input_window if served.frontdoor else None,
            "cuda_graphs_in_force": facts.cuda_graphs if facts else None,  # graphs live; 0: eager
            # which graphs replay, and which fell back to eager at the start-up check (why)
            "cuda_graphs": {"live": facts.cuda_graphs_live, "eager": facts.cuda_graphs_eager} if facts else None,
        }
        return body

    def _model_summary(self, served: ServedModel) -> dict:
        """One line of /info's `models`: what a client picking a model needs."""
        facts = served.facts
        return {"name": served.name, "model": served.display_name, "default": served.name == self.default,
                "path": f"/models/{served.name}", "heads": _heads(facts, served.checkpoint),
                "dtype": facts.dtype if facts else None,
                "device": facts.device if facts else None, "weight": served.spec.weight,
                "root_task": served.spec.root_task, "max_queue_items": served.spec.max_queue_items,
                "batch_tokens_in_force": facts.batch_tokens_in_force if facts else None,
                "batch_size_in_force": facts.batch_size_in_force if facts else None,
                "cuda_graphs_in_force": facts.cuda_graphs if facts else None}

    def _tei_info(self, served: ServedModel) -> dict:
        """The fields text-embeddings-inference's /info has (its clients read them), beside ours."""
        s, checkpoint, facts = self.settings, served.checkpoint, served.facts
        labels = checkpoint.labels
        if labels is not None and facts is not None and facts.num_labels:  # TEI has no token classifiers
            id2label = dict(enumerate(labels.labels))
            kind = "reranker" if len(labels.labels) == 1 else "classifier"
            model_type = {kind: {"id2label": {str(i): n for i, n in id2label.items()},
                                 "label2id": {n: i for i, n in id2label.items()}}}
        else:
            model_type = {"embedding": {"pooling": checkpoint.pooling.mode}}
        return {
            "model_id": served.display_name,
            "model_sha": served.source.commit if served.source else None,  # the Hub commit served
            "model_dtype": facts.dtype if facts else None,
            "model_type": model_type,
            "prompts": dict(checkpoint.pooling.prompts) or None,
            "max_concurrent_requests": s.max_concurrent_requests,
            "max_input_length": checkpoint.tokenizer.model_max_length,
            "max_batch_tokens": facts.batch_tokens_in_force if facts else s.max_batch_tokens,
            "max_batch_requests": facts.batch_size_in_force if facts else s.max_batch_size,
            "max_client_batch_size": s.max_inputs_per_request,
            "auto_truncate": False,
            "tokenization_workers": s.workers if isinstance(s.workers, int) and s.workers > 0 else 1,
            "version": "0.1.0",
            "sha": None,
            "docker_label": None,
        }


def _heads(facts: ModelFacts | None, checkpoint: Checkpoint | None) -> dict:
    return {"mlm": bool(facts and facts.has_mlm_head), "nsp": bool(facts and facts.has_nsp_head),
            "classifier": bool(facts and facts.num_labels), "token_classifier": bool(facts and facts.num_token_labels),
            "question_answering": bool(facts and facts.has_qa_head),
            "late_interaction": bool(checkpoint and checkpoint.late_interaction)}


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
