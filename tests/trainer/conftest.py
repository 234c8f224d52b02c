from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import WIKITEXT_DIR


def small_wikitext(path: Path, lines: int = 400) -> Path:
    """The first articles of WikiText-2's validation split, kept in WikiText format."""
    source = (WIKITEXT_DIR / "wiki.valid.tokens").read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text("".join(source[:lines]), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> Path:
    return small_wikitext(tmp_path_factory.mktemp("corpus") / "small.tokens")


@pytest.fixture(scope="session")
def small_eval_corpus(tmp_path_factory) -> Path:
    source = (WIKITEXT_DIR / "wiki.test.tokens").read_text(encoding="utf-8").splitlines(keepends=True)
    path = tmp_path_factory.mktemp("corpus") / "eval.tokens"
    path.write_text("".join(source[:200]), encoding="utf-8")
    return path


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
