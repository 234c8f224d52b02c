"""Token classification and extractive question answering over the front door: texts -> windows -> items for
the batcher (`TokenClassifyItem`, `QaItem`, batched with every other route's under the token budget) -> the
pipelines' answers (`service.frontend.entities`, `service.frontend.answers`). Routes of any shape (ours, the
root route) call these two functions and only format.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.errors import ServiceError
from service.frontend import answer_size
from service.frontend.answers import AnswerOptions, answers
from service.frontend.entities import STRATEGIES, merge_windows, window_entities
from service.frontend.frontdoor import FrontDoor, Waiter
from service.frontend.token_windows import pair_windows, text_windows
from service.tasks import QaItem, SpanLogits, TokenClassifyItem, TokenLogits


@dataclass(frozen=True)
class EntityOptions:
    aggregation_strategy: str = "none"
    ignore_labels: tuple[str, ...] = ("O",)
    stride: int | None = None


def _check_windows(door: FrontDoor, count: int, what: str) -> None:
    """A request's windows are its work: bounded as a request's inputs are."""
    limit = door.limits.max_inputs_per_request
    if count > limit:
        raise ServiceError("validation", f"the {what} make {count} windows of the model's length; the limit is {limit} "
                                         "per request: send fewer or shorter texts, or a smaller stride")


def _check_text(text: str, door: FrontDoor, field: str) -> None:
    if not text.strip():
        raise ServiceError("validation", f"{field} is empty or whitespace only", param=field)
    if len(text) > door.limits.max_input_chars:
        raise ServiceError("validation", f"{field} has {len(text)} characters; the limit is "
                                         f"{door.limits.max_input_chars}", param=field)


async def classify_tokens(door: FrontDoor, texts: list[str], labels: tuple[str, ...], options: EntityOptions,
                          gone: Waiter = None) -> list[list[dict]]:
    """Each text's entities, as the token-classification pipeline finds them."""
    door.require(door.num_token_labels > 0, "this route needs a token-classification head")
    if options.aggregation_strategy not in STRATEGIES:
        raise ServiceError("validation", f"aggregation_strategy must be one of {list(STRATEGIES)}, got "
                                         f"{options.aggregation_strategy!r}", param="aggregation_strategy")
    if options.stride is not None and options.aggregation_strategy == "none":
        raise ServiceError("validation", "stride splits long texts into windows, whose entities can only be merged "
                                         "with an aggregation_strategy other than none", param="stride")
    if not texts:
        raise ServiceError("empty", "inputs is empty; send at least one text", param="inputs")
    if len(texts) > door.limits.max_inputs_per_request:
        raise ServiceError("validation", f"inputs has {len(texts)} entries; the limit is "
                                         f"{door.limits.max_inputs_per_request} per request", param="inputs")
    tokenizer = door.tokenizer

    def prepare():
        for index, text in enumerate(texts):
            _check_text(text, door, f"inputs[{index}]")
        pieces = tokenizer.pieces(texts)
        windows = [text_windows(p, tokenizer.cls_id, tokenizer.sep_id, tokenizer.model_max_length, options.stride,
                                f"inputs[{i}]") for i, p in enumerate(pieces)]
        return pieces, windows

    pieces, windows = await door.prepare(texts, prepare)
    _check_windows(door, sum(map(len, windows)), "inputs")
    answer_size.check_entities(sum(len(p.ids) for p in pieces), sum(map(len, texts)), door.limits.max_response_mb)
    items = [TokenClassifyItem(w.input_ids, w.token_type_ids) for per_text in windows for w in per_text]
    results: list[TokenLogits] = await door.compute(items, gone)
    out, at = [], 0
    for text, text_pieces, per_text in zip(texts, pieces, windows):
        found = []
        for window in per_text:
            found += window_entities(text, text_pieces, window, results[at].logits, labels,
                                     options.aggregation_strategy, list(options.ignore_labels), tokenizer)
            at += 1
        out.append(merge_windows(found) if len(per_text) > 1 else found)
    return out


@dataclass(frozen=True)
class WindowOptions:
    max_seq_len: int | None = None  # None: the pipeline's min(model's maximum, 384)
    doc_stride: int | None = None  # None: min(max_seq_len // 2, 128)


async def answer_questions(door: FrontDoor, pairs: list[tuple[str, str]], options: AnswerOptions,
                           windowing: WindowOptions, gone: Waiter = None) -> list[list[dict]]:
    """Each (question, context)'s best answers, best first, as the question-answering pipeline finds them."""
    door.require(door.has_qa_head, "this route needs a question-answering head")
    tokenizer = door.tokenizer
    limit = tokenizer.model_max_length
    max_seq_len = windowing.max_seq_len if windowing.max_seq_len is not None else min(limit, 384)
    if not 4 <= max_seq_len <= limit:
        raise ServiceError("validation", f"max_seq_len must be between 4 and the model's maximum {limit}, got "
                                         f"{max_seq_len}", param="max_seq_len")
    doc_stride = windowing.doc_stride if windowing.doc_stride is not None else min(max_seq_len // 2, 128)
    if not 0 <= doc_stride <= max_seq_len:
        raise ServiceError("validation", f"doc_stride must be between 0 and max_seq_len ({max_seq_len}), got "
                                         f"{doc_stride}", param="doc_stride")
    if not 1 <= options.top_k <= door.limits.max_top_k:
        raise ServiceError("validation", f"top_k must be between 1 and {door.limits.max_top_k}, got {options.top_k}",
                           param="top_k")
    if not 1 <= options.max_answer_len <= max_seq_len:
        raise ServiceError("validation", f"max_answer_len must be between 1 and max_seq_len ({max_seq_len}), got "
                                         f"{options.max_answer_len}", param="max_answer_len")
    if not pairs:
        raise ServiceError("empty", "inputs is empty; send at least one question and context", param="inputs")
    if len(pairs) > door.limits.max_inputs_per_request:
        raise ServiceError("validation", f"inputs has {len(pairs)} entries; the limit is "
                                         f"{door.limits.max_inputs_per_request} per request", param="inputs")
    many = len(pairs) > 1

    def prepare():
        for index, (question, context) in enumerate(pairs):
            _check_text(question, door, f"inputs[{index}].question" if many else "question")
            _check_text(context, door, f"inputs[{index}].context" if many else "context")
        pieces = tokenizer.pieces([text for pair in pairs for text in pair])
        windows = [pair_windows(q, c, tokenizer.cls_id, tokenizer.sep_id, max_seq_len, doc_stride)
                   for q, c in zip(pieces[0::2], pieces[1::2])]
        return pieces[1::2], windows

    contexts, windows = await door.prepare([c for _, c in pairs], prepare)
    _check_windows(door, sum(map(len, windows)), "contexts")
    answer_size.check_answers([len(c) for _, c in pairs], options.top_k + options.handle_impossible_answer,
                              options.max_answer_len, door.limits.max_response_mb)
    items = [QaItem(w.input_ids, w.token_type_ids) for per_pair in windows for w in per_pair]
    results: list[SpanLogits] = await door.compute(items, gone)
    out, at = [], 0
    for (_, context), pieces, per_pair in zip(pairs, contexts, windows):
        spans: list[SpanLogits] = results[at : at + len(per_pair)]
        at += len(per_pair)
        out.append(answers(context, pieces, per_pair, [s.start for s in spans], [s.end for s in spans], options))
    return out


__all__ = ["EntityOptions", "WindowOptions", "AnswerOptions", "classify_tokens", "answer_questions"]
