"""A work unit's rows -> the token ids the engine embeds, one sequence per output row, and the rows refused.

Without chunking each document is one sequence, tokenized as /embed tokenizes it (the checkpoint's default prompt
before it, cut to the model's length under --truncate; too long without it: a rejected row, unless --long-input chunk
has the engine read it in windows: corpus.long_inputs). With chunking each document is one sequence per chunk
(corpus.chunks), each a row of its own with its index and character span. A --multi-vector job's documents are
tokenized for its ColBERT (corpus.multi_vector).
"""

from __future__ import annotations

from collections.abc import Iterable

from corpus.errors import Rejected
from corpus.readers import Document
from corpus.tokenized import Tokenized, TokenRule

TOO_LONG = ("is {length} tokens long; the model takes at most {limit} (--truncate cuts it, --chunk-tokens splits it "
            "into rows, --long-input chunk reads it whole in windows)")


def prompt_pieces(tokenizer, prompt: str) -> list[int]:
    """The word pieces of the checkpoint's prompt, put after [CLS] of every chunk (as /embed puts its text first)."""
    return list(tokenizer.pieces([prompt])[0].ids) if prompt else []


def token_rule(settings, files) -> TokenRule:
    """The rule for the job `settings` (JobSettings) on the checkpoint `files` (model.checkpoint_files, no weights)."""
    colbert = None
    if settings.multi_vector and files.late_interaction is not None:
        from service.frontend.colbert_inputs import ColbertTokens

        colbert = ColbertTokens.of(files.tokenizer, files.late_interaction)
    prompt = "" if colbert else dict(files.pooling.prompts).get(files.pooling.default_prompt_name, "")
    return TokenRule(files.tokenizer, prompt, settings.truncate, settings.chunk_tokens, settings.chunk_overlap,
                     settings.long_input, colbert, settings.vector_mode)


def tokenize_unit(unit, rows: Iterable, rule: TokenRule) -> Tokenized:
    documents: list[Document] = []
    rejects: list[Rejected] = []
    for row in rows:
        (rejects if isinstance(row, Rejected) else documents).append(row)
    if rule.colbert is not None:
        from corpus.multi_vector import tokenize_for_colbert

        return tokenize_for_colbert(unit, documents, rejects, rule)
    if rule.chunk_tokens is None:
        return _whole(unit, documents, rejects, rule)
    return _chunked(unit, documents, rejects, rule.tokenizer, rule.prompt, rule.chunk_tokens, rule.chunk_overlap)


def _whole(unit, documents: list[Document], rejects: list[Rejected], rule: TokenRule) -> Tokenized:
    tokenizer = rule.tokenizer
    encoded = tokenizer.encode_batch([rule.prompt + d.text for d in documents], truncate=rule.truncate)
    limit = tokenizer.model_max_length
    ids, token_ids = [], []
    for document, encoding in zip(documents, encoded):
        if len(encoding.ids) > limit and rule.long_input != "chunk":
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
