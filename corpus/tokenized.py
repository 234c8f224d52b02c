"""What the reader stage hands the engine stage: a unit's rows as token ids (`Tokenized`), and the rule that made them
(`TokenRule`). Plain data, shared by corpus.tokens and corpus.multi_vector."""

from __future__ import annotations

from dataclasses import dataclass

from corpus.errors import Rejected


@dataclass
class Tokenized:
    unit: object  # the WorkUnit these rows belong to
    ids: list[str]  # each output row's id (with chunks: its document's id)
    token_ids: list[list[int]]  # each output row's sequence, [CLS] ... [SEP]
    tokens: list[int]  # len(token_ids[i])
    spans: tuple[list[int], list[int], list[int]] | None  # chunked: (chunk index, char_start, char_end) per output row
    rejects: list[Rejected]
    documents: int  # input rows embedded (each gives one or more output rows)


@dataclass(frozen=True)
class TokenRule:
    """How a job's texts become sequences: the settings that decide it, with what the checkpoint's files give."""

    tokenizer: object  # model.tokenizer.WordPieceTokenizer
    prompt: str  # the checkpoint's default prompt, before each text (as /embed puts it); none for a ColBERT
    truncate: bool
    chunk_tokens: int | None
    chunk_overlap: int
    long_input: str  # refuse | chunk
    colbert: object | None = None  # --multi-vector: the ColBERT's tokens (service.frontend.colbert_inputs)
    mode: str = "document"  # --multi-vector: document | query
