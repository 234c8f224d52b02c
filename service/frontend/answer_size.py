"""Bound the answer as well as the question: the size of the JSON a request would produce, estimated
from its counts once its inputs are tokenized (before any compute), against `max_response_mb`.

A 22 KB fill-mask request (64 inputs x 50 masks x top_k 100) would otherwise buy a 135 MB answer, and
/encode of 64 x 512 tokens without pooling some 160 MB: each costs the front end that much memory and
seconds of serialization, and the client as much to read. The estimates are upper-ish figures per
value of each answer shape (measured on the bundled model's answers); the refusal names the limit and
the request's own figures, so a client knows what to send instead.
"""

from __future__ import annotations

from service.errors import ServiceError

JSON_FLOAT_BYTES = 13  # a float32 as orjson writes it ("-0.012345678") with its comma
BASE64_FLOAT_BYTES = 16 / 3  # four bytes, base64-encoded
TOKEN_STRING_BYTES = 12  # a token's text in /encode's `tokens` list, quoted, with its comma
PREDICTION_BYTES = 80  # a fill-mask prediction's fields and punctuation, its sequence aside
SEQUENCE_BYTES_PER_TOKEN = 6  # a prediction's `sequence` (the input with the token in place), per input token
TOKEN_PIECE_BYTES = 64  # one /tokenize piece: {"id", "text", "special", "start", "stop"}
SPARSE_VALUE_BYTES = 44  # one /embed_sparse {"index", "value"} (the value a Python float)
ENTITY_BYTES = 110  # a token-classification entity's fields and punctuation, its word aside
ANSWER_BYTES = 80  # a question-answering answer's fields and punctuation, its text aside
MAX_PIECE_CHARS = 100  # the longest word a WordPiece vocabulary reads as pieces (longer ones are one [UNK])
MB = 1_000_000


def check(estimate: float, limit_mb: float, figures: str, advice: str) -> None:
    """422 when an answer estimated at `estimate` bytes is over `limit_mb`; `figures` says how it adds up."""
    if estimate > limit_mb * MB:
        raise ServiceError("validation", f"the answer to this request would be about {estimate / MB:.1f} MB "
                                         f"({figures}); the limit is {limit_mb:g} MB (max_response_mb): {advice}")


def check_vectors(token_counts: list[int], width: int, pooled: bool, base64: bool, limit_mb: float) -> None:
    """/encode, /embed, /embed_all, the OpenAI and root embeddings: a vector per input or per token."""
    tokens = sum(token_counts)
    rows = len(token_counts) if pooled else tokens
    float_bytes = BASE64_FLOAT_BYTES if base64 else JSON_FLOAT_BYTES
    estimate = rows * width * float_bytes + tokens * TOKEN_STRING_BYTES
    shape = f"{len(token_counts)} inputs x {width} floats" if pooled else \
        f"{len(token_counts)} inputs, {tokens} tokens x {width} floats"
    check(estimate, limit_mb, shape, "send fewer inputs or shorter ones, or pool the vectors")


def check_predictions(items: list[tuple[int, int, int]], limit_mb: float) -> None:
    """fill-mask: for each input (masks, tokens, k), k predictions per mask, each with its filled sequence."""
    masks = sum(m for m, _, _ in items)
    predictions = sum(m * k for m, _, k in items)
    estimate = sum(m * k * (PREDICTION_BYTES + SEQUENCE_BYTES_PER_TOKEN * length) for m, length, k in items)
    top_k = max(k for _, _, k in items)
    check(estimate, limit_mb, f"{len(items)} inputs, {masks} masks x top_k {top_k} = {predictions} predictions",
          "send fewer masks or inputs, or a smaller top_k")


def check_pieces(pieces: int, limit_mb: float) -> None:
    check(pieces * TOKEN_PIECE_BYTES, limit_mb, f"{pieces} tokens", "send fewer or shorter texts")


def check_sparse(values: int, limit_mb: float) -> None:
    check(values * SPARSE_VALUE_BYTES, limit_mb, f"{values} non-zero weights", "send fewer or shorter texts")


def check_entities(tokens: int, characters: int, limit_mb: float) -> None:
    """Token classification: at most an entity per token, whose words add up to at most the texts."""
    check(tokens * ENTITY_BYTES + characters, limit_mb, f"{tokens} tokens, {characters} characters",
          "send fewer or shorter texts")


def check_answers(context_chars: list[int], answers_per_input: int, max_answer_len: int, limit_mb: float) -> None:
    """Question answering: `answers_per_input` answers per input, each a span of at most `max_answer_len` tokens
    of its context."""
    longest = max_answer_len * MAX_PIECE_CHARS
    estimate = sum(answers_per_input * (ANSWER_BYTES + min(chars, longest)) for chars in context_chars)
    check(estimate, limit_mb, f"{len(context_chars)} inputs x {answers_per_input} answers",
          "send fewer inputs or a smaller top_k")
