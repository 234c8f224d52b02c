"""The engine side's start-up: checkpoint -> device, precision, engine, warm-up, batch budget, batcher.

`load_engine(settings, metrics)` returns a `LoadedEngine` that computes and batches; the engine process
(`service.engine.server`) or, in one process, `service.engine.link.LocalLink` puts the front ends' requests on
its batcher. Blocking: it runs in a thread while the HTTP side already answers /health with 503.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from model.attention import runs_varlen
from model.checkpoint import Checkpoint, load_checkpoint
from model.cpu_cores import usable_cores
from model.device import keep_freed_memory, pick_device
from service.engine.batch_size import batch_tokens_for_width, measure_batch_tokens
from service.engine.batcher import Batcher, BatchPolicy
from service.engine.engine import Engine
from service.engine.graph_check import check_graph
from service.engine.graphs import EncoderGraphs
from service.engine.precision import Precision, PrecisionError, choose, prepare_model
from service.messages import ModelFacts
from service.metrics import Metrics
from service.settings import Settings

log = logging.getLogger("service")


@dataclass
class LoadedEngine:
    checkpoint: Checkpoint
    engine: Engine
    batcher: Batcher
    precision: Precision
    facts: ModelFacts


def build_engine(checkpoint: Checkpoint, device: torch.device, precision: Precision, engine_factory=Engine) -> Engine:
    """The engine for `checkpoint` on `device` in `precision` (int8 quantizes, after calibration)."""
    return engine_factory(prepare_model(checkpoint.model, precision, checkpoint.tokenizer), device, precision.dtype)


# max_batch_size auto: on a CPU the token budget (cpu_batch_tokens) binds before 64 sequences but for the shortest
# inputs; a GPU's forward pass costs the host about the same at any size, so it takes the most it measured best at
# (bench.serving's in-process limit on an H100 and an H200: batch 256 of 32-256, both model shapes).
AUTO_BATCH_SIZE_CPU, AUTO_BATCH_SIZE_GPU = 64, 256


def plan_compute(concurrent_batches: int, device: torch.device) -> int:
    """How many batches run at once; on CPU, also splits torch's threads between them."""
    if device.type != "cpu":
        return concurrent_batches or 1
    cores = usable_cores()  # the container's CPU quota too: a pod limited to 4 cores on a 64-core node sees 64
    batches = concurrent_batches or (2 if cores >= 2 else 1)
    torch.set_num_threads(max(1, cores // batches))
    return batches


def batch_tokens_on_cpu(s: Settings, engine: Engine, tokenizer, precision: Precision) -> int:
    """The token budget of one batch on a CPU: the setting, else sized from the model's width, else measured."""
    if isinstance(s.cpu_batch_tokens, int):
        return min(s.cpu_batch_tokens, s.max_batch_tokens)
    if s.cpu_batch_tokens == "measure":
        return measure_batch_tokens(engine, tokenizer.token_to_id("the") or tokenizer.unk_id, tokenizer.cls_id,
                                    tokenizer.sep_id, ceiling=s.max_batch_tokens)
    # int8 layers hand float32 activations on; only bfloat16/float16 halve them
    element_bytes = torch.empty((), dtype=precision.dtype).element_size()
    chosen = batch_tokens_for_width(engine.model.config.intermediate_size, element_bytes, s.max_batch_tokens)
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


def load_engine(settings: Settings, metrics: Metrics, engine_factory=None) -> LoadedEngine:
    """Load, warm up and start batching; raises RuntimeError/CheckpointError/ValueError with a message to show."""
    started = time.perf_counter()
    s = settings
    try:
        device = pick_device(s.device)
        precision = choose(s.dtype, device)
    except (ValueError, PrecisionError) as exc:
        raise RuntimeError(str(exc)) from None
    if device.type == "cpu" and s.cpu_keep_freed_memory and not keep_freed_memory():
        log.info("cpu_keep_freed_memory: not glibc, left to the system allocator")
    checkpoint = load_checkpoint(s.checkpoint, device="cpu")
    tokenizer = checkpoint.tokenizer
    engine = build_engine(checkpoint, device, precision, engine_factory or Engine)
    if s.max_batch_tokens < tokenizer.model_max_length:
        raise ValueError(f"max_batch_tokens ({s.max_batch_tokens}) is below the model's maximum input length "
                         f"({tokenizer.model_max_length}); a long input could never be scheduled")
    runners = plan_compute(s.concurrent_batches, device)  # sets the threads each runner computes with
    if s.warmup:
        engine.warm_up(tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id)
    batch_tokens = s.max_batch_tokens
    if device.type == "cpu":
        batch_tokens = batch_tokens_on_cpu(s, engine, tokenizer, precision)
    batch_size = s.max_batch_size if isinstance(s.max_batch_size, int) else \
        AUTO_BATCH_SIZE_CPU if device.type == "cpu" else AUTO_BATCH_SIZE_GPU
    graphs = capture_graphs(engine, batch_tokens, batch_size, runners) if s.cuda_graphs else 0
    live = engine.graphs.live if graphs else []
    metrics.observe_graphs(live, list(engine.graphs_fallen_back))
    if graphs and s.warmup:
        engine.warm_up(tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id)  # the heads, fed by the graphs
    policy = BatchPolicy(batch_tokens, batch_size, s.max_wait_ms / 1000, s.max_queue_items,
                         s.max_padding_fraction, runners=runners, runner_niceness=s.compute_niceness)
    batcher = Batcher(engine, policy, metrics)
    batcher.start()
    facts = ModelFacts(device=str(device), dtype=precision.name, has_mlm_head=engine.has_mlm_head,
                       has_nsp_head=engine.has_nsp_head, num_labels=engine.num_labels,
                       batch_tokens_in_force=batch_tokens, batch_size_in_force=batch_size, cuda_graphs=graphs,
                       cuda_graphs_live=live,
                       cuda_graphs_eager=[f"{name}: {why}" for name, why in engine.graphs_fallen_back.items()],
                       num_token_labels=engine.num_token_labels, has_qa_head=engine.has_qa_head)
    log.info("model on %s (%s), ready in %.1f s", device, precision.name, time.perf_counter() - started)
    return LoadedEngine(checkpoint, engine, batcher, precision, facts)
