"""Tokenized corpora (cached) and next-sentence pre-training pairs.

Pairs follow the original BERT data pipeline (`create_instances_from_document`): sentences are
accumulated into a chunk until it reaches the target length, the chunk is cut into segment A and B
at a random sentence boundary, and half of the time B is replaced by text from a *different*
document. Pairs longer than the limit are truncated (longest segment first), never dropped.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from model.tokenizer import WordPieceTokenizer
from trainer.corpus import Document


@dataclass
class TokenizedCorpus:
    """All word-piece ids in one flat array; sentence and document boundaries as offsets."""

    ids: np.ndarray  # (total_tokens,) int32
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

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        arrays = {"ids": self.ids, "sentence_offsets": self.sentence_offsets, "document_offsets": self.document_offsets}
        save_file(arrays, str(tmp))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> "TokenizedCorpus | None":
        try:
            arrays = load_file(str(path))
            return cls(arrays["ids"], arrays["sentence_offsets"], arrays["document_offsets"])
        except (SafetensorError, OSError, KeyError, ValueError):
            return None  # a damaged cache is rebuilt, not trusted


def tokenize(documents: list[Document], tokenizer: WordPieceTokenizer, batch: int = 4096) -> TokenizedCorpus:
    sentences = [s for d in documents for s in d.sentences]
    pieces: list[list[int]] = []
    for start in range(0, len(sentences), batch):
        pieces.extend(tokenizer.tokenize_words(sentences[start : start + batch]))
    # Sentences that tokenize to nothing (stray punctuation lost in cleaning) carry no signal.
    lengths, doc_counts, flat = [], [], []
    cursor = 0
    for document in documents:
        kept = 0
        for ids in pieces[cursor : cursor + len(document.sentences)]:
            if ids:
                lengths.append(len(ids))
                flat.extend(ids)
                kept += 1
        cursor += len(document.sentences)
        if kept:
            doc_counts.append(kept)
    return TokenizedCorpus(
        ids=np.asarray(flat, dtype=np.int32),
        sentence_offsets=np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]),
        document_offsets=np.concatenate([[0], np.cumsum(doc_counts, dtype=np.int64)]),
    )


def tokenize_cached(documents_loader, tokenizer: WordPieceTokenizer, cache_path: Path) -> TokenizedCorpus:
    """Tokenize once per (corpus checksum, tokenizer) and reuse: a second run starts in seconds."""
    if cache_path.is_file():
        cached = TokenizedCorpus.load(cache_path)
        if cached is not None:
            return cached
    corpus = tokenize(documents_loader(), tokenizer)
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    corpus.save(cache_path)
    return corpus


@dataclass
class PairExample:
    segment_a: np.ndarray
    segment_b: np.ndarray
    is_random_next: bool  # NSP label 1; label 0 means "B follows A" (Hugging Face order)


def truncate_pair(a: list[int], b: list[int], max_tokens: int, rng: random.Random) -> None:
    """Trim the longer segment, from the front or the back at random, until the pair fits."""
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def build_pairs(
    corpus: TokenizedCorpus, max_seq_len: int, seed: int, short_seq_prob: float = 0.1
) -> list[PairExample]:
    """One pass of pre-training pairs over every document; a new `seed` draws new pairs."""
    if corpus.num_documents < 2:
        raise ValueError("next-sentence pairs need at least two documents in the corpus")
    rng = random.Random(seed)
    max_tokens = max_seq_len - 3  # [CLS] A [SEP] B [SEP]
    examples: list[PairExample] = []
    for doc in range(corpus.num_documents):
        sentences = corpus.document_sentences(doc)
        target = max_tokens if rng.random() >= short_seq_prob else rng.randint(2, max_tokens)
        chunk: list[int] = []
        length = 0
        i = sentences.start
        while i < sentences.stop:
            chunk.append(i)
            length += len(corpus.sentence(i))
            if i == sentences.stop - 1 or length >= target:
                a_end = 1 if len(chunk) < 2 else rng.randint(1, len(chunk) - 1)
                a = [t for s in chunk[:a_end] for t in corpus.sentence(s).tolist()]
                if len(chunk) == 1 or rng.random() < 0.5:
                    b = _random_segment(corpus, doc, max(1, target - len(a)), rng)
                    is_random = True
                    i -= len(chunk) - a_end  # the unused sentences start the next chunk
                else:
                    b = [t for s in chunk[a_end:] for t in corpus.sentence(s).tolist()]
                    is_random = False
                truncate_pair(a, b, max_tokens, rng)
                if a and b:
                    examples.append(PairExample(np.asarray(a, np.int32), np.asarray(b, np.int32), is_random))
                chunk, length = [], 0
                target = max_tokens if rng.random() >= short_seq_prob else rng.randint(2, max_tokens)
            i += 1
    return examples


def _random_segment(corpus: TokenizedCorpus, exclude_doc: int, target: int, rng: random.Random) -> list[int]:
    other = rng.randrange(corpus.num_documents - 1)
    other += other >= exclude_doc  # uniform over the other documents
    sentences = corpus.document_sentences(other)
    out: list[int] = []
    for s in range(rng.randrange(sentences.start, sentences.stop), sentences.stop):
        out.extend(corpus.sentence(s).tolist())
        if len(out) >= target:
            break
    return out


@dataclass
class PairBatch:
    input_ids: torch.Tensor  # (B, T) int64
    token_type_ids: torch.Tensor  # (B, T)
    attention_mask: torch.Tensor  # (B, T)
    special_mask: torch.Tensor  # (B, T) bool: [CLS], [SEP], padding: never masked
    nsp_labels: torch.Tensor  # (B,)

    def slice(self, start: int, stop: int) -> "PairBatch":
        return PairBatch(*(t[start:stop] for t in (self.input_ids, self.token_type_ids, self.attention_mask,
                                                    self.special_mask, self.nsp_labels)))

    @property
    def num_real_tokens(self) -> int:
        return int(self.attention_mask.sum())


def collate(examples: list[PairExample], tokenizer: WordPieceTokenizer) -> PairBatch:
    width = max(len(e.segment_a) + len(e.segment_b) + 3 for e in examples)
    batch = len(examples)
    ids = np.full((batch, width), tokenizer.pad_id, dtype=np.int64)
    types = np.zeros((batch, width), dtype=np.int64)
    attention = np.zeros((batch, width), dtype=np.int64)
    special = np.ones((batch, width), dtype=bool)
    for row, e in enumerate(examples):
        la, lb = len(e.segment_a), len(e.segment_b)
        ids[row, 0] = tokenizer.cls_id
        ids[row, 1 : 1 + la] = e.segment_a
        ids[row, 1 + la] = tokenizer.sep_id
        ids[row, 2 + la : 2 + la + lb] = e.segment_b
        ids[row, 2 + la + lb] = tokenizer.sep_id
        types[row, 2 + la : 3 + la + lb] = 1
        attention[row, : 3 + la + lb] = 1
        special[row, 1 : 1 + la] = False
        special[row, 2 + la : 2 + la + lb] = False
    # Word pieces that are themselves special ([UNK] from the corpus) are never masked either.
    special |= np.isin(ids, list(tokenizer.special_ids - {tokenizer.unk_id}))
    labels = np.asarray([int(e.is_random_next) for e in examples], dtype=np.int64)
    return PairBatch(
        torch.from_numpy(ids), torch.from_numpy(types), torch.from_numpy(attention),
        torch.from_numpy(special), torch.from_numpy(labels),
    )
