"""A question-answering head's start and end logits -> answers, as transformers 4.x's `question-answering`
pipeline chooses them (the reference for extractive QA; transformers 5 removed the pipeline).

Per window: tokens outside the context ([CLS] aside) get -10000 before the softmax of start and end logits;
a span's score is P(start) x P(end), over spans with start <= end < start + max_answer_len; the [CLS] pair's
score is the window's "no answer" score, and [CLS] is then zeroed. The best `top_k * 2 + 10` spans of each
window (`top_k` without `align_to_words`) become character spans of the context, widened to whole words when
`align_to_words`; spans of the same text (ignoring case) add their scores. With `handle_impossible_answer`,
the empty answer competes with the lowest "no answer" score of any window. The `top_k` best win.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.tokenizer import TextPieces
from service.frontend.token_windows import Window

NO_CONTEXT = -10000.0


@dataclass(frozen=True)
class AnswerOptions:
    top_k: int = 1
    max_answer_len: int = 15
    handle_impossible_answer: bool = False
    align_to_words: bool = True


def _best_spans(start: np.ndarray, end: np.ndarray, allowed: np.ndarray, top_k: int, max_answer_len: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(starts, ends, scores) of a window's best spans in token indices, and its "no answer" score."""
    start = np.where(allowed, start, NO_CONTEXT)
    end = np.where(allowed, end, NO_CONTEXT)
    start = np.exp(start - start.max())
    start = start / start.sum()
    end = np.exp(end - end.max())
    end = end / end.sum()
    null = float(start[0] * end[0])
    start[0] = end[0] = 0.0
    candidates = np.tril(np.triu(np.outer(start, end)), max_answer_len - 1)  # (L, L): start <= end < start + len
    flat = candidates.ravel()
    if top_k == 1:
        order = np.array([np.argmax(flat)])
    elif len(flat) < top_k:
        order = np.argsort(-flat)
    else:
        chosen = np.argpartition(-flat, top_k)[:top_k]
        order = chosen[np.argsort(-flat[chosen])]
    starts, ends = np.unravel_index(order, candidates.shape)
    keep = allowed[starts] & allowed[ends]
    starts, ends = starts[keep], ends[keep]
    return starts, ends, candidates[starts, ends], null


def _characters(context: TextPieces, window: Window, token: int, align_to_words: bool, side: int) -> int:
    """The character where the answer starts (side 0) or ends (side 1) for window token `token`: the edge of its
    word (the word's pieces within this window) or of the piece itself; [CLS] is at 0."""
    if token < window.first:
        return 0  # [CLS]: what the pipeline's offsets say for it
    piece = window.start + token - window.first
    word = context.words[piece]
    if not align_to_words or word is None:
        return context.offsets[piece][side]
    same = [n for n in range(window.start, window.stop) if context.words[n] == word]
    return context.offsets[same[0]][0] if side == 0 else context.offsets[same[-1]][1]


def answers(context_text: str, context: TextPieces, windows: list[Window], starts: list[np.ndarray],
            ends: list[np.ndarray], options: AnswerOptions) -> list[dict]:
    """The best answers, best first (at most top_k), from each window's (L,) start and end logits."""
    found: list[dict] = []
    null = 1_000_000.0  # large and positive: the lowest window's "no answer" score replaces it
    per_window = options.top_k * 2 + 10 if options.align_to_words else options.top_k
    for window, start_logits, end_logits in zip(windows, starts, ends):
        allowed = np.zeros(len(window.input_ids), dtype=bool)
        allowed[0] = True  # [CLS] stays: its pair is the "no answer" score
        allowed[window.first : window.first + window.stop - window.start] = True
        span_starts, span_ends, scores, window_null = _best_spans(
            start_logits.astype(np.float32), end_logits.astype(np.float32), allowed, per_window, options.max_answer_len)
        if options.handle_impossible_answer:
            null = min(null, window_null)
        for s, e, score in zip(span_starts.tolist(), span_ends.tolist(), scores.tolist()):
            begin = _characters(context, window, s, options.align_to_words, 0)
            finish = _characters(context, window, e, options.align_to_words, 1)
            text = context_text[begin:finish]
            same = next((a for a in found if a["answer"].lower() == text.lower()), None)
            if same is not None:
                same["score"] += score
            else:
                found.append({"score": score, "start": begin, "end": finish, "answer": text})
    if options.handle_impossible_answer:
        found.append({"score": null, "start": 0, "end": 0, "answer": ""})
    return sorted(found, key=lambda a: a["score"], reverse=True)[: options.top_k]
