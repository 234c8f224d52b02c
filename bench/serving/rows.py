"""The serving benchmark's rows (one system at one load, or the in-process limit) and their Markdown table; and the
table of a host-cost benchmark's parts (`parts_table`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Row:
    system: str
    concurrency: int
    requests: int
    seconds: float
    requests_per_s: float
    sequences_per_s: float
    tokens_per_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_batch: float | None = None
    padding: float | None = None
    vs_limit: float | None = None
    inputs_per_request: int = 1
    # Where a service row's time went, from its /metrics: the mean engine.run of a batch, launch to results (compare
    # the in-process limit's time per batch), engine.run's seconds per second of the row (up to the number of runners;
    # up to twice that on a GPU, where the next batch is launched before the last one's results are read), and the
    # mean wait of an input in the queue. A low busy share with short batches says the engine is starved upstream.
    batch_ms: float | None = None
    engine_busy: float | None = None
    queue_ms: float | None = None
    # CUDA graphs: the share of batches replayed as one, and the rows they added beyond the real tokens (per real token)
    graphed: float | None = None
    graph_padding: float | None = None
    # Where a request's time went inside the server: the front end's whole view of it (body read to answer) and, of
    # that, the engine's round trip (inputs handed over to results back: queue_ms, the batches and the hop between
    # processes); the client's own round trip less the first is the HTTP connection's and the client's.
    server_ms: float | None = None
    engine_round_trip_ms: float | None = None
    # Whether the engine's host work sets the pace (service/engine/interpreter_lag.py): the mean wait of its lag probe
    # for the interpreter, the cores its process kept busy and its busiest threads, and the front ends' cores in all.
    interpreter_lag_ms: float | None = None
    engine_cores: float | None = None
    engine_threads: str = ""
    front_end_cores: float | None = None
    arrangement: str = ""  # an in-process limit's best batch size and batches in parallel


def table(rows: list[Row]) -> str:
    head = ("| system | concurrency | inputs/request | req/s | seq/s | tokens/s | p50 ms | p95 ms | p99 ms | "
            "mean batch | padding | vs limit |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        fmt = lambda v, f: "–" if v is None else format(v, f)  # noqa: E731
        conc = f"– ({r.arrangement})" if r.concurrency == 0 else str(r.concurrency)
        lines.append(f"| {r.system} | {conc} | {r.inputs_per_request or '–'} | {r.requests_per_s:.1f} | "
                     f"{r.sequences_per_s:.1f} | {r.tokens_per_s:,.0f} | "
                     f"{fmt(r.p50_ms or None, '.1f')} | {fmt(r.p95_ms or None, '.1f')} | {fmt(r.p99_ms or None, '.1f')} | "
                     f"{fmt(r.mean_batch, '.1f')} | {fmt(r.padding, '.1%')} | {fmt(r.vs_limit, '.2f')} |")
    return "\n".join(lines)


def parts_table(parts: dict[str, float], unit: str, digits: int, json_path: Path | None) -> None:
    """Print a benchmark's parts, one `unit` figure each, as a Markdown table; and write them to `json_path` if given."""
    print(f"| part | {unit} |\n| --- | ---: |")
    for name, value in parts.items():
        print(f"| {name} | {value:,.{digits}f} |")
    if json_path is not None:
        json_path.write_text(json.dumps(parts, indent=1))
