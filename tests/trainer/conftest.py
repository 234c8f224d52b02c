from __future__ import annotations

from pathlib import Path


def tiny_run_args(corpus: Path, eval_corpus: Path, output: Path, cache: Path, **extra) -> list[str]:
    """CLI arguments for a run that takes seconds on a CPU."""
    values = {
        "--corpus": corpus, "--eval-corpus": eval_corpus, "--output": output, "--cache-dir": cache,
        "--preset": "tiny", "--vocab-size": 600, "--max-seq-len": 48, "--batch-size": 8, "--max-steps": 12,
        "--eval-every": 6, "--eval-examples": 32, "--log-every": 2, "--save-every": 4,
    }
    values.update(extra)
    args = []
    for key, value in values.items():
        args += [key] if value is True else [key, str(value)]
    return args + ["--no-progress"]
