"""Stage 1 of corpus preparation: paragraphs -> sentences, on every core, into a cache file.

Sentence splitting is the slow part of preparing a corpus (pysbd manages about 30k words/s on one
core of Wikipedia text), and it does not depend on the tokenizer, so it runs once per corpus and its
result is kept: `<cache>/sentences/v<N>-<checksum>.txt`, one sentence a line, a blank line between
documents. Tokenizers of any size are then trained and applied from that file (`trainer.data.tokens`).

Paragraphs are split one at a time (pysbd is much slower on a whole article passed as one string),
in worker processes fed in chunks. At most a few chunks per worker are in flight, so memory stays
bounded whatever the corpus size.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
import uuid
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from model.cpu_cores import usable_cores
from trainer.data.corpus import Paragraph, SentenceSplitter, paragraphs

log = logging.getLogger("trainer")
CHUNK_PARAGRAPHS = 500
IN_FLIGHT_PER_WORKER = 3
_splitter: SentenceSplitter | None = None


def _split_chunk(chunk: list[Paragraph]) -> list[tuple[bool, list[str]]]:
    global _splitter
    if _splitter is None:
        _splitter = SentenceSplitter()
    return [(p.starts_document, _splitter(p.text)) for p in chunk]


def _chunks(items: Iterable[Paragraph], size: int) -> Iterator[list[Paragraph]]:
    chunk: list[Paragraph] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def split_in_parallel(source: Iterable[Paragraph], workers: int) -> Iterator[tuple[bool, list[str]]]:
    """(starts a document, sentences) for each paragraph, in order; `workers` processes split."""
    if workers <= 1:
        for chunk in _chunks(source, CHUNK_PARAGRAPHS):
            yield from _split_chunk(chunk)
        return
    # spawn, not fork: the parent may hold torch's thread pools, which do not survive a fork.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        pending: deque = deque()
        for chunk in _chunks(source, CHUNK_PARAGRAPHS):
            pending.append(pool.submit(_split_chunk, chunk))
            if len(pending) >= workers * IN_FLIGHT_PER_WORKER:
                yield from pending.popleft().result()
        while pending:
            yield from pending.popleft().result()


def write_sentence_file(corpus: str | Path, target: Path, workers: int | None = None) -> dict:
    """Split `corpus` into `target` (written atomically); returns counts and speed."""
    workers = workers or usable_cores()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex[:8]}")
    started = last_report = time.perf_counter()
    words = sentences = documents = 0
    try:
        with open(tmp, "w", encoding="utf-8") as out:
            open_document = False
            for starts_document, split in split_in_parallel(paragraphs(corpus), workers):
                if starts_document and open_document:
                    out.write("\n")  # blank line: the document ends
                    open_document = False
                for sentence in split:
                    out.write(sentence.replace("\n", " ") + "\n")
                    words += sentence.count(" ") + 1
                    sentences += 1
                    if not open_document:
                        documents += 1
                        open_document = True
                now = time.perf_counter()
                if now - last_report > 30:
                    log.info("splitting %s: %.1fM words, %.0f words/s", corpus, words / 1e6, words / (now - started))
                    last_report = now
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    seconds = time.perf_counter() - started
    stats = {"words": words, "sentences": sentences, "documents": documents, "seconds": round(seconds, 1),
             "words_per_s": round(words / max(seconds, 1e-9)), "workers": workers}
    log.info("split %s: %s", corpus, stats)
    return stats


def read_sentence_file(path: Path) -> Iterator[list[str]]:
    """The documents of a sentence file, one list of sentences at a time."""
    document: list[str] = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = line.rstrip("\n")
            if line:
                document.append(line)
            elif document:
                yield document
                document = []
    if document:
        yield document
