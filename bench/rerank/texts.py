"""The benchmark's text: passages of about 100 words from WikiText-2's test split (held out from every model here),
queries that each point at one passage, and one long document made of whole articles."""

from __future__ import annotations

from devkit.paths import WIKITEXT_TEST

PASSAGE_WORDS = 100


def _documents() -> list[list[str]]:
    from trainer.data.corpus import read_documents

    return [[s for s in d.sentences if len(s.split()) >= 4] for d in read_documents(WIKITEXT_TEST)]


def passages(count: int, words: int = PASSAGE_WORDS) -> list[str]:
    """`count` passages of consecutive sentences of one article, each the first to reach `words` words and at most a
    third longer (so that every passage fits a ColBERT's usual document length, 180 tokens, whole)."""
    found = []
    for sentences in _documents():
        passage: list[str] = []
        for sentence in sentences:
            passage.append(sentence)
            length = sum(len(s.split()) for s in passage)
            if length >= words:
                if length <= words * 4 // 3:
                    found.append(" ".join(passage))
                passage = []
                if len(found) == count:
                    return found
    raise SystemExit(f"{WIKITEXT_TEST}: fewer than {count} passages of {words} words")


def queries(passages_: list[str], count: int) -> list[str]:
    """Queries of six words taken from the middle of the first sentence of passages 0, 1, ...: each has a passage
    that answers it, among others that share its vocabulary."""
    found = []
    for passage in passages_[:count]:
        words = passage.split()
        start = max(0, min(len(words) - 6, 4))
        found.append(" ".join(words[start : start + 6]))
    return found


def long_document(words: int) -> str:
    """Whole articles, one after another, cut at the sentence that reaches `words` words."""
    kept: list[str] = []
    total = 0
    for sentences in _documents():
        for sentence in sentences:
            kept.append(sentence)
            total += len(sentence.split())
            if total >= words:
                return " ".join(kept)
    raise SystemExit(f"{WIKITEXT_TEST}: fewer than {words} words")
