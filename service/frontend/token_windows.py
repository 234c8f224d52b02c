"""Texts longer than the model's window, cut into overlapping windows the way `tokenizers` cuts them when
transformers' pipelines ask for overflowing tokens with a stride: the question-answering pipeline's context
windows (`doc_stride`) and the token-classification pipeline's (`stride`). The same cut matters: the answer a
window holds depends on where it starts.

`tokenizers`' rule (`Encoding::truncate`): windows of `room` pieces starting every `room - stride` pieces,
the last one the first that reaches the end.
"""

from __future__ import annotations

from dataclasses import dataclass

from model.tokenizer import TextPieces
from service.errors import ServiceError


def window_starts(length: int, room: int, stride: int) -> list[tuple[int, int]]:
    """(start, stop) of each window over `length` pieces: one window when they fit in `room`."""
    if length <= room:
        return [(0, length)]
    spans, start = [], 0
    while True:
        stop = min(start + room, length)
        spans.append((start, stop))
        if stop == length:
            return spans
        start += room - stride


def window_overlap(room: int, overlap: int) -> int:
    """Pieces shared by consecutive windows of `room` pieces: the setting, at most half a window (each window then
    moves on by at least half of itself)."""
    return min(overlap, room // 2)


@dataclass
class Window:
    """One window of a text (or of a question's context) as the model reads it."""

    input_ids: list[int]
    token_type_ids: list[int]
    first: int  # the token index where the text's pieces begin ([CLS] q [SEP] before them)
    start: int  # the first piece of the text in this window
    stop: int  # ... and one past the last


def text_windows(pieces: TextPieces, cls_id: int, sep_id: int, max_length: int, stride: int | None,
                 field: str) -> list[Window]:
    """[CLS] piece... [SEP] windows of a text for token classification; without `stride`, a text that does not fit
    is refused (the pipeline would cut it silently)."""
    room = max_length - 2
    if len(pieces.ids) > room and stride is None:
        raise ServiceError("validation", f"{field} is {len(pieces.ids) + 2} tokens long; the model takes at most "
                                         f"{max_length}: send stride (with an aggregation_strategy other than none) "
                                         "to split it into overlapping windows", param=field)
    if stride is not None and not 0 <= stride < room:
        raise ServiceError("validation", f"stride must be between 0 and {room - 1} (the model's window of "
                                         f"{max_length} tokens less [CLS] and [SEP]), got {stride}", param="stride")
    return [Window([cls_id, *pieces.ids[start:stop], sep_id], [0] * (stop - start + 2), 1, start, stop)
            for start, stop in window_starts(len(pieces.ids), room, stride or 0)]


def pair_windows(question: TextPieces, context: TextPieces, cls_id: int, sep_id: int, max_seq_len: int,
                 doc_stride: int) -> list[Window]:
    """[CLS] question [SEP] context window [SEP] windows ("only_second" truncation with a stride): the question
    whole in each, the context in overlapping windows."""
    room = max_seq_len - len(question.ids) - 3
    if room < 1 or (len(context.ids) > room and doc_stride >= room):
        raise ServiceError("validation", f"the question is {len(question.ids)} tokens long, which leaves "
                                         f"{max(room, 0)} of max_seq_len {max_seq_len} for each window of the context: "
                                         f"too few for doc_stride {doc_stride} (send a shorter question, a larger "
                                         "max_seq_len or a smaller doc_stride)", param="question")
    head = [cls_id, *question.ids, sep_id]
    return [Window(head + context.ids[start:stop] + [sep_id], [0] * len(head) + [1] * (stop - start + 1), len(head),
                   start, stop)
            for start, stop in window_starts(len(context.ids), room, doc_stride)]
