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
