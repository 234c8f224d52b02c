"""Long documents cut into chunks of word pieces, each with the exact characters it covers, as retrieval indexes
need (one vector per chunk, pointing back at its place in the document).

Chunks end at word boundaries: a chunk holds at most `chunk_tokens` word pieces and never splits a word (only a
single word longer than `chunk_tokens` pieces is cut inside), and the next chunk starts at the earliest word
that keeps the overlap within `overlap` pieces. So `text[char_start:char_end]` is the chunk's text, and encoding
that text alone gives the chunk's token ids: a chunk's vector is the vector /embed gives for its text."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from model.tokenizer import TextPieces, WordPieceTokenizer


@dataclass(frozen=True)
class Chunk:
    index: int  # 0-based within the document
    char_start: int  # text[char_start:char_end] is the chunk's text
    char_end: int
    token_ids: list[int]  # with [CLS] and [SEP], ready for the engine (len <= chunk_tokens + 2)


def check_chunking(chunk_tokens: int, overlap: int, model_max_length: int | None = None) -> None:
    """Refuse settings that cannot make chunks, naming the flag."""
    if chunk_tokens <= 0:
        raise ValueError(f"--chunk-tokens must be positive, not {chunk_tokens}")
    if model_max_length is not None and chunk_tokens + 2 > model_max_length:
        raise ValueError(f"--chunk-tokens {chunk_tokens} plus [CLS] and [SEP] exceeds the model's "
                         f"{model_max_length} positions: use at most {model_max_length - 2}")
    if not 0 <= overlap < chunk_tokens:
        raise ValueError(f"--chunk-overlap must be at least 0 and less than --chunk-tokens ({chunk_tokens}), "
                         f"not {overlap}")


def _word_starts(pieces: TextPieces) -> list[bool]:
    """Where a new word begins, piece by piece (the pre-tokenizer's words: whitespace and punctuation split)."""
    words = pieces.words
    return [i == 0 or words[i] is None or words[i] != words[i - 1] for i in range(len(words))]


def _window_end(starts: list[bool], start: int, chunk_tokens: int) -> int:
    """Where a chunk that begins at piece `start` ends: at most chunk_tokens pieces, backed off to a word start,
    unless the window holds part of a single word longer than itself (then that word is cut)."""
    stop = min(start + chunk_tokens, len(starts))
    if stop == len(starts):
        return stop
    boundary = next((i for i in range(stop, start, -1) if starts[i]), None)
    return boundary if boundary is not None else stop


def _windows(starts: list[bool], chunk_tokens: int, overlap: int) -> list[tuple[int, int]]:
    """[start, stop) piece ranges of the chunks."""
    windows, start = [], 0
    while True:
        stop = _window_end(starts, start, chunk_tokens)
        windows.append((start, stop))
        if stop >= len(starts):
            return windows
        # The earliest word start that shares at most `overlap` pieces with this chunk and whose own chunk
        # reaches past this one (else a long word ahead would make chunk after chunk of the same few words).
        lowest = max(stop - overlap, start + 1)
        following = next((i for i in range(lowest, stop)
                          if starts[i] and _window_end(starts, i, chunk_tokens) > stop), None)
        start = following if following is not None else (stop if starts[stop] else lowest)


def _chunks(text: str, pieces: TextPieces, tokenizer: WordPieceTokenizer, chunk_tokens: int,
            overlap: int) -> list[Chunk]:
    if not pieces.ids:
        return [Chunk(0, 0, 0, [tokenizer.cls_id, tokenizer.sep_id])]
    chunks = []
    for index, (start, stop) in enumerate(_windows(_word_starts(pieces), chunk_tokens, overlap)):
        ids = [tokenizer.cls_id, *pieces.ids[start:stop], tokenizer.sep_id]
        chunks.append(Chunk(index, pieces.offsets[start][0], pieces.offsets[stop - 1][1], ids))
    return chunks


def chunk_documents(texts: Sequence[str], tokenizer: WordPieceTokenizer, chunk_tokens: int,
                    overlap: int) -> list[list[Chunk]]:
    """The chunks of each text; the texts are tokenized as one batch (the tokenizer's threads share it)."""
    check_chunking(chunk_tokens, overlap, tokenizer.model_max_length)
    return [_chunks(text, pieces, tokenizer, chunk_tokens, overlap)
            for text, pieces in zip(texts, tokenizer.pieces(list(texts)))]


def chunk_document(text: str, tokenizer: WordPieceTokenizer, chunk_tokens: int, overlap: int) -> list[Chunk]:
    """A short text is one chunk; a text with no word pieces is one chunk of [CLS] [SEP] at (0, 0)."""
    return chunk_documents([text], tokenizer, chunk_tokens, overlap)[0]
