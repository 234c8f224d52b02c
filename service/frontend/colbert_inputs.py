"""Queries and documents -> ColBERT items, token for token as the model's own encoder makes them (PyLate's
`ColBERT.tokenize` and `encode`, colbert-ai's QueryTokenizer and DocTokenizer; model.late_interaction has the rule):

    query:    [CLS] [Q] pieces [SEP] [MASK] ... [MASK]   cut, then filled to query_length; every token gives a vector
    document: [CLS] [D] pieces [SEP]                     at most document_length; skiplist tokens give none

A query is cut to its length as both encoders cut it (its length is part of the model). A document longer than
`document_length` is refused unless the request truncates it (as the encoders do) or chunks it: then it is read in
overlapping windows of that length, each marked as a document, and their vectors together are the document's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from model.late_interaction import LateInteraction
from model.tokenizer import WordPieceTokenizer
from service.errors import ServiceError
from service.frontend.token_windows import window_overlap, window_starts
from service.tasks import LateInteractionItem

Mode = Literal["query", "document"]
LongInput = Literal["refuse", "truncate", "chunk"]


@dataclass(frozen=True)
class ColbertTokens:
    """A ColBERT's recipe in its tokenizer's ids."""

    recipe: LateInteraction
    tokenizer: WordPieceTokenizer
    query_marker: int | None  # None: the recipe puts no marker
    document_marker: int | None
    skiplist: frozenset[int]

    @classmethod
    def of(cls, tokenizer: WordPieceTokenizer, recipe: LateInteraction) -> ColbertTokens:
        """The markers are tokens of `tokenizer` (model.checkpoint_files checks it when it reads the recipe)."""
        def marker(text: str) -> int | None:
            return tokenizer.token_to_id(text) if text else None
        # As PyLate's convert_tokens_to_ids (and colbert-ai's first piece of each symbol): unknown words read as [UNK].
        found = [tokenizer.token_to_id(word) for word in recipe.skiplist_words]
        skiplist = frozenset(tokenizer.unk_id if token is None else token for token in found)
        return cls(recipe, tokenizer, marker(recipe.query_prefix), marker(recipe.document_prefix), skiplist)

    def head(self, mode: Mode) -> list[int]:
        marker = self.query_marker if mode == "query" else self.document_marker
        return [self.tokenizer.cls_id] + ([marker] if marker is not None else [])

    def room(self, mode: Mode) -> int:
        """Pieces of text one query or document window holds."""
        length = self.recipe.query_length if mode == "query" else self.recipe.document_length
        return length - len(self.head(mode)) - 1


@dataclass
class ColbertInput:
    """One text's items (one, or a long document's windows) and the tokens its vectors belong to."""

    items: list[LateInteractionItem]
    tokens: list[str]  # of every vector, in order
    length: int  # the text's tokens as the model reads it (markers and [SEP] of each window included)


def colbert_inputs(colbert: ColbertTokens, texts: list[str], mode: Mode, long_input: LongInput, overlap: int,
                   field: str) -> list[ColbertInput]:
    tokenizer = colbert.tokenizer
    # [CLS] pieces [SEP] as the tokenizer makes them (its fast path for plain text), without the two specials.
    pieces = [e.ids[1:-1] for e in tokenizer.encode_batch(texts)]
    return [colbert_input(colbert, ids, mode, long_input, overlap, f"{field}[{index}]" if field != "query" else field)
            for index, ids in enumerate(pieces)]


def colbert_input(colbert: ColbertTokens, pieces: list[int], mode: Mode, long_input: LongInput, overlap: int,
                  where: str) -> ColbertInput:
    """One text's items from its word pieces (no [CLS]/[SEP]); `where` names it in errors. The corpus job calls this
    on texts it tokenized itself."""
    if mode == "query":
        return _query(colbert, pieces, where)
    return _document(colbert, pieces, long_input, overlap, where)


def vectors_per_text(made: list[ColbertInput], results: list) -> list[np.ndarray]:
    """Each text's vectors from its items' `TokenVectors`, in the items' order: its windows' together."""
    out, at = [], 0
    for m in made:
        parts = [r.vectors for r in results[at : at + len(m.items)]]
        out.append(parts[0] if len(parts) == 1 else np.concatenate(parts))
        at += len(m.items)
    return out


def _query(colbert: ColbertTokens, pieces: list[int], where: str) -> ColbertInput:
    if all(piece in colbert.skiplist for piece in pieces):
        raise ServiceError("validation", f"{where} holds only skiplist tokens (punctuation): nothing to match",
                           param=where.split("[")[0])
    recipe = colbert.recipe
    ids = colbert.head("query") + pieces[: colbert.room("query")] + [colbert.tokenizer.sep_id]
    read = len(ids)
    if recipe.do_query_expansion:
        ids += [colbert.tokenizer.mask_id] * (recipe.query_length - len(ids))
    keys = None if recipe.attend_to_expansion_tokens or read == len(ids) else read
    item = LateInteractionItem(ids, [0] * len(ids), keys=keys)
    return ColbertInput([item], _token_texts(colbert, ids), len(ids))


def _document(colbert: ColbertTokens, pieces: list[int], long_input: LongInput, overlap: int, where: str
              ) -> ColbertInput:
    room = colbert.room("document")
    if len(pieces) > room and long_input == "refuse":
        length = len(colbert.head("document")) + len(pieces) + 1
        raise ServiceError("validation", f"{where} is {length} tokens long; this ColBERT reads documents of at most "
                                         f"{colbert.recipe.document_length} (send truncate: true to cut it as the "
                                         "model's encoder does, or long_input: chunk to read it in windows)",
                           param=where.split("[")[0])
    spans = [(0, min(len(pieces), room))] if long_input != "chunk" else \
        window_starts(len(pieces), room, window_overlap(room, overlap))
    items, tokens = [], []
    for start, stop in spans:
        ids = colbert.head("document") + pieces[start:stop] + [colbert.tokenizer.sep_id]
        kept = [position for position, token in enumerate(ids) if token not in colbert.skiplist]
        items.append(LateInteractionItem(ids, [0] * len(ids), kept=kept if len(kept) < len(ids) else None))
        tokens += _token_texts(colbert, [ids[p] for p in kept])
    return ColbertInput(items, tokens, sum(len(item) for item in items))


def _token_texts(colbert: ColbertTokens, ids: list[int]) -> list[str]:
    vocab = colbert.tokenizer.vocab
    return [vocab[i] for i in ids]
