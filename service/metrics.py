"""Prometheus metrics, one registry per app (tests build many apps in one process).

With several processes (`--workers N`), the supervisor sets PROMETHEUS_MULTIPROC_DIR for all of them
before they import prometheus_client: each process then writes its values to files there, and /metrics
in any front end sums them over every process (prometheus_client's multiprocess mode), so a scrape
sees one server whichever front end answers it.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections import Counter as Tally
from functools import partial

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess

MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
LAG_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1)


def observe_all(histogram, amounts: list[float]) -> None:
    """`histogram.observe(amount)` for each of `amounts` (a Histogram or a labelled child), with one lock taken for
    the sum and one per bucket touched instead of two per amount: the engine observes each input's queue time, and
    one by one that was a tenth of its host work per input over a device that costs it nothing
    (bench.serving.engine_pipeline). Reads prometheus_client's own values (`_sum`, `_buckets`, `_upper_bounds`, as
    its `observe` does, in the pinned 0.26); where they are not there, observes one by one."""
    bounds, buckets, total = (getattr(histogram, name, None) for name in ("_upper_bounds", "_buckets", "_sum"))
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for amount in amounts:
            histogram.observe(amount)
        return
    if not amounts:
        return
    total.inc(sum(amounts))
    # the first bucket whose bound is at least the amount, as `observe` counts it (the last bound is +Inf)
    for index, count in Tally(map(partial(bisect_left, bounds), amounts)).items():
        buckets[index].inc(count)


class Metrics:
    """Every series carries the served model's name (`model`); requests that reach no model (a probe, an unknown
    path) carry an empty one. `for_model(name)` is the view a model's batcher and engine write through."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("bert_requests", "Requests answered, by route, HTTP status and model.",
                                ["route", "status", "model"], registry=r)
        self.failures = Counter("bert_request_failures", "Error responses, by route, error kind and model.",
                                ["route", "error_type", "model"], registry=r)
        self.request_seconds = Histogram("bert_request_duration_seconds", "Time from request to response.",
                                         ["route", "model"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("bert_queue_depth", "Inputs waiting for the device.", ["model"], registry=r,
                                 multiprocess_mode="livesum")  # only the engine sets it
        self.queue_seconds = Histogram("bert_queue_time_seconds", "Time an input waited before its batch ran.",
                                       ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.inference_seconds = Histogram("bert_inference_seconds", "Device time of one batch.", ["model"],
                                           buckets=LATENCY_BUCKETS, registry=r)
        self.engine_round_trip = Histogram("bert_engine_round_trip_seconds",
                                           "Time from a request's inputs handed to the engine to their results back "
                                           "(its queue and batches, and the hop between processes with --workers N); "
                                           "the rest of bert_request_duration_seconds is the front end's own.",
                                           ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.tokenize_seconds = Histogram("bert_tokenization_seconds", "Tokenization time of one request.", ["model"],
                                          buckets=LATENCY_BUCKETS, registry=r)
        self.batch_sequences = Histogram("bert_batch_sequences", "Sequences per batch.", ["model"],
                                         buckets=SIZE_BUCKETS, registry=r)
        self.batch_tokens = Histogram("bert_batch_tokens", "Real tokens per batch.", ["model"], buckets=TOKEN_BUCKETS,
                                      registry=r)
        self.batch_padding = Histogram("bert_batch_padding_fraction",
                                       "Share of a batch's model FLOPs spent on padding (attention only: batches run packed).",
                                       ["model"], buckets=(0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0), registry=r)
        self.items_computed = Counter("bert_items_computed", "Inputs that went through the device.", ["model"],
                                      registry=r)
        self.items_dropped = Counter("bert_items_dropped", "Inputs removed before compute, by reason.",
                                     ["reason", "model"], registry=r)
        self.batch_splits = Counter("bert_batch_splits", "Batches split in two after running out of device memory.",
                                    ["model"], registry=r)
        self.tokens_real = Counter("bert_tokens_real", "Real (non-padding) tokens computed.", ["model"], registry=r)
        self.express_batches = Counter("bert_express_batches",
                                       "Batches of a request that woke its idle model, run on an express runner while "
                                       "every runner computed another model's (several models on a CPU, "
                                       "--express-lane).", ["model"], registry=r)
        self.tokens_padded = Counter("bert_tokens_padded",
                                     "Tokens in attention's padded layout (the token-wise layers see real tokens only).",
                                     ["model"], registry=r)
        self.batches_graphed = Counter("bert_batches_graphed",
                                       "Batches whose encoder ran as one CUDA graph replay (the others ran op by op).",
                                       ["model"], registry=r)
        self.graph_padding_rows = Counter("bert_graph_padding_rows",
                                          "Rows a graphed batch computed beyond its real tokens (up to its graph's size).",
                                          ["model"], registry=r)
        self.cuda_graph_live = Gauge("bert_cuda_graph_live",
                                     "Per CUDA graph of the encoder (tokens x slots[:depth]): 1 if it replays, 0 if "
                                     "the start-up check made its batches run eagerly.", ["graph", "model"], registry=r,
                                     multiprocess_mode="max")  # only the engine sets it
        self.flops = Counter("bert_model_flops", "Encoder FLOPs of the batches computed.", ["model"], registry=r)
        self.flops_padding = Counter("bert_model_flops_padding", "The part of bert_model_flops spent on padding.",
                                     ["model"], registry=r)
        self.interpreter_lag = Histogram("bert_engine_interpreter_lag_seconds",
                                         "How late a thread of the engine that asks for the Python interpreter every "
                                         "10 ms gets it: about 0.1 ms while the engine's host work has time to spare, "
                                         "ms when its threads queue for the GIL (service/engine/interpreter_lag.py).",
                                         buckets=LAG_BUCKETS, registry=r)
        self._views: dict[str, ModelMetrics] = {}

    def for_model(self, name: str) -> ModelMetrics:
        """The series of one served model, as its batcher, engine and front door write them."""
        if name not in self._views:
            self._views[name] = ModelMetrics(self, name)
        return self._views[name]

    def render(self) -> bytes:
        if os.environ.get(MULTIPROCESS_DIR):
            summed = CollectorRegistry()
            multiprocess.MultiProcessCollector(summed)
            return generate_latest(summed)
        return generate_latest(self.registry)


class ModelMetrics:
    """One model's children of the engine's series (what `Batcher` and the start-up write), by the same names."""

    def __init__(self, metrics: Metrics, name: str):
        self.name = name
        self.queue_depth = metrics.queue_depth.labels(model=name)
        self.queue_seconds = metrics.queue_seconds.labels(model=name)
        self.tokenize_seconds = metrics.tokenize_seconds.labels(model=name)
        self.engine_round_trip = metrics.engine_round_trip.labels(model=name)
        self.batch_splits = metrics.batch_splits.labels(model=name)
        self.express_batches = metrics.express_batches.labels(model=name)
        self.items_dropped = _ByReason(metrics.items_dropped, name)
        self._metrics = metrics
        self._batch = [getattr(metrics, series).labels(model=name) for series in (
            "inference_seconds", "batch_sequences", "batch_tokens", "batch_padding", "items_computed", "tokens_real",
            "tokens_padded", "flops", "flops_padding", "batches_graphed", "graph_padding_rows")]

    def observe_batch(self, seconds: float, batch) -> None:
        """One computed batch (anything with size, real_tokens, padded_tokens, flops, padding_flops)."""
        (inference, sequences, tokens, padding, computed, real, padded, flops, flops_padding, graphed,
         graph_rows_series) = self._batch
        inference.observe(seconds)
        sequences.observe(batch.size)
        tokens.observe(batch.real_tokens)
        padding.observe(batch.padding_flops / batch.flops)
        computed.inc(batch.size)
        real.inc(batch.real_tokens)
        padded.inc(batch.padded_tokens)
        flops.inc(batch.flops)
        flops_padding.inc(batch.padding_flops)
        graph_rows = getattr(batch, "graph_rows", 0)  # an engine without CUDA graphs has none
        if graph_rows:
            graphed.inc()
            graph_rows_series.inc(graph_rows - batch.real_tokens)

    def observe_graphs(self, live: list[str], eager: list[str]) -> None:
        """Which CUDA graphs start-up kept (1) and which fell back to eager (0)."""
        for graph in live:
            self._metrics.cuda_graph_live.labels(graph=graph, model=self.name).set(1)
        for graph in eager:
            self._metrics.cuda_graph_live.labels(graph=graph, model=self.name).set(0)


class _ByReason:
    def __init__(self, counter: Counter, model: str):
        self.counter, self.model = counter, model

    def labels(self, reason: str):
        return self.counter.labels(reason=reason, model=self.model)
