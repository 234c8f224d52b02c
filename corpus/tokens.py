"""A work unit's rows -> the token ids the engine embeds, one sequence per output row, and the rows refused.

Without chunking each document is one sequence, tokenized as /embed tokenizes it (the checkpoint's default prompt
before it, cut to the model's length under --truncate; too long without it: a rejected row). With chunking each
document is one sequence per chunk (corpus.chunks), each a row of its own with its index and character span.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from corpus.errors import Rejected
from corpus.readers import Document

TOO_LONG = "is {length} tokens long; the model takes at most {limit} (--truncate cuts it, --chunk-tokens splits it)"


@dataclass
class Tokenized:
    unit: object  # the WorkUnit these rows belong to
    ids: list[str]  # each output row's id (with chunks: its document's id)
    token_ids: list[list[int]]  # each output row's sequence, [CLS] ... [SEP]
    tokens: list[int]  # len(token_ids[i])
    spans: tuple[list[int], list[int], list[int]] | None  # chunked: (chunk index, char_start, char_end) per output row
    rejects: list[Rejected]
    documents: int  # input rows embedded (each gives one or more output rows)


def prompt_pieces(tokenizer, prompt: str) -> list[int]:
    """The word pieces of the checkpoint's prompt, put after [CLS] of every chunk (as /embed puts its text first)."""
    return list(tokenizer.pieces([prompt])[0].ids) if prompt else []


def tokenize_unit(unit, rows: Iterable, tokenizer, prompt: str, truncate: bool, chunk_tokens: int | None,
                  chunk_overlap: int) -> Tokenized:
    documents: list[Document] = []
    rejects: list[Rejected] = []
    for row in rows:
        (rejects if isinstance(row, Rejected) else documents).append(row)
    if chunk_tokens is None:
        return _whole(unit, documents, rejects, tokenizer, prompt, truncate)
    return _chunked(unit, documents, rejects, tokenizer, prompt, chunk_tokens, chunk_overlap)


def _whole(unit, documents: list[Document], rejects: list[Rejected], tokenizer, prompt: str,
           truncate: bool) -> Tokenized:
    encoded = tokenizer.encode_batch([prompt + d.text for d in documents], truncate=truncate)
    limit = tokenizer.model_max_length
    ids, token_ids = [], []
    for document, encoding in zip(documents, encoded):
        if len(encoding.ids) > limit:
            rejects.append(Rejected(document.source, document.row, document.doc_id,
                                    TOO_LONG.format(length=len(encoding.ids), limit=limit)))
            continue
        ids.append(document.doc_id)
        token_ids.append(encoding.ids)
    rejects.sort(key=lambda r: r.row)
    return Tokenized(unit, ids, token_ids, [len(t) for t in token_ids], None, rejects, len(ids))


def _chunked(unit, documents: list[Document], rejects: list[Rejected], tokenizer, prompt: str, chunk_tokens: int,
             chunk_overlap: int) -> Tokenized:
    from corpus import chunks as chunking

    texts = [d.text for d in documents]
    batched = getattr(chunking, "chunk_documents", None)
    per_document = batched(texts, tokenizer, chunk_tokens, chunk_overlap) if batched else \
        [chunking.chunk_document(text, tokenizer, chunk_tokens, chunk_overlap) for text in texts]
    before = prompt_pieces(tokenizer, prompt)
    ids, token_ids, indices, starts, ends = [], [], [], [], []
    embedded = 0
    for document, found in zip(documents, per_document):
        if not found:
            rejects.append(Rejected(document.source, document.row, document.doc_id, "the text has no tokens"))
            continue
        embedded += 1
        for chunk in found:
            ids.append(document.doc_id)
            token_ids.append([chunk.token_ids[0], *before, *chunk.token_ids[1:]] if before else chunk.token_ids)
            indices.append(chunk.index)
            starts.append(chunk.char_start)
            ends.append(chunk.char_end)
    rejects.sort(key=lambda r: r.row)
    return Tokenized(unit, ids, token_ids, [len(t) for t in token_ids], (indices, starts, ends), rejects, embedded)
