"""Prometheus metrics, one registry per app (tests build many apps in one process).

With several processes (`--workers N`), the supervisor sets PROMETHEUS_MULTIPROC_DIR for all of them
before they import prometheus_client: each process then writes its values to files there, and /metrics
in any front end sums them over every process (prometheus_client's multiprocess mode), so a scrape
sees one server whichever front end answers it.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess

MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("bert_requests", "Requests answered, by route and HTTP status.", ["route", "status"], registry=r)
        self.failures = Counter("bert_request_failures", "Error responses, by route and error kind.",
                                ["route", "error_type"], registry=r)
        self.request_seconds = Histogram("bert_request_duration_seconds", "Time from request to response.", ["route"],
                                         buckets=LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("bert_queue_depth", "Inputs waiting for the device.", registry=r,
                                 multiprocess_mode="livesum")  # only the engine sets it
        self.queue_seconds = Histogram("bert_queue_time_seconds", "Time an input waited before its batch ran.",
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.inference_seconds = Histogram("bert_inference_seconds", "Device time of one batch.",
                                           buckets=LATENCY_BUCKETS, registry=r)
        self.tokenize_seconds = Histogram("bert_tokenization_seconds", "Tokenization time of one request.",
                                          buckets=LATENCY_BUCKETS, registry=r)
        self.batch_sequences = Histogram("bert_batch_sequences", "Sequences per batch.", buckets=SIZE_BUCKETS, registry=r)
        self.batch_tokens = Histogram("bert_batch_tokens", "Real tokens per batch.", buckets=TOKEN_BUCKETS, registry=r)
        self.batch_padding = Histogram("bert_batch_padding_fraction",
                                       "Share of a batch's model FLOPs spent on padding (attention only: batches run packed).",
                                       buckets=(0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0), registry=r)
        self.items_computed = Counter("bert_items_computed", "Inputs that went through the device.", registry=r)
        self.items_dropped = Counter("bert_items_dropped", "Inputs removed before compute, by reason.", ["reason"],
                                     registry=r)
        self.batch_splits = Counter("bert_batch_splits", "Batches split in two after running out of device memory.",
                                    registry=r)
        self.tokens_real = Counter("bert_tokens_real", "Real (non-padding) tokens computed.", registry=r)
        self.tokens_padded = Counter("bert_tokens_padded",
                                     "Tokens in attention's padded layout (the token-wise layers see real tokens only).",
                                     registry=r)
        self.batches_graphed = Counter("bert_batches_graphed",
                                       "Batches whose encoder ran as one CUDA graph replay (the others ran op by op).",
                                       registry=r)
        self.graph_padding_rows = Counter("bert_graph_padding_rows",
                                          "Rows a graphed batch computed beyond its real tokens (up to its graph's size).",
                                          registry=r)
        self.cuda_graph_live = Gauge("bert_cuda_graph_live",
                                     "Per CUDA graph of the encoder (tokens x slots[:depth]): 1 if it replays, 0 if "
                                     "the start-up check made its batches run eagerly.", ["graph"], registry=r,
                                     multiprocess_mode="max")  # only the engine sets it
        self.flops = Counter("bert_model_flops", "Encoder FLOPs of the batches computed.", registry=r)
        self.flops_padding = Counter("bert_model_flops_padding", "The part of bert_model_flops spent on padding.",
                                     registry=r)

    def observe_batch(self, seconds: float, batch) -> None:
        """One computed batch (anything with size, real_tokens, padded_tokens, flops, padding_flops)."""
        self.inference_seconds.observe(seconds)
        self.batch_sequences.observe(batch.size)
        self.batch_tokens.observe(batch.real_tokens)
        self.batch_padding.observe(batch.padding_flops / batch.flops)
        self.items_computed.inc(batch.size)
        self.tokens_real.inc(batch.real_tokens)
        self.tokens_padded.inc(batch.padded_tokens)
        self.flops.inc(batch.flops)
        self.flops_padding.inc(batch.padding_flops)
        graph_rows = getattr(batch, "graph_rows", 0)  # an engine without CUDA graphs has none
        if graph_rows:
            self.batches_graphed.inc()
            self.graph_padding_rows.inc(graph_rows - batch.real_tokens)

    def observe_graphs(self, live: list[str], eager: list[str]) -> None:
        """Which CUDA graphs start-up kept (1) and which fell back to eager (0)."""
        for name in live:
            self.cuda_graph_live.labels(graph=name).set(1)
        for name in eager:
            self.cuda_graph_live.labels(graph=name).set(0)

    def render(self) -> bytes:
        if os.environ.get(MULTIPROCESS_DIR):
            summed = CollectorRegistry()
            multiprocess.MultiProcessCollector(summed)
            return generate_latest(summed)
        return generate_latest(self.registry)
