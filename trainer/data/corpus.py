"""Reading a corpus as a stream of paragraphs and documents, in bounded memory.

Files may be plain, `.gz` or `.xz`. Two layouts are understood, per file:
- WikiText: one paragraph per line, articles start at ` = Title = ` lines (sections are
  ` = = Section = = `), rare words replaced by `<unk>`, numbers split as `1 @,@ 000`.
- Plain text: documents separated by blank lines. Inside a document each line is a paragraph, except
  that a line ending mid-sentence (hard-wrapped text) continues on the next.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import itertools
import lzma
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


from model.tokenizer import UNK, WIKITEXT_UNK

TEXT_SUFFIXES = (".txt", ".tokens", ".text", ".raw")
COMPRESSED_SUFFIXES = {".gz": gzip.open, ".xz": lzma.open}
_ARTICLE_HEADING = re.compile(r"^ ?= [^=].* = ?$")
_ANY_HEADING = re.compile(r"^ ?(= )+.*( =)+ ?$")
# WikiText splits "1,000" into "1 @,@ 000" and "well-known" into "well @-@ known".
_WIKITEXT_JOINERS = re.compile(r" ?@([-,.])@ ?")
# A line that ends like this ends its sentence; any other line of plain text is wrapped and continues.
_SENTENCE_END = re.compile(r"""[.!?:;"'”’)\]]\s*$""")
WIKITEXT_SNIFF_CHARS = 2_000_000


class CorpusError(ValueError):
    """The corpus cannot be used; the message names the path and the problem."""


@dataclass
class Document:
    source: str
    sentences: list[str]


@dataclass(frozen=True)
class Paragraph:
    text: str
    starts_document: bool  # the first paragraph of a new document


def _is_text_file(path: Path) -> bool:
    suffixes = [s.lower() for s in path.suffixes[-2:]]
    if suffixes and suffixes[-1] in COMPRESSED_SUFFIXES:
        suffixes = suffixes[:-1]
    return bool(suffixes) and suffixes[-1] in TEXT_SUFFIXES


def corpus_files(path: Path) -> list[Path]:
    if not path.exists():
        raise CorpusError(f"corpus {path}: no such file or directory")
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise CorpusError(f"corpus {path}: not a regular file or directory")
    files = sorted(p for p in path.rglob("*") if p.is_file() and _is_text_file(p))
    if not files:
        raise CorpusError(f"corpus {path}: directory holds no text files ({', '.join(TEXT_SUFFIXES)}, "
                          f"optionally {' or '.join(COMPRESSED_SUFFIXES)})")
    return files


def checksum(files: list[Path]) -> str:
    """A hash of the files' names and bytes (as stored, compressed or not): the cache key of a corpus."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0")
        file_digest = hashlib.sha256()
        try:
            with path.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    file_digest.update(block)
        except OSError as exc:
            raise _read_error(path, exc) from None
        digest.update(file_digest.digest())
    return digest.hexdigest()[:16]


def _read_error(path: Path, exc: BaseException) -> CorpusError:
    if isinstance(exc, PermissionError):
        return CorpusError(f"corpus file {path}: permission denied")
    if isinstance(exc, UnicodeDecodeError):
        return CorpusError(f"corpus file {path}: not UTF-8 text (bad byte {exc.object[exc.start:exc.start + 1]!r})")
    if isinstance(exc, (lzma.LZMAError, gzip.BadGzipFile, EOFError, zlib.error)):
        return CorpusError(f"corpus file {path}: damaged or not a {path.suffix} file ({exc})")
    return CorpusError(f"corpus file {path}: cannot be read ({getattr(exc, 'strerror', None) or exc})")


def _lines(path: Path) -> Iterator[str]:
    """The file's lines, decompressed and decoded as they are read; errors name the file."""
    opener = COMPRESSED_SUFFIXES.get(path.suffix.lower())
    try:
        raw = opener(path, "rb") if opener else path.open("rb")
        with io.TextIOWrapper(raw, encoding="utf-8", errors="strict", newline=None) as text:
            yield from text
    except (OSError, UnicodeDecodeError, lzma.LZMAError, EOFError, zlib.error) as exc:
        raise _read_error(path, exc) from None


def is_wikitext(head: str) -> bool:
    return any(_ARTICLE_HEADING.match(line) for line in head[:200_000].splitlines()) and WIKITEXT_UNK in head


def clean_wikitext(line: str) -> str:
    line = _WIKITEXT_JOINERS.sub(r"\1", line.strip())
    # One [UNK] token for the marker, under our tokenizer and transformers' alike.
    return line.replace(WIKITEXT_UNK, UNK)


def _wikitext_paragraphs(lines: Iterator[str]) -> Iterator[Paragraph]:
    new_document = True
    for raw in lines:
        if _ARTICLE_HEADING.match(raw.rstrip("\n")):
            new_document = True
        elif raw.strip() and not _ANY_HEADING.match(raw.rstrip("\n")):
            yield Paragraph(clean_wikitext(raw), new_document)
            new_document = False


def _plain_paragraphs(lines: Iterator[str]) -> Iterator[Paragraph]:
    new_document = True
    pending: list[str] = []
    for raw in lines:
        line = raw.strip()
        if not line:  # a blank line ends the document
            if pending:
                yield Paragraph(" ".join(pending), new_document)
                pending = []
            new_document = True
            continue
        pending.append(line)
        if _SENTENCE_END.search(line):
            yield Paragraph(" ".join(pending), new_document)
            pending, new_document = [], False
    if pending:
        yield Paragraph(" ".join(pending), new_document)


def file_paragraphs(path: Path) -> Iterator[Paragraph]:
    """Every paragraph of one corpus file, streamed (memory does not grow with the file)."""
    lines = _lines(path)
    head_lines: list[str] = []
    size = 0
    for line in lines:  # sniff the layout from the first ~2M characters
        head_lines.append(line)
        size += len(line)
        if size >= WIKITEXT_SNIFF_CHARS:
            break
    reader = _wikitext_paragraphs if is_wikitext("".join(head_lines)) else _plain_paragraphs
    yield from reader(itertools.chain(head_lines, lines))


def paragraphs(path: str | Path) -> Iterator[Paragraph]:
    """Every paragraph of a corpus file or directory; each file starts a new document."""
    for file in corpus_files(Path(path)):
        first = True
        for paragraph in file_paragraphs(file):
            yield Paragraph(paragraph.text, True) if first else paragraph
            first = False


class SentenceSplitter:
    """Rule-based splitting (pysbd: abbreviations, decimals, initials, quotes), not just on ' . '."""

    def __init__(self) -> None:
        import pysbd  # here: a run on a prepared corpus (trainer.data.prepared) splits nothing, and may lack pysbd

        self._segmenter = pysbd.Segmenter(language="en", clean=False)

    def __call__(self, paragraph: str) -> list[str]:
        return [s.strip() for s in self._segmenter.segment(paragraph) if s.strip()]


def documents(path: str | Path, split: SentenceSplitter | None = None) -> Iterator[Document]:
    """Documents of sentences, split here in this process (`trainer.data.sentences` does it on every core)."""
    split = split or SentenceSplitter()
    current: Document | None = None
    for paragraph in paragraphs(path):
        if paragraph.starts_document:
            if current is not None and current.sentences:
                yield current
            current = Document(str(path), [])
        current.sentences.extend(split(paragraph.text))
    if current is not None and current.sentences:
        yield current


def read_documents(path: str | Path) -> list[Document]:
    """All documents of a small corpus in memory (tests, benchmarks); training streams instead."""
    found = list(documents(path))
    if not found:
        raise CorpusError(f"corpus {path}: no text found (empty or whitespace only)")
    return found
