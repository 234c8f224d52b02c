"""Next-sentence pre-training pairs, drawn from token caches in bounded memory, and their batches.

Pairs follow the original BERT data pipeline (`create_instances_from_document`): a document's
sentences are grouped into chunks of about the target length; a chunk is cut into segment A and B at
a random sentence boundary, and half of the time B is replaced by text from a *different* document.
Pairs longer than the limit are truncated (longest segment first), never dropped.

Training draws chunks in a seeded random order, one pass over each source after another
(`TrainingPairs`): the batch of step N depends only on the seed and the per-source positions, which a
checkpoint saves, so a resumed run continues exactly; nothing but the current order of chunk indices
is held in memory.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch

from model.tokenizer import WordPieceTokenizer
from trainer.data.tokens import TokenizedCorpus


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


def chunk_starts(corpus: TokenizedCorpus, max_tokens: int) -> np.ndarray:
    """First sentence of every chunk, plus the end sentinel: chunk i is sentences [starts[i], starts[i + 1]),
    and a training pair starts at each chunk's first sentence.

    A chunk holds the sentences of one document whose first token falls in the same stretch of
    `max_tokens` tokens of that document, so chunks are about `max_tokens` long and never cross documents.
    """
    offsets = corpus.sentence_offsets
    sentences_per_doc = np.diff(corpus.document_offsets)
    doc_first_sentence = np.repeat(corpus.document_offsets[:-1], sentences_per_doc)
    within_doc = offsets[:-1] - offsets[doc_first_sentence]
    stretch = within_doc // max_tokens
    is_start = np.ones(len(stretch), dtype=bool)
    is_start[1:] = (stretch[1:] != stretch[:-1]) | (doc_first_sentence[1:] != doc_first_sentence[:-1])
    return np.append(np.flatnonzero(is_start), len(stretch)).astype(np.int64)


def pair_from_chunk(corpus: TokenizedCorpus, first: int, max_tokens: int, short_seq_prob: float,
                    rng: random.Random) -> PairExample | None:
    """One pair starting at sentence `first` (a chunk start); None when a segment came out empty.

    The pair takes the document's sentences from `first` until the target length, so it may run into
    the next chunk: a chunk whose first sentence is long still yields a real next sentence.
    """
    target = max_tokens if rng.random() >= short_seq_prob else rng.randint(2, max_tokens)
    offsets = corpus.sentence_offsets
    doc = int(np.searchsorted(corpus.document_offsets, first, side="right")) - 1
    doc_end = int(corpus.document_offsets[doc + 1])
    stop = first + 1
    while stop < doc_end and offsets[stop] - offsets[first] < target:
        stop += 1
    if stop - first == 1 and stop < doc_end:
        stop += 1  # a sentence as long as the target still gets its real next one (the pair is truncated)
    a_end = first + 1 if stop - first < 2 else rng.randint(first + 1, stop - 1)
    a = corpus.ids[offsets[first] : offsets[a_end]].tolist()
    if stop - first == 1 or rng.random() < 0.5:
        b = _random_segment(corpus, doc, max(1, target - len(a)), rng)
        is_random = True
    else:
        b = corpus.ids[offsets[a_end] : offsets[stop]].tolist()
        is_random = False
    truncate_pair(a, b, max_tokens, rng)
    if not (a and b):
        return None
    return PairExample(np.asarray(a, np.int32), np.asarray(b, np.int32), is_random)


def build_pairs(corpus: TokenizedCorpus, max_seq_len: int, seed: int, short_seq_prob: float = 0.1) -> list[PairExample]:
    """One pair per chunk, in corpus order (the fixed evaluation pairs); a new `seed` draws new pairs."""
    if corpus.num_documents < 2:
        raise ValueError("next-sentence pairs need at least two documents in the corpus")
    rng = random.Random(seed)
    max_tokens = max_seq_len - 3  # [CLS] A [SEP] B [SEP]
    starts = chunk_starts(corpus, max_tokens)
    pairs = (pair_from_chunk(corpus, int(first), max_tokens, short_seq_prob, rng) for first in starts[:-1])
    return [p for p in pairs if p is not None]


def _random_segment(corpus: TokenizedCorpus, exclude_doc: int, target: int, rng: random.Random) -> list[int]:
    other = rng.randrange(corpus.num_documents - 1)
    other += other >= exclude_doc  # uniform over the other documents
    sentences = corpus.document_sentences(other)
    start = rng.randrange(sentences.start, sentences.stop)
    offsets = corpus.sentence_offsets
    stop = start + 1
    while stop < sentences.stop and offsets[stop] - offsets[start] < target:
        stop += 1
    return corpus.ids[offsets[start] : offsets[stop]].tolist()


class TrainingPairs:
    """Training pairs from one or more token caches, mixed by weight, in bounded memory.

    Each source is read in passes; a pass visits every chunk once in a seeded random order. Each
    sequence of a batch comes from a source drawn with probability proportional to its weight (by
    default its number of chunks, so every source is read at the same pace). `cursors[k]` =
    [passes done, chunks taken in this pass] of source k is all the state there is.
    """

    def __init__(self, sources: list[TokenizedCorpus], max_seq_len: int, seed: int, short_seq_prob: float = 0.1,
                 weights: list[float] | None = None):
        for index, corpus in enumerate(sources):
            if corpus.num_documents < 2:
                raise ValueError(f"training source {index + 1} has {corpus.num_documents} document(s); "
                                 "next-sentence pairs need at least two")
        self.sources = sources
        self.max_tokens = max_seq_len - 3
        self.seed = seed
        self.short_seq_prob = short_seq_prob
        self.starts = [chunk_starts(c, self.max_tokens) for c in sources]
        sizes = np.asarray([len(s) - 1 for s in self.starts], dtype=np.float64)
        shares = sizes if weights is None else np.asarray(weights, dtype=np.float64)
        self.probabilities = shares / shares.sum()
        self._orders: dict[int, tuple[int, np.ndarray]] = {}
        # pair_from_chunk comes out empty only from an empty sentence (tokenization drops those) or a window of
        # under two tokens: where neither can happen, each of a step's draws takes exactly one chunk (`advance`).
        self._pairs_never_empty = self.max_tokens >= 2 and all(
            bool(np.all(np.diff(c.sentence_offsets) > 0)) for c in sources)

    @property
    def total_tokens(self) -> int:
        return sum(c.num_tokens for c in self.sources)

    def initial_cursors(self) -> list[list[int]]:
        return [[0, 0] for _ in self.sources]

    def _order(self, source: int, epoch: int) -> np.ndarray:
        """Source `source`'s chunk order in pass `epoch` (only each source's current pass is kept)."""
        cached = self._orders.get(source)
        if cached is None or cached[0] != epoch:
            order = np.random.default_rng([self.seed, source, epoch]).permutation(len(self.starts[source]) - 1)
            self._orders[source] = cached = (epoch, order)
        return cached[1]

    def _sources_drawn(self, step: int):
        """The draw of step `step`'s sources: `batch` and `advance` draw from the same stream, so they agree."""
        choose = np.random.default_rng([self.seed, step, 1])
        return lambda count: choose.choice(len(self.sources), size=count, p=self.probabilities)

    def _moved(self, source: int, cursor: list[int], taken: int) -> list[int]:
        """Source `source`'s cursor once `taken` more of its chunks are read (a pass that ends starts the next)."""
        passes, position = divmod(cursor[1] + taken, len(self.starts[source]) - 1)
        return [cursor[0] + passes, position]

    def batch(self, step: int, size: int, cursors: list[list[int]]) -> list[PairExample]:
        """The `size` pairs of optimizer step `step`; advances `cursors` in place."""
        draw = self._sources_drawn(step)
        examples: list[PairExample] = []
        while len(examples) < size:
            for source in draw(size - len(examples)):
                epoch, position = cursors[source]
                chunk = int(self._order(source, epoch)[position])
                cursors[source] = self._moved(source, cursors[source], 1)
                rng = random.Random(f"{self.seed}/{source}/{epoch}/{chunk}")
                pair = pair_from_chunk(self.sources[source], int(self.starts[source][chunk]), self.max_tokens,
                                       self.short_seq_prob, rng)
                if pair is not None:
                    examples.append(pair)
        return examples

    def advance(self, step: int, size: int, cursors: list[list[int]]) -> None:
        """Advance `cursors` in place as `batch(step, size, cursors)` would, without building the pairs: a worker
        process moves the cursors past the steps that other workers build. Where no pair can come out empty, the
        step's draws of sources are all there is to count; else the pairs are built and dropped."""
        if not self._pairs_never_empty:
            self.batch(step, size, cursors)
            return
        drawn = np.bincount(self._sources_drawn(step)(size), minlength=len(self.sources))
        for source, taken in enumerate(drawn.tolist()):
            cursors[source] = self._moved(source, cursors[source], taken)


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

    def padded_to(self, width: int, pad_id: int) -> "PairBatch":
        """The same pairs, padded on to `width` tokens (a step of fixed shapes)."""
        return PairBatch(pad_columns(self.input_ids, width, pad_id), pad_columns(self.token_type_ids, width, 0),
                         pad_columns(self.attention_mask, width, 0), pad_columns(self.special_mask, width, True),
                         self.nsp_labels)

    @property
    def num_real_tokens(self) -> int:
        return int(self.attention_mask.sum())


def pad_columns(rows: torch.Tensor, width: int, value) -> torch.Tensor:
    """(B, T) -> (B, width), new columns filled with `value`."""
    if width < rows.shape[1]:
        raise ValueError(f"pairs of {rows.shape[1]} tokens do not fit a width of {width}")
    return torch.cat((rows, rows.new_full((rows.shape[0], width - rows.shape[1]), value)), 1)


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
    # Word pieces that are themselves special are never masked either: [UNK] (WikiText's rare-word marker,
    # or a character the vocabulary lacks) stays in the input, but predicting it teaches nothing users ask for.
    special |= np.isin(ids, list(tokenizer.special_ids))
    labels = np.asarray([int(e.is_random_next) for e in examples], dtype=np.int64)
    return PairBatch(
        torch.from_numpy(ids), torch.from_numpy(types), torch.from_numpy(attention),
        torch.from_numpy(special), torch.from_numpy(labels),
    )
