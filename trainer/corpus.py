"""Reading a corpus into documents of sentences.

Two formats are understood, per file:
- WikiText: one paragraph per line, articles start at ` = Title = ` lines (sections are
  ` = = Section = = `), rare words replaced by `<unk>`, numbers split as `1 @,@ 000`.
- Plain text: documents separated by blank lines, any line layout inside a document.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pysbd

from model.tokenizer import UNK, WIKITEXT_UNK

TEXT_SUFFIXES = (".txt", ".tokens", ".text", ".raw")
_ARTICLE_HEADING = re.compile(r"^ ?= [^=].* = ?$")
_ANY_HEADING = re.compile(r"^ ?(= )+.*( =)+ ?$")
# WikiText splits "1,000" into "1 @,@ 000" and "well-known" into "well @-@ known".
_WIKITEXT_JOINERS = re.compile(r" ?@([-,.])@ ?")


class CorpusError(ValueError):
    """The corpus cannot be used; the message names the path and the problem."""


@dataclass
class Document:
    source: str
    sentences: list[str]


def corpus_files(path: Path) -> list[Path]:
    if not path.exists():
        raise CorpusError(f"corpus {path}: no such file or directory")
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise CorpusError(f"corpus {path}: not a regular file or directory")
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
    if not files:
        raise CorpusError(f"corpus {path}: directory holds no text files ({', '.join(TEXT_SUFFIXES)})")
    return files


def read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except PermissionError:
        raise CorpusError(f"corpus file {path}: permission denied") from None
    except OSError as exc:
        raise CorpusError(f"corpus file {path}: cannot be read ({exc.strerror})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorpusError(f"corpus file {path}: not UTF-8 text (bad byte at offset {exc.start})") from None


def checksum(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def is_wikitext(text: str) -> bool:
    head = text[:200_000].splitlines()
    return any(_ARTICLE_HEADING.match(line) for line in head) and WIKITEXT_UNK in text[:2_000_000]


def clean_wikitext(line: str) -> str:
    line = _WIKITEXT_JOINERS.sub(r"\1", line.strip())
    # One [UNK] token for the marker, under our tokenizer and transformers' alike.
    return line.replace(WIKITEXT_UNK, UNK)


class SentenceSplitter:
    """Rule-based splitting (pysbd: abbreviations, decimals, initials, quotes), not just on ' . '."""

    def __init__(self) -> None:
        self._segmenter = pysbd.Segmenter(language="en", clean=False)

    def __call__(self, paragraph: str) -> list[str]:
        return [s.strip() for s in self._segmenter.segment(paragraph) if s.strip()]


def _wikitext_documents(text: str, source: str, split: SentenceSplitter) -> Iterator[Document]:
    sentences: list[str] = []
    for raw in text.splitlines():
        if _ARTICLE_HEADING.match(raw):
            if sentences:
                yield Document(source, sentences)
            sentences = []
        elif raw.strip() and not _ANY_HEADING.match(raw):
            sentences.extend(split(clean_wikitext(raw)))
    if sentences:
        yield Document(source, sentences)


def _plain_documents(text: str, source: str, split: SentenceSplitter) -> Iterator[Document]:
    for block in re.split(r"\n\s*\n", text):
        paragraph = " ".join(line.strip() for line in block.splitlines() if line.strip())
        if paragraph:
            yield Document(source, split(paragraph))


def read_documents(path: str | Path) -> list[Document]:
    """All documents of a corpus file or directory, each a list of sentences."""
    split = SentenceSplitter()
    documents: list[Document] = []
    for file in corpus_files(Path(path)):
        text = read_text(file)
        reader = _wikitext_documents if is_wikitext(text) else _plain_documents
        documents.extend(d for d in reader(text, str(file), split) if d.sentences)
    if not documents:
        raise CorpusError(f"corpus {path}: no text found (empty or whitespace only)")
    return documents
