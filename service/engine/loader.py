"""The engine's start-up, one for every entry point: checkpoint -> device, precision, engine, warm-up, batch budget,
CUDA graphs (`start_engine`).

The service (each of its models: `service.engine.models.load_models`) and the corpus job
(`corpus.embedder.Embedder`) both start an engine here and run it through the same `Batcher`, so a change to how a
model is started or batched reaches both. What each of them may set is an `EngineOptions`, made from its own settings
object (`Settings.engine_options`, `JobSettings.engine_options`). Blocking: the service runs it in a thread while
the HTTP side already answers /health with 503.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

import kernels
from model.attention import runs_varlen
from model.checkpoint import Checkpoint, load_checkpoint
from model.cpu_cores import usable_cores
from model.device import keep_freed_memory, pick_device
from service.engine.batch_size import batch_tokens_for_width, measure_batch_tokens
from service.engine.batch_types import BatchPolicy
from service.engine.engine import Engine
from service.engine.graph_check import check_graph
from service.engine.graphs import EncoderGraphs
from service.engine.options import EngineOptions
from service.engine.precision import Precision, PrecisionError, choose, for_model, prepare_model, rows_on_tiles
from service.engine.precision_probe import choose_auto_on_cpu
from service.messages import ModelFacts
from service.metrics import ModelMetrics

log = logging.getLogger("service")

# max_batch_size auto: on a CPU the token budget (cpu_batch_tokens) binds before 64 sequences but for the shortest
# inputs; a GPU's forward pass costs the host about the same at any size, so it takes the most it measured best at
# (bench.serving's in-process limit on an H100 and an H200: batch 256 of 32-256, both model shapes).
AUTO_BATCH_SIZE_CPU, AUTO_BATCH_SIZE_GPU = 64, 256


class StartupError(ValueError):
    """The engine cannot start with these options; the message names the option and what would work."""


@dataclass
class StartedEngine:
    """An engine ready to compute, and what start-up decided for it."""

    checkpoint: Checkpoint
    engine: Engine
    precision: Precision
    runners: int  # batches computed at once (on a CPU each on its share of the cores)
    batch_tokens: int  # token budget of one batch in force
    batch_size: int  # most sequences in one batch in force

    def batch_policy(self, max_wait_s: float = 0.0, max_queue_items: int = 4096, max_padding_fraction: float = 1.0,
                     runner_niceness: int = 0) -> BatchPolicy:
        """How the batcher forms batches for this engine; the arguments are the batcher's own settings."""
        return BatchPolicy(self.batch_tokens, self.batch_size, max_wait_s, max_queue_items, max_padding_fraction,
                           runners=self.runners, runner_niceness=runner_niceness)

    def facts(self) -> ModelFacts:
        engine = self.engine
        return ModelFacts(device=str(engine.device), dtype=self.precision.name, dtype_reason=self.precision.reason,
                          has_mlm_head=engine.has_mlm_head,
                          has_nsp_head=engine.has_nsp_head, num_labels=engine.num_labels,
                          batch_tokens_in_force=self.batch_tokens, batch_size_in_force=self.batch_size,
                          cuda_graphs=len(engine.graphs) if engine.graphs is not None else 0,
                          cuda_graphs_live=engine.graphs.live if engine.graphs is not None else [],
                          cuda_graphs_eager=[f"{name}: {why}" for name, why in engine.graphs_fallen_back.items()],
                          num_token_labels=engine.num_token_labels, has_qa_head=engine.has_qa_head)


def build_engine(checkpoint: Checkpoint, device: torch.device, precision: Precision, engine_factory=Engine) -> Engine:
    """The engine for `checkpoint` on `device` in `precision` as it applies to this model (`for_model`; int8
    quantizes, after calibration)."""
    precision = for_model(precision, checkpoint.late_interaction is not None)
    return engine_factory(prepare_model(checkpoint.model, precision, checkpoint.tokenizer, device), device,
                          precision.dtype)


def plan_compute(concurrent_batches: int, device: torch.device) -> int:
    """How many batches run at once; on CPU, also splits torch's threads between them."""
    if device.type != "cpu":
        return concurrent_batches or 1
    cores = usable_cores()  # the container's CPU quota too: a pod limited to 4 cores on a 64-core node sees 64
    batches = concurrent_batches or (2 if cores >= 2 else 1)
    torch.set_num_threads(max(1, cores // batches))
    return batches


def batch_tokens_on_cpu(options: EngineOptions, engine: Engine, tokenizer, precision: Precision) -> int:
    """The token budget of one batch on a CPU: the setting, else sized from the model's width, else measured."""
    if isinstance(options.cpu_batch_tokens, int):
        return min(options.cpu_batch_tokens, options.max_batch_tokens)
    if options.cpu_batch_tokens == "measure":
        return measure_batch_tokens(engine, tokenizer.token_to_id("the") or tokenizer.unk_id, tokenizer.cls_id,
                                    tokenizer.sep_id, ceiling=options.max_batch_tokens)
    # int8 layers hand float32 activations on; only bfloat16/float16 halve them
    element_bytes = torch.empty((), dtype=precision.dtype).element_size()
    chosen = batch_tokens_for_width(engine.model.config.intermediate_size, element_bytes, options.max_batch_tokens)
    tiled = rows_on_tiles(engine.model)
    if tiled is not None and tiled < chosen and tiled >= tokenizer.model_max_length:
        # bfloat16 layers in one C call on AMX's tiles take batches of up to `tiled` rows; a larger batch runs the
        # modules, slower (all-MiniLM-L6-v2 in-process, 2 cores, two runners: 1,399 sentences/s at batches of 16
        # sentences, about 500 tokens, against 1,140 at 64; `make bench-report`'s in-process sweep)
        log.info("batch size on this CPU: %d tokens per batch (bfloat16 layers on AMX's tiles, one C call each up to "
                 "that many rows)", tiled)
        return tiled
    log.info("batch size on this CPU: %d tokens per batch (feed-forward %d wide, %d-byte activations)", chosen,
             engine.model.config.intermediate_size, element_bytes)
    return chosen


def capture_graphs(engine: Engine, most_tokens: int, slots: int, runners: int) -> int:
    """CUDA graphs for the engine's encoder where they run (a CUDA device, attention over packed sequences, one
    batch at a time), each checked against the eager engine before any request uses it (adopt_if_faithful).
    Returns how many are live; 0 leaves every batch eager, saying why in the log."""
    config = engine.model.config
    if engine.device.type != "cuda" or runners != 1 or not runs_varlen(engine.device, engine.dtype, config.head_dim):
        log.info("CUDA graphs: off (they need a CUDA device, bfloat16 or float16 and one batch at a time)")
        return 0
    graphs = EncoderGraphs(engine.model, engine.device, most_tokens, slots)
    return adopt_if_faithful(engine, graphs, graphs.capture_all())


def adopt_if_faithful(engine: Engine, graphs: EncoderGraphs, seconds: float = 0.0) -> int:
    """Replay every captured graph once on a batch that fills it, against the eager engine (graph_check); drop
    each one that raises or drifts, alone, and give the engine the rest (none: every batch eager). Returns how
    many are live; the log names those that fell back, and why."""
    for key in graphs.keys():
        if key in graphs.graphs:
            problem, _ = check_graph(engine, graphs, key)
            if problem is not None:
                graphs.drop(key, problem)
    engine.use_graphs(graphs if len(graphs) else None)
    engine.graphs_fallen_back = dict(graphs.eager)
    captured = len(graphs) + len(graphs.eager)
    log.info("CUDA graphs: %d of %d live after the check, captured in %.1f s (%d token counts up to %d, %d sequence "
             "slots)", len(graphs), captured, seconds, len(graphs.buckets), graphs.buckets[-1], graphs.slots)
    for name, reason in graphs.eager.items():
        log.error("CUDA graph %s falls back to eager: %s", name, reason)
    if not len(graphs):
        log.error("CUDA graphs: none live: every batch runs eagerly")
    return len(graphs)


def start_engine(options: EngineOptions, metrics: ModelMetrics | None = None, engine_factory=None) -> StartedEngine:
    """Load the checkpoint, choose the precision, build, warm up, size the batches and capture CUDA graphs.
    Raises StartupError (an option that cannot work here), CheckpointError or CheckpointSourceError, each with a
    message to show as it is."""
    started = time.perf_counter()
    kernels.install()  # the CPU attention kernel, before any engine runs (the bfloat16 probe's too)
    try:
        device = pick_device(options.device)
        precision = choose(options.dtype, device)
    except (ValueError, PrecisionError) as exc:
        raise StartupError(str(exc)) from None
    if device.type == "cpu" and options.cpu_keep_freed_memory and not keep_freed_memory():
        log.info("cpu_keep_freed_memory: not glibc, left to the system allocator")
    checkpoint = load_checkpoint(options.checkpoint, device="cpu")
    tokenizer = checkpoint.tokenizer
    if options.max_batch_tokens < tokenizer.model_max_length:
        raise StartupError(f"--max-batch-tokens ({options.max_batch_tokens}) is below the model's maximum input "
                           f"length ({tokenizer.model_max_length}); a long input could never be scheduled")
    if options.dtype == "auto" and device.type == "cpu":
        precision = choose_auto_on_cpu(checkpoint)  # bfloat16 where native and faithful to float32, else float32
    precision = for_model(precision, checkpoint.late_interaction is not None)
    engine = build_engine(checkpoint, device, precision, engine_factory or Engine)
    runners = plan_compute(options.concurrent_batches, device)  # sets the threads each runner computes with
    if options.warmup:
        engine.warm_up(tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id)
    batch_tokens = options.max_batch_tokens
    if device.type == "cpu":
        batch_tokens = batch_tokens_on_cpu(options, engine, tokenizer, precision)
    batch_size = options.max_batch_size if isinstance(options.max_batch_size, int) else \
        AUTO_BATCH_SIZE_CPU if device.type == "cpu" else AUTO_BATCH_SIZE_GPU
    graphs = capture_graphs(engine, batch_tokens, batch_size, runners) if options.cuda_graphs else 0
    if metrics is not None:
        metrics.observe_graphs(engine.graphs.live if graphs else [], list(engine.graphs_fallen_back))
    if graphs and options.warmup:
        engine.warm_up(tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id)  # the heads, fed by the graphs
    log.info("model on %s (%s), %d batch(es) at once of at most %d tokens and %d sequences, ready in %.1f s", device,
             precision.name, runners, batch_tokens, batch_size, time.perf_counter() - started)
    return StartedEngine(checkpoint, engine, precision, runners, batch_tokens, batch_size)
