"""bench.serving.several_models runs every row (quick form, without Infinity) and states each target's figures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from devkit.paths import REPO_ROOT


@pytest.mark.timeout(900)
def test_every_row_runs_and_each_target_is_stated(tmp_path):
    found = tmp_path / "several.json"
    result = subprocess.run([sys.executable, "-m", "bench.serving.several_models", "--quick", "--skip", "infinity",
                             "--gpu-express-lane-row", "--json", str(found)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=850)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(found.read_text())
    assert set(figures["alone_rss_mib"]) == {"embed", "bundled", "rerank"}
    assert all(value > 100 for value in figures["alone_rss_mib"].values())  # three real servers were measured
    together = figures["together"]
    assert together["embed_per_s"] > 0 and together["rerank_requests"] > 0 and 0 < together["rerank_device_share"] < 1
    assert together["interpreter_lag_ms"] >= 0 and figures["two_servers"]["interpreter_lag_ms"] >= 0
    assert figures["two_servers"]["embed_per_s"] > 0
    for row in ("rerank_alone", "together", "two_servers", "together_gpu_express_lane"):
        # where a reranker request's time went: each stage holds the next
        mixed = figures[row]
        assert mixed["rerank_client_ms"] >= mixed["rerank_server_ms"] >= mixed["rerank_engine_ms"] > 0, (row, mixed)
        assert mixed["rerank_queue_ms"] >= 0 and mixed["rerank_batch_ms"] > 0, (row, mixed)
    assert figures["embed_alone"]["rerank_client_ms"] is None  # no reranker there
    verdicts = "\n".join(figures["verdicts"])
    for words in ("memory:", "reranker p99 while the embedder is flooded", "interpreter lag", "embedder:",
                  "reranker's mean ms at the client", "with --gpu-express-lane", "against two servers"):
        assert words in verdicts
