"""`python -m bench.report --quick`: the benchmark report's code paths on CPU with tiny durations (the
figures of a quick run mean nothing; the full run is `make bench-report`). Every measurement, the plots and
the Markdown come out, and --write replaces only the generated part of BENCHMARKS.md."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.report.build import BEGIN, END, write_benchmarks
from devkit.paths import REPO_ROOT


# The quick report's subprocess has a limit of its own (900 s), spent in the first test's setup.
pytestmark = pytest.mark.timeout(960)


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    done = subprocess.run([sys.executable, "-m", "bench.report", "--quick", "--out", str(out), "--models", "bundled",
                           "--infinity", ""], cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return out, json.loads((out / "report.json").read_text())


def test_every_measurement_is_in_the_report(quick_report):
    _, report = quick_report
    ours = [r for r in report["headline"] if r["system"] == "ours"]
    assert [r["precision"] for r in ours] == ["int8"]
    assert all(r["seq_s"] > 0 and r["limit_seq_s"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"] for r in ours)
    assert any(r["system"].startswith("transformers") and r["seq_s"] > 0 for r in report["headline"])  # the peer
    assert {(r["system"], r["concurrency"]) for r in report["concurrency"]} == {
        (s, c) for s in ("service:int8", "naive") for c in (1, 4)}
    load = report["latency_vs_load"]
    assert load["capacity_rps"] > 0 and [s["fraction"] for s in load["steps"]] == [0.5, 2.0]
    assert load["steps"][1]["offered_rps"] > load["steps"][0]["offered_rps"]
    assert all(s["failed"] == 0 for s in load["steps"])  # only 200s and 429s
    precision = {r["variant"]: r for r in report["precision"]}
    assert precision["ours float32"]["cosine_mean"] > 0.9999 and precision["ours float32"]["seq_s"] > 0
    assert 0.99 < precision["ours int8 per-token-smooth a=0.65"]["cosine_mean"] <= 1.0001
    assert {(r["system"], r["tokens"]) for r in report["length"]} == {
        (s, n) for s in ("ours float32", "ours int8") for n in (16, 64)}
    assert report["machine"]["cores"] >= 1 and "bench.report" in report["machine"]["command"]
    assert str(quick_report[0]) not in report["machine"]["command"]  # the --out folder by its name alone


def test_the_report_command_names_no_machine_path(monkeypatch):
    """BENCHMARKS.md quotes the command: a peer's executable inside the checkout appears relative to it."""
    from bench.report.build import machine

    monkeypatch.setattr(sys, "argv", ["build.py", "--write", "--infinity",
                                      str(REPO_ROOT / ".venv-peers" / "bin" / "infinity_emb")])
    assert machine()["command"] == "python -m bench.report --write --infinity .venv-peers/bin/infinity_emb"


def test_plots_and_markdown(quick_report):
    out, _ = quick_report
    for name in ("throughput", "latency", "precision", "length"):
        data = (out / f"bench-{name}.png").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name
    text = (out / "report.md").read_text()
    assert "| model | server | precision | sentences/s | p50 ms | p99 ms | in-process limit | vs limit |" in text
    assert "| bundled | ours | int8 |" in text and "Not in this run: Infinity" in text
    assert "GPU figures (one H200, `python -m bench.gpu`) are in the section \"On a GPU\" below" in text
    assert all(f"bench-{n}.png" in text for n in ("throughput", "latency", "precision", "length"))


def test_write_replaces_only_the_generated_part(tmp_path):
    page = tmp_path / "BENCHMARKS.md"
    page.write_text(f"# Benchmarks\n\nintro\n\n{BEGIN}\nold table\n{END}\n\n## How to reproduce\n\nkept\n")
    write_benchmarks("new table", page)
    assert page.read_text() == f"# Benchmarks\n\nintro\n\n{BEGIN}\nnew table\n{END}\n\n## How to reproduce\n\nkept\n"
    bare = tmp_path / "bare.md"
    bare.write_text("# no markers\n")
    with pytest.raises(SystemExit, match="bare.md: the markers"):
        write_benchmarks("x", bare)
    assert bare.read_text() == "# no markers\n"  # untouched


def test_benchmarks_md_carries_the_markers_and_reads_in_a_minute():
    text = (REPO_ROOT / "BENCHMARKS.md").read_text()
    assert text.index(BEGIN) < text.index(END) < text.index("## How to reproduce")
    assert len(text.splitlines()) <= 250  # one table per area; the histories live in the git log
