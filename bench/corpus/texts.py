"""The benchmark's corpus: WikiText-2's test split and a slice of the shared Wikipedia text, as sentences, written
to one plain-text file (one document a line), the input every system reads.

Sentences of 4 to 100 words: every system then embeds whole inputs (all-MiniLM-L6-v2's sentence-transformers
recipe cuts at 256 word pieces, ours at the model's 512: inputs longer than both would make the systems do
different work)."""

from __future__ import annotations

import itertools
from pathlib import Path

from devkit.paths import WIKIPEDIA_DIR, WIKITEXT_TEST

WIKIPEDIA_FILE = "enwiki-2021-recent.txt.xz"  # the newer, shorter articles: what an index ingests day to day
MIN_WORDS, MAX_WORDS = 4, 100


def _kept(sentences) -> list[str]:
    return [s for s in sentences if MIN_WORDS <= len(s.split()) <= MAX_WORDS and "\n" not in s]


def wikitext_sentences(limit: int | None = None) -> list[str]:
    from trainer.data.corpus import read_documents

    found = _kept(s for d in read_documents(WIKITEXT_TEST) for s in d.sentences)
    return found[:limit] if limit is not None else found


def wikipedia_sentences(count: int, directory: Path = WIKIPEDIA_DIR) -> list[str]:
    """The first `count` sentences of the Wikipedia slice (streamed: the file is 54 MB of text)."""
    from trainer.data.corpus import documents

    if count <= 0:
        return []
    path = directory / WIKIPEDIA_FILE
    if not path.is_file():
        raise SystemExit(f"{path}: not found (the shared Wikipedia text; --wikipedia-sentences 0 leaves it out)")
    stream = (s for d in documents(path) for s in _kept(d.sentences))
    return list(itertools.islice(stream, count))


def write_corpus(path: Path, texts: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    return path
