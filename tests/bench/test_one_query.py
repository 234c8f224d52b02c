"""bench.serving.one_query's judgement: the ratio table and the verdict on each of the issue's targets come from
the cells measured, and a target whose load was not measured says so rather than passing or failing."""

from __future__ import annotations

from bench.serving.one_query import PEER, Cell, ratio_table, verdicts


def cell(system: str, concurrency: int, per_request: int, rate: float, latency_ms: float) -> Cell:
    return Cell("m", system, "load generator", concurrency, per_request, [latency_ms / 1000] * 10,
                sequences=int(rate * 10), seconds=10.0)


def cells(ours_rates: dict, peer_rate: float = 100.0, ours_ms: float = 5.0, peer_ms: float = 6.0) -> list[Cell]:
    out = []
    for (concurrency, per_request), rate in ours_rates.items():
        out.append(cell("service:int8", concurrency, per_request, rate, ours_ms))
        out.append(cell(PEER, concurrency, per_request, peer_rate, peer_ms))
    return out


def test_every_target_met():
    measured = cells({(1, 1): 130, (4, 1): 125, (16, 1): 150, (64, 1): 200, (16, 8): 260})
    assert verdicts(measured, "m") == [
        "- ≥ 1.2× at 1 and 4 clients: met", "- ≥ 1× at every load up to 64: met", "- ≥ 2.5× at 16 × 8: met",
        "- p50 at 1 client ≤ Infinity's: met", "- p99 at 4 clients ≤ Infinity's: met"]


def test_a_miss_is_named_and_an_unmeasured_load_is_not_judged():
    measured = cells({(1, 1): 130, (4, 1): 95}, ours_ms=7.0)
    assert verdicts(measured, "m") == [
        "- ≥ 1.2× at 1 and 4 clients: **not met**", "- ≥ 1× at every load up to 64: **not met**",
        "- ≥ 2.5× at 16 × 8: not measured in this run", "- p50 at 1 client ≤ Infinity's: **not met**",
        "- p99 at 4 clients ≤ Infinity's: **not met**"]


def test_the_table_shows_the_ratio_and_both_latencies():
    lines = ratio_table(cells({(4, 1): 150}), "m", ["int8"], [(4, 1)], ["load generator"])
    assert lines[-1] == "| 4 | load generator | 150 | 100 | **1.50×** | 5.0 / 6.0 | 5.0 / 6.0 |  |"
