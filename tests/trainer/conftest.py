from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import transformers

from devkit.paths import REPO_ROOT
from tests.conftest import random_model


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


def encoder_directory(directory: Path, tokenizer, kind: str = "BertModel", seed: int = 3) -> Path:
    """A directory as `transformers` writes it for BertModel / BertForMaskedLM (random weights, our vocabulary),
    with a sentence-transformers-style model card naming its licence."""
    source = random_model(tokenizer.vocab_size, seed=seed)
    config = transformers.BertConfig(**source.config.to_dict())
    model = getattr(transformers, kind)(config)
    model.load_state_dict(source.state_dict(), strict=False)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save(directory)
    (directory / "README.md").write_text("---\nlanguage: en\nlicense: apache-2.0\n---\n# an encoder\n")
    return directory


def run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=300)
