"""Stage 2 of corpus preparation: sentences -> token ids in memory-mapped files on disk.

A token cache is a directory:
  ids.bin            every word piece of the corpus back to back (uint16, or int32 for vocabularies over 65,535)
  sentences.bin      int64 offsets into ids: sentence i is ids[sentences[i]:sentences[i + 1]]
  documents.bin      int64 offsets into sentences, the same way
  meta.json          dtype and lengths (written last: a cache without it is incomplete)
Training reads it through np.memmap, so the corpus never has to fit in memory; it is written in
batches of sentences through the `tokenizers` batch API, which uses every core.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from model.tokenizer import WordPieceTokenizer
from trainer.data.sentences import read_sentence_file

TOKENIZE_BATCH = 20_000  # sentences per call into the tokenizer


@dataclass
class TokenizedCorpus:
    """All word-piece ids in one flat array; sentence and document boundaries as offsets."""

    ids: np.ndarray  # (total_tokens,) uint16 or int32, often a read-only memmap
    sentence_offsets: np.ndarray  # (sentences + 1,) int64 into ids
    document_offsets: np.ndarray  # (documents + 1,) int64 into sentences

    @property
    def num_documents(self) -> int:
        return len(self.document_offsets) - 1

    @property
    def num_tokens(self) -> int:
        return len(self.ids)

    def sentence(self, index: int) -> np.ndarray:
        return self.ids[self.sentence_offsets[index] : self.sentence_offsets[index + 1]]

    def document_sentences(self, doc: int) -> range:
        return range(int(self.document_offsets[doc]), int(self.document_offsets[doc + 1]))

    def documents(self, first: int, end: int) -> TokenizedCorpus:
        """Documents first..end-1 as a corpus of their own (its ids a view of these, not a copy)."""
        s0, s1 = int(self.document_offsets[first]), int(self.document_offsets[end])
        t0, t1 = int(self.sentence_offsets[s0]), int(self.sentence_offsets[s1])
        return TokenizedCorpus(ids=self.ids[t0:t1], sentence_offsets=self.sentence_offsets[s0 : s1 + 1] - t0,
                               document_offsets=self.document_offsets[first : end + 1] - s0)

    @classmethod
    def from_documents(cls, documents: Iterable[list[str]], tokenizer: WordPieceTokenizer) -> TokenizedCorpus:
        """In memory, for small corpora (tests, the evaluation text)."""
        writer = _Arrays()
        for batch in _sentence_batches(documents, TOKENIZE_BATCH):
            writer.add(batch, tokenizer)
        return writer.finish()

    @classmethod
    def load(cls, directory: Path) -> TokenizedCorpus | None:
        """The cache at `directory`, memory-mapped; None when it is absent or incomplete (then it is rebuilt)."""
        try:
            meta = json.loads((directory / "meta.json").read_text())
            ids = np.memmap(directory / "ids.bin", dtype=meta["dtype"], mode="r", shape=(meta["tokens"],))
            sentences = np.fromfile(directory / "sentences.bin", dtype=np.int64)
            documents = np.fromfile(directory / "documents.bin", dtype=np.int64)
        except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError):
            return None
        if len(sentences) != meta["sentences"] + 1 or len(documents) != meta["documents"] + 1:
            return None
        return cls(ids, sentences, documents)


def _sentence_batches(documents: Iterable[list[str]], size: int) -> Iterator[list[list[str]]]:
    """Whole documents grouped until a batch holds about `size` sentences."""
    batch: list[list[str]] = []
    count = 0
    for document in documents:
        batch.append(document)
        count += len(document)
        if count >= size:
            yield batch
            batch, count = [], 0
    if batch:
        yield batch


class _Arrays:
    """Tokenized documents appended to the three arrays, kept in memory or written to open files."""

    NAMES = ("ids", "sentences", "documents")

    def __init__(self, directory: Path | None = None, dtype: str = "int32"):
        self.dtype = np.dtype(dtype)
        self.counts = {"tokens": 0, "sentences": 0, "documents": 0}
        start = np.zeros(1, np.int64)  # offsets begin at 0
        self.parts: dict[str, list[np.ndarray]] = {"ids": [], "sentences": [start], "documents": [start]}
        self.files = None if directory is None else {name: open(directory / f"{name}.bin", "wb") for name in self.NAMES}
        if self.files is not None:
            for name in ("sentences", "documents"):
                self.files[name].write(self.parts[name].pop().tobytes())

    def add(self, documents: list[list[str]], tokenizer: WordPieceTokenizer) -> None:
        pieces = tokenizer.tokenize_words([s for d in documents for s in d])
        lengths, doc_sizes, ids = [], [], []
        cursor = 0
        for document in documents:
            kept = [piece for piece in pieces[cursor : cursor + len(document)] if piece]
            cursor += len(document)
            if kept:  # a sentence that tokenizes to nothing (stray punctuation) carries no signal
                lengths.extend(len(piece) for piece in kept)
                ids.extend(token for piece in kept for token in piece)
                doc_sizes.append(len(kept))
        arrays = {
            "ids": np.asarray(ids, dtype=self.dtype),
            "sentences": self.counts["tokens"] + np.cumsum(lengths, dtype=np.int64),
            "documents": self.counts["sentences"] + np.cumsum(doc_sizes, dtype=np.int64),
        }
        self.counts["tokens"] += len(ids)
        self.counts["sentences"] += len(lengths)
        self.counts["documents"] += len(doc_sizes)
        for name, array in arrays.items():
            if self.files is None:
                self.parts[name].append(array)
            else:
                self.files[name].write(array.tobytes())

    def finish(self) -> TokenizedCorpus:
        ids, sentences, documents = (np.concatenate(self.parts[name]) if self.parts[name] else
                                     np.zeros(0, self.dtype) for name in self.NAMES)
        return TokenizedCorpus(ids, sentences, documents)

    def close(self) -> dict:
        for handle in self.files.values():
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
        return {"dtype": self.dtype.name, **self.counts}


def ids_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= np.iinfo(np.uint16).max + 1 else "int32"


def build_token_cache(sentence_file: Path, tokenizer: WordPieceTokenizer, directory: Path) -> TokenizedCorpus:
    """Tokenize a sentence file into a cache directory (atomically) and open it."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.with_name(f".{directory.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        writer = _Arrays(tmp, ids_dtype(tokenizer.vocab_size))
        for batch in _sentence_batches(read_sentence_file(sentence_file), TOKENIZE_BATCH):
            writer.add(batch, tokenizer)
        meta = writer.close()
        (tmp / "meta.json").write_text(json.dumps(meta))
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    corpus = TokenizedCorpus.load(directory)
    if corpus is None:
        raise OSError(f"token cache {directory} could not be read back after writing it")
    return corpus


def sample_sentences(sentence_files: list[Path], limit: int, seed: int = 0) -> list[str]:
    """A uniform sample of at most `limit` sentences from all the files (reservoir sampling: one pass,
    memory bounded by `limit`), for training a vocabulary without reading a large corpus into memory."""
    rng = random.Random(seed)
    sample: list[str] = []
    seen = 0
    for path in sentence_files:
        for document in read_sentence_file(path):
            for sentence in document:
                seen += 1
                if len(sample) < limit:
                    sample.append(sentence)
                else:
                    slot = rng.randrange(seen)
                    if slot < limit:
                        sample[slot] = sentence
    return sample
