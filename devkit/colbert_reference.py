"""PyLate and colbert-ai, run in their own environment (.venv-colbert-reference, requirements/colbert-reference.txt)
through tests/colbert_reference/drive.py: what the ColBERT tests and bench/rerank compare the service with."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile

from devkit.paths import REPO_ROOT

# Relative to the checkout (the Makefile passes a relative path); the driver runs in a scratch directory.
PYTHON = REPO_ROOT / os.environ.get("BERT_COLBERT_REFERENCE_PYTHON", ".venv-colbert-reference/bin/python")
DRIVER = REPO_ROOT / "tests" / "colbert_reference" / "drive.py"


class ReferenceError(RuntimeError):
    """The reference environment is missing or its run failed; the message says which."""


def run(commands: list[dict], timeout_s: float = 900, threads: int | None = None) -> dict:
    """{"results": one per command, "versions": {...}}; see tests/colbert_reference/drive.py for the commands."""
    if not PYTHON.is_file():
        raise ReferenceError(f"{PYTHON} is missing: `make test` installs requirements/colbert-reference.txt there")
    env = dict(os.environ)
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    with tempfile.TemporaryDirectory() as scratch:  # colbert-ai writes its run's folders under the working directory
        done = subprocess.run([str(PYTHON), str(DRIVER)], input=json.dumps({"commands": commands}),
                              capture_output=True, text=True, timeout=timeout_s, cwd=scratch, env=env)
    if done.returncode != 0:
        raise ReferenceError(f"the reference failed: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # the libraries print their own lines before it
