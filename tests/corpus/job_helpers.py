"""What the corpus job's tests share: a small corpus of real sentences, the CLI run in-process or as a process, and
the output read back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from devkit.paths import REPO_ROOT
from tests.conftest import wikitext_lines


def sentences(count: int, chars: int = 160) -> list[str]:
    """`count` WikiText-2 lines cut to at most `chars` characters (within the tiny model's 128 positions)."""
    lines = wikitext_lines("valid")
    return [lines[i % len(lines)][:chars] for i in range(count)]


def write_jsonl(path: Path, texts: list[str], ids: bool = True) -> Path:
    with open(path, "w", encoding="utf-8") as handle:
        for index, text in enumerate(texts):
            handle.write(json.dumps({"id": f"doc-{index}", "text": text} if ids else {"text": text}) + "\n")
    return path


def embed_args(source: Path, output: Path, checkpoint: Path, *extra: str) -> list[str]:
    return ["embed", str(source), "--output", str(output), "--checkpoint", str(checkpoint), *extra]


def run_cli(args: list[str], env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m corpus ARGS` in a process of its own, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "corpus", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def finished_job(output: Path, source: Path, checkpoint: Path, *options: str) -> Path:
    """`python -m corpus embed SOURCE --output OUTPUT OPTIONS` run to its end, never stopped: what a resumed job is
    held to."""
    done = run_cli(embed_args(source, output, checkpoint, *options))
    assert done.returncode == 0, done.stderr
    return output


def kill_at(point: str, args: list[str], marker: Path, env: dict | None = None) -> None:
    """`python -m corpus ARGS` started through tests/corpus/paused_job.py, run until it stands still at `point`, then
    killed with SIGKILL, as a crash or a power cut would stop it."""
    process = subprocess.Popen([sys.executable, "-m", "tests.corpus.paused_job", point, str(marker), *args],
                               cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, **(env or {})})
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert process.poll() is None, f"the job ended before {point}: {process.stderr.read()}"
        assert time.monotonic() < deadline, f"the job never reached {point}"
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    process.stderr.close()
    marker.unlink()


def read_output(output: Path) -> dict[str, object]:
    """All shards' columns, concatenated in shard-name order: {"id": [...], "embedding": (n, d) array, ...}."""
    tables = [pq.read_table(path) for path in sorted((output / "shards").glob("part-*.parquet"))]
    found: dict[str, object] = {}
    for name in tables[0].column_names:
        values = [v for table in tables for v in table.column(name).to_pylist()]
        found[name] = np.asarray(values, dtype=np.float32) if name == "embedding" else values
    return found


def read_vectors(output) -> tuple[list[str], list[np.ndarray], list[int]]:
    """Each row's id, vectors (one array per row: a --multi-vector row's (vectors, dim), else (dim,)) and tokens, in
    shard-name order."""
    tables = [pq.read_table(path) for path in sorted((output / "shards").glob("part-*.parquet"))]
    ids = [v for t in tables for v in t.column("id").to_pylist()]
    vectors = [np.asarray(v, dtype=np.float32) for t in tables for v in t.column("embedding").to_pylist()]
    return ids, vectors, [v for t in tables for v in t.column("tokens").to_pylist()]


def manifest(output: Path) -> dict:
    return json.loads((output / "manifest.json").read_text(encoding="utf-8"))
