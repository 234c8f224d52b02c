"""Every service setting in one object. Each field reads `BERT_<NAME>` from the environment, is a
`--kebab-case` flag of `python -m service`, and its description (shown by --help, /info and the
table in docs/configuration.md) states the trade-off."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.engine.options import EngineOptions
from service.model_specs import ModelSpec, ModelSpecError, as_list, model_specs

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CHECKPOINT = REPO_ROOT / "checkpoints" / "minilm-wikipedia"


class Settings(BaseSettings):
    # An empty variable means "not set" (compose passes `${BERT_API_KEY:-}` as ""), so the default applies.
    model_config = SettingsConfigDict(env_prefix="BERT_", extra="forbid", validate_default=True, env_ignore_empty=True)

    checkpoint: Annotated[list[str], NoDecode] = Field([str(DEFAULT_CHECKPOINT)], description=(
        "Checkpoint to serve: a directory (ours or a transformers BertForPreTraining/BertForMaskedLM/BertModel/"
        "BertForSequenceClassification directory with model.safetensors), or a Hugging Face Hub id, org/name or "
        "org/name@revision, fetched once (safetensors only) into the Hub cache (HF_HOME; HF_TOKEN for gated "
        "models, HF_HUB_OFFLINE=1 for the cache alone: docs/hub-models.md). A directory of that name wins. Default: "
        "the bundled model (all-MiniLM-L6-v2 with masked-LM and next-sentence heads, trained on English Wikipedia). "
        "Give it more than once to serve several models from one engine and one device, each NAME=SOURCE (the name "
        "defaults to the Hub id's or directory's last part); the first is the default model, the others are served "
        "under /models/NAME/... and by the OpenAI `model` field (docs/several-models.md). From the environment: a "
        "comma-separated or JSON list."))
    model_setting: Annotated[list[str], NoDecode] = Field([], description=(
        "A setting of one model of several, NAME:KEY=VALUE (KEY: dtype, root_task, classifier_pairs, weight, "
        "max_queue_items); given more than once for more. The other models keep the server-wide value. weight "
        "(default 1) is the model's share of the device in tokens when several models have work: 2 gets twice the "
        "tokens of a model of weight 1. From the environment: a comma-separated or JSON list."))
    host: str = Field("127.0.0.1", description="Interface to listen on; 0.0.0.0 exposes the service beyond this machine.")
    port: int = Field(8000, ge=1, le=65535, description="TCP port.")
    device: str = Field("auto", description="auto (first CUDA GPU, else CPU), cpu, cuda or cuda:N.")
    workers: int | Literal["auto"] = Field("auto", description=(
        "HTTP front-end processes (HTTP, validation, tokenization, JSON) in front of the one engine process that "
        "owns the device, the model and the batcher; they share the port, the admission limit and the metrics. "
        "0 = one process does everything (least memory, no inter-process hop). auto = 0 on a CPU (the model needs "
        "the cores), and on a GPU one per two cores beyond the engine's, from 2 to 8 (a small model on a big GPU is "
        "bound by the CPU work of its requests). See docs/processes.md."))
    dtype: Literal["auto", "float32", "float16", "bfloat16", "int8"] = Field("auto", description=(
        "Number format. auto = bfloat16 on GPUs that support it, else float16; on a CPU bfloat16 where the CPU has it "
        "natively (AVX512-BF16 or AMX) and the model's answers on calibration sentences stay at float32's (checked at "
        "start-up; /info's dtype_reason gives the figures), else float32 (exact). On CPU, bfloat16 and int8 (encoder "
        "Linear layers, per-token scales and SmoothQuant calibrated at start-up; on a ColBERT the feed-forward output "
        "layers' inputs in 12 bits; CPU only) trade a little fidelity for speed: see docs/precision.md."))
    max_batch_tokens: int = Field(16384, ge=16, description=(
        "Token budget of one forward pass, counting padding. Larger batches raise throughput until the device "
        "saturates, and raise the latency of every item in them."))
    cpu_batch_tokens: int | Literal["auto", "measure"] = Field("auto", description=(
        "On CPU, the most tokens in one batch (within max_batch_tokens). Past a model- and CPU-dependent size, "
        "bigger batches are slower per sequence on a CPU (their activations leave the caches); below it each "
        "batch's fixed cost is shared by too few. auto = sized from the model's width: the largest power of two "
        "whose feed-forward activation fits 6 MiB (1024 for all-MiniLM-L6-v2, 512 for BERT-base, more for "
        "smaller models), and at most 1024 where a bfloat16 model's layers run as one C call each on AMX's "
        "tiles (that call takes up to 1024 rows); measure = timed at start-up (a few seconds more); or a "
        "number of tokens (at least 16). Ignored on GPU."))
    cpu_keep_freed_memory: bool = Field(True, description=(
        "On CPU under Linux (glibc), keep memory freed by finished tensors for the next ones instead of returning "
        "it to the kernel, which otherwise costs page faults on nearly every op's output (measured with "
        "bench.precision). The process then keeps its peak memory after a burst; false gives it back."))
    max_batch_size: int | Literal["auto"] = Field("auto", description=(
        "Most sequences in one forward pass; 1 turns batching off (the benchmark baseline). auto = 64 on a CPU "
        "(its token budget binds first), 256 on a GPU, where a forward pass costs the host about the same at any "
        "size: the in-process limit was best at 256 on an H100 and an H200, and on the H200 the service at 64 "
        "clients x 8 sentences went from 11.4k to 16.5k sentences/s (BENCHMARKS.md, 'On a GPU')."))
    max_wait_ms: float = Field(0.0, ge=0, description=(
        "How long an idle device waits for more items before running a short queue. 0 (default) runs at once: "
        "under load, batches fill by themselves while the device is busy; a few ms can enlarge batches of "
        "bursty low-concurrency traffic at the cost of that much latency."))
    max_padding_fraction: float = Field(0.10, gt=0, le=1, description=(
        "Largest share of a batch's compute spent on padding. Batches run packed (the token-wise layers see "
        "real tokens only), so padding costs only attention work, which grows when long and short inputs share "
        "a batch (on CPU, mixed lengths attend one sequence at a time and waste none). Lower keeps long inputs "
        "apart from short ones; higher makes fewer, bigger batches. 1 turns the cap off."))
    concurrent_batches: int = Field(0, ge=0, description=(
        "Batches computed at the same time, each by its own thread. 0 = auto: 2 on a CPU with at least 2 cores "
        "(each batch on half the cores: a batch spread over every core stalls whenever the HTTP side takes one), "
        "1 on a GPU. Work that finds one of them idle is split evenly over them, so a request alone on the server "
        "still has every core (one client sending 8 sentences a request: about 1.5× the sentences/s, BENCHMARKS.md)."))
    cuda_graphs: bool = Field(True, description=(
        "On a CUDA GPU, run each batch's encoder as one CUDA graph replay instead of an op-by-op forward pass, "
        "the tokens padded up to one of a set of sizes (at most an eighth more above 512). Small models are "
        "bound by the host's launches there. Applies with bfloat16/float16 (attention over packed sequences) "
        "and one batch at a time; captured at start-up (about a second), checked against the eager pass, and "
        "left off, with a log line, if either fails. /info says how many were captured."))
    compute_niceness: int = Field(10, ge=0, le=19, description=(
        "Nice value of the compute threads (Linux). Above 0 the thread that accepts and refuses requests comes "
        "first: under a flood refusals stay immediate and accepted requests' latency bounded, for almost no "
        "throughput. 0 = the same priority as the HTTP side."))
    express_lane: bool = Field(True, description=(
        "With several models on a CPU: a request to a model that was idle, arriving while every compute thread "
        "runs another model's batch, runs at once on a spare thread of higher priority (nice compute_niceness // "
        "2) instead of waiting for those batches; the operating system preempts them, as between separate "
        "servers, so a lightly used model keeps its latency under another's flood. A model that stays busy shares "
        "the threads fairly and never takes that path. --no-express-lane: wait for a thread (docs/several-models.md)."))
    gpu_express_lane: bool = Field(False, description=(
        "With several models on a GPU: the same express lane, one spare thread that queues a woken model's batch on "
        "a CUDA stream of its own at the device's highest priority, beside the busy model's batch instead of behind "
        "it. Off by default: its gain on a GPU is not yet measured (python -m bench.gpu --steps several_models "
        "measures the three models with and without it), and on a CPU stand-in of the device it gained nothing "
        "(docs/several-models.md)."))
    max_queue_items: int = Field(4096, ge=1, description=(
        "Inputs allowed to wait in the queue; beyond it requests get 429 with Retry-After at once, instead of "
        "queueing without bound."))
    queue_timeout_s: float = Field(30.0, gt=0, description=(
        "Deadline for an input to reach the device; past it the request gets 503 and the input is not computed."))
    max_concurrent_requests: int = Field(512, ge=1, description=(
        "Requests on the computing routes (every POST) handled at once, counted from the moment a request's body is "
        "in (a client still sending holds no slot); beyond it 429 with Retry-After at once (like "
        "text-embeddings-inference's --max-concurrent-requests). Lower bounds the wait of accepted requests under a "
        "flood; higher lets more clients queue."))
    deadline_grace_s: float = Field(2.0, ge=0, description=(
        "How long past its queue deadline (queue_timeout_s) a request still waits for a batch that reached the "
        "device in time; then the front end answers 503 itself, whatever the engine does, so a stuck engine makes "
        "nobody wait longer. Longer suits batches slower than this (a slow CPU with large batches: their requests "
        "would get 503 though computed); shorter bounds the worst wait."))
    stall_timeout_s: float = Field(15.0, gt=0, description=(
        "An engine that has work and finishes no batch for this long (or, with --workers N, sends no heartbeat for "
        "this long) is stuck (a hung device, a deadlock, a stopped process): /live answers 503 so the orchestrator "
        "restarts the server, /health says why, and new requests get 503 at once. Keep it well above the longest "
        "batch; shorter notices a hang sooner, at the risk of restarting a merely slow server."))
    header_timeout_s: float = Field(10.0, gt=0, description=(
        "Most seconds a connection may take to send a request's headers (from its first byte, or from the "
        "connection's opening); past it, 408 and the connection is closed. Bounds what a client that never finishes "
        "its headers holds (a connection, no admission slot). Longer suits very slow links; shorter frees those "
        "connections sooner."))
    body_idle_timeout_s: float = Field(5.0, gt=0, description=(
        "Most seconds between two pieces of a request's body; a body that stalls longer gets 408 (JSON) and its "
        "connection is closed. A request holds an admission slot only once its body is in, so stalled bodies "
        "cannot starve complete requests; this bounds how long each holds its connection. Longer suits clients "
        "on very slow links; shorter frees stalled connections sooner."))
    body_timeout_s: float = Field(30.0, gt=0, description=(
        "Most seconds a request's body may take to arrive in full, however steadily it trickles; past it, 408 and "
        "the connection is closed. Bounds a client that sends one byte just inside body_idle_timeout_s for ever."))
    max_connections: int = Field(2048, ge=1, description=(
        "Open client connections per front-end process (per server with --workers 0); a request on a connection "
        "beyond it is answered 503 (JSON, Retry-After) and that connection closed. Bounds the file descriptors "
        "and memory that idle or slow clients can hold; keep it above max_concurrent_requests plus the idle "
        "keep-alive connections of your clients and load balancer."))
    keep_alive_s: float = Field(75.0, gt=0, description=(
        "Seconds an idle client connection stays open. Longer than clients keep idle connections (httpx 5 s, "
        "browsers about 60 s), so a client never sends a request on a connection the server is closing."))
    max_inputs_per_request: int = Field(64, ge=1, description="Most inputs in one request (422 beyond).")
    max_input_chars: int = Field(50_000, ge=1, description=(
        "Most characters in one input text, checked before tokenization so that huge texts cost nothing (422)."))
    long_input_overlap: int = Field(0, ge=0, description=(
        "Tokens shared by consecutive windows when a request chunks an input longer than the model's window "
        "(\"long_input\": \"chunk\" on /embed, /encode and /v1/embeddings, and for a ColBERT's documents; "
        "docs/long-inputs.md), at most half a window. 0 = windows side by side, as vLLM's chunked processing cuts. "
        "Each shared token is read twice, once with the context before it and once with the context after it, and "
        "computed twice: a pooled vector moves by about as much as any other cut of the windows would move it "
        "(docs/long-inputs.md), a ColBERT document gets a second vector for the tokens at its windows' edges."))
    max_body_bytes: int = Field(2 * 1024 * 1024, ge=1024, description="Largest request body accepted (413 beyond).")
    max_top_k: int = Field(100, ge=1, description="Largest top_k accepted by /fill-mask (422 beyond).")
    max_response_mb: float = Field(32.0, gt=0, description=(
        "Largest answer a request may produce, in MB (10^6 bytes), estimated from its counts once it is tokenized "
        "and refused with 422 before any compute: fill-mask inputs x masks x top_k, token-level vectors (/encode "
        "without pooling, /embed_all) tokens x width, /tokenize tokens. The default lets every request of the "
        "documented limits through with pooled vectors (64 x 512 tokens) and 64-input fill-mask at a few masks and "
        "top_k 5, and token vectors up to about 2.4M floats (64 inputs x 96 tokens at width 384); it refuses "
        "64 inputs x 50 masks x top_k 100 (over 100 MB) and token vectors of 64 x 512 tokens (about 150 MB). Higher lets larger "
        "token-level answers through in one call, at that much front-end memory and serialization time per "
        "request (times the requests in flight)."))
    api_key: str | None = Field(None, description=(
        "If set, every API route (every POST, /info, /v1/models) needs 'Authorization: Bearer <key>', checked before "
        "anything else (401 before 413/415/422 and before admission); compared in constant time. Open without it: "
        "/health and /live (probes), /metrics unless metrics_require_key, and the pages for people (/docs, /redoc, "
        "/openapi.json, the playground at / and its assets), which compute nothing and show only the API's shape; "
        "the playground sends the key its user types."))
    api_key_file: Path | None = Field(None, description=(
        "Read the API key from this file instead (a mounted Kubernetes or Docker secret: the key stays out of the "
        "environment). Surrounding whitespace is ignored."))
    metrics_require_key: bool = Field(False, description="Also protect /metrics with the API key.")
    warmup: bool = Field(True, description="Run a warm-up batch before reporting healthy (first requests are not slow).")
    drain_seconds: float = Field(0.0, ge=0, description=(
        "On SIGTERM, keep answering 503 to new requests for this long (so load balancers notice) while "
        "accepted requests finish, then stop. Every answer while draining closes its connection, so keep-alive "
        "clients reconnect (elsewhere, behind a balancer) rather than lose a request when the server stops."))
    root_task: Literal["auto", "feature-extraction", "fill-mask", "sentence-similarity", "text-classification",
                       "token-classification", "question-answering"] = Field(
        "auto", description=(
            "What POST / (and /invocations) answers, for the Hugging Face InferenceClient and TEI-style clients that "
            "post to the root. auto: {source_sentence, sentences} inputs -> sentence-similarity; {question, context} "
            "-> question-answering; a classifier checkpoint -> text-classification; a token-classification checkpoint "
            "-> token-classification; a text with [MASK] or fill-mask parameters -> fill-mask; otherwise "
            "feature-extraction. A task name makes it the default for requests whose shape does not say otherwise."))
    classifier_pairs: Literal["auto", "yes", "no"] = Field("auto", description=(
        "Whether a sequence-classification checkpoint reads [text, text_pair] pairs (/predict pairs, /rerank). "
        "auto: yes for one output (a cross-encoder) or NLI-style labels (entailment/contradiction), no otherwise; "
        "a pair sent to a single-text classifier gets 422."))
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Server log level.")
    log_format: Literal["text", "json"] = Field("text", description=(
        "Server log lines: text, or json: one JSON object a line (time, level, message, logger, process, and on a line "
        "written while a request is handled its request_id, trace_id and route), for collectors that parse logs "
        "(text-embeddings-inference's --json-output). JSON costs the front ends a record per request (a few us) to "
        "carry those ids."))
    log_requests: bool = Field(False, description=(
        "One log line per answered request (an HTTP request, a gRPC call, a gRPC stream's message): route, status, "
        "duration, request id and, in JSON, trace id. Ties a client's x-request-id to the server's view of it; costs "
        "a line and ~25 us of front-end CPU a request (a tenth of a one-sentence request's), which one-sentence "
        "traffic on a GPU host notices."))
    otlp_endpoint: str | None = Field(None, description=(
        "Export OpenTelemetry traces to this OTLP collector: http://host:4317 (OTLP over gRPC) or http://host:4318 "
        "(OTLP over HTTP; otlp_protocol). One span per request (route, model, inputs, tokens) with children for "
        "validation, tokenization, queue wait, inference and writing the answer, and one span per batch (size, "
        "tokens, padding, device time) linked from each traced request in it; an incoming W3C traceparent is "
        "continued. Off by default; OTEL_EXPORTER_OTLP_ENDPOINT turns it on too, and the other OTEL_* variables "
        "apply (OTEL_TRACES_SAMPLER and its _ARG, OTEL_BSP_*, headers, certificates): docs/observability.md. "
        "Spans leave from a bounded queue on a thread: a collector that is down costs dropped spans and log lines, "
        "never a request; at 100% sampling a request costs ~0.2 ms of CPU in that thread (sample busy GPU hosts)."))
    otlp_service_name: str | None = Field(None, description=(
        "The traces' service.name (text-embeddings-inference's --otlp-service-name). Default: OTEL_SERVICE_NAME, "
        "else bert-serve."))
    otlp_protocol: Literal["auto", "grpc", "http/protobuf"] = Field("auto", description=(
        "OTLP transport. auto: OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL if set, else http/protobuf for an endpoint on "
        "port 4318 or ending in /v1/traces, else grpc."))
    grpc_port: int | None = Field(None, ge=1, le=65535, description=(
        "Also serve text-embeddings-inference's gRPC API (package tei.v1: Info, Embed, Predict, Rerank and "
        "Tokenize with their streaming calls; reflection; the standard health service) on this port, from the "
        "same front ends, admission limit, API key, metrics and engine as HTTP (docs/grpc.md). A stream keeps many "
        "inputs in flight on one connection (fuller batches); each of its messages costs a front end about what a "
        "one-input HTTP request does. Off by default: one port less to expose and secure."))
    grpc_stream_window: int = Field(64, ge=1, le=4096, description=(
        "Messages of one gRPC stream computed at once, each holding an admission slot while it does; later "
        "messages wait in the connection's flow control. Higher lets one stream fill larger batches; lower keeps "
        "one stream from holding many of max_concurrent_requests' slots."))

    @field_validator("workers")
    @classmethod
    def _workers(cls, value: int | str) -> int | str:
        if value != "auto" and not 0 <= value <= 64:
            raise ValueError("workers must be auto or a number of front-end processes from 0 to 64")
        return value

    @field_validator("cpu_batch_tokens")
    @classmethod
    def _cpu_batch_tokens(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 16:
            raise ValueError("cpu_batch_tokens must be auto, measure or a number of tokens of at least 16")
        return value

    @field_validator("max_batch_size")
    @classmethod
    def _max_batch_size(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError("max_batch_size must be auto or a number of sequences of at least 1")
        return value

    @field_validator("checkpoint", "model_setting", mode="before")
    @classmethod
    def _as_list(cls, value):
        if isinstance(value, os.PathLike):
            value = [os.fspath(value)]
        elif isinstance(value, (list, tuple)):
            value = [os.fspath(v) if isinstance(v, os.PathLike) else v for v in value]
        try:
            return as_list(value)
        except ModelSpecError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        if value not in ("auto", "cpu", "cuda") and not (value.startswith("cuda:") and value[5:].isdigit()):
            raise ValueError("device must be auto, cpu, cuda or cuda:N")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "Settings":
        if self.api_key_file is not None:
            if self.api_key is not None:
                raise ValueError("set api_key or api_key_file, not both")
            try:
                self.api_key = self.api_key_file.read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"api_key_file {self.api_key_file}: {exc.strerror if isinstance(exc, OSError) else exc}")
        if self.api_key is not None and len(self.api_key) < 8:
            raise ValueError("api_key must be at least 8 characters")
        if self.grpc_port is not None and self.grpc_port == self.port:
            raise ValueError(f"grpc_port must differ from port ({self.port}): HTTP and gRPC each need their own")
        self.models()  # a clash of names or a setting of a model not served stops the start here
        return self

    def models(self) -> list[ModelSpec]:
        """Every served model with its own settings, the default first (service.model_specs)."""
        defaults = {"dtype": self.dtype, "root_task": self.root_task, "classifier_pairs": self.classifier_pairs,
                    "weight": 1.0, "max_queue_items": self.max_queue_items}
        try:
            return model_specs(self.checkpoint, self.model_setting, defaults)
        except ModelSpecError as exc:
            raise ValueError(str(exc)) from None

    def engine_options(self, model: ModelSpec | None = None) -> EngineOptions:
        """How `model`'s engine starts (the default model's by default; service.engine.loader.start_engine)."""
        model = model or self.models()[0]
        return EngineOptions(model.checkpoint, self.device, model.dtype, self.max_batch_tokens, self.cpu_batch_tokens,
                             self.max_batch_size, self.concurrent_batches, self.cuda_graphs, self.warmup,
                             self.cpu_keep_freed_memory)

    def public(self) -> dict:
        """Settings without secrets, for /info."""
        values = self.model_dump(mode="json")
        values["api_key"] = "set" if self.api_key else None
        values["api_key_file"] = "set" if self.api_key_file else None  # a path of the serving host
        return values


def settings_table() -> str:
    """The settings table of docs/configuration.md, generated so that it cannot drift from the code."""
    rows = ["| setting (flag) | environment variable | default | meaning |", "| --- | --- | --- | --- |"]
    for name, field in Settings.model_fields.items():
        default = field.default
        if isinstance(default, list):  # the default checkpoint, shown relative to the repository
            default = ",".join(str(Path(v).relative_to(REPO_ROOT)) if Path(v).is_relative_to(REPO_ROOT) else v
                               for v in default)
        rows.append(f"| `--{name.replace('_', '-')}` | `BERT_{name.upper()}` | `{default}` | {field.description} |")
    return "\n".join(rows)
