"""Request inputs -> tokenized, typed work items, with every input check that needs the tokenizer.

Plain functions of the tokenizer and the limits; the front door runs them on the event loop for
small requests (cheaper than a thread hop) and in a worker thread for large ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from model.tokenizer import MASK, EncodedText, WordPieceTokenizer
from service.errors import ServiceError
from service.tasks import EncodeItem, FillMaskItem, NspItem, Pooling


@dataclass
class Limits:
    max_inputs_per_request: int
    max_input_chars: int
    max_top_k: int


def _as_list(inputs, is_single) -> list:
    return [inputs] if is_single(inputs) else list(inputs)


def _check_texts(texts: list, limits: Limits, field: str = "inputs") -> None:
    if not texts:
        raise ServiceError("validation", f"{field} is empty; send at least one input", param=field)
    if len(texts) > limits.max_inputs_per_request:
        raise ServiceError("validation", f"{field} has {len(texts)} entries; the limit is "
                                         f"{limits.max_inputs_per_request} per request", param=field)
    for index, entry in enumerate(texts):
        parts = entry if isinstance(entry, (list, tuple)) else [entry]
        for part in parts:
            if not part.strip():
                raise ServiceError("validation", f"{field}[{index}] is empty or whitespace only", param=field)
            if len(part) > limits.max_input_chars:
                raise ServiceError("validation", f"{field}[{index}] has {len(part)} characters; the limit is "
                                                 f"{limits.max_input_chars}", param=field)
            if any(0xD800 <= ord(c) <= 0xDFFF for c in part):
                raise ServiceError("validation", f"{field}[{index}] contains a lone surrogate (not valid Unicode)", param=field)


def _encode(tokenizer: WordPieceTokenizer, entries: list, truncate: bool, field: str = "inputs") -> list[EncodedText]:
    encoded = tokenizer.encode_batch([tuple(e) if isinstance(e, list) else e for e in entries], truncate=truncate)
    for index, e in enumerate(encoded):
        if len(e.ids) > tokenizer.model_max_length:
            raise ServiceError("validation", f"{field}[{index}] is {len(e.ids)} tokens long; the model takes at most "
                                             f"{tokenizer.model_max_length} (send truncate: true to cut it)", param=field)
    return encoded


def encode_items(tokenizer: WordPieceTokenizer, inputs, pooling: Pooling, normalize: bool, truncate: bool,
                 limits: Limits, field: str = "inputs") -> tuple[list[EncodeItem], list[list[str]]]:
    """Items, and each input's tokens as text. `field` names the inputs in error messages."""
    entries = _as_list(inputs, lambda x: isinstance(x, str))
    _check_texts(entries, limits, field)
    encoded = _encode(tokenizer, entries, truncate, field)
    items = [EncodeItem(e.ids, e.type_ids, pooling=pooling, normalize=normalize) for e in encoded]
    return items, [e.tokens for e in encoded]


def target_token_ids(tokenizer: WordPieceTokenizer, targets: list[str]) -> list[int]:
    if not targets:
        raise ServiceError("validation", "targets is empty; leave it out to score the whole vocabulary")
    found = []
    for target in targets:
        pieces = tokenizer.tokenize_words([target])[0]
        if len(pieces) != 1 or pieces[0] == tokenizer.unk_id:
            raise ServiceError("validation", f"target {target!r} is not a single vocabulary token "
                                             f"(it tokenizes to {len(pieces)} pieces)")
        found.append(pieces[0])
    return list(dict.fromkeys(found))


def fill_mask_items(tokenizer: WordPieceTokenizer, inputs, top_k: int, targets: list[str] | None, truncate: bool,
                    limits: Limits) -> list[FillMaskItem]:
    if not 1 <= top_k <= limits.max_top_k:
        raise ServiceError("validation", f"top_k must be between 1 and {limits.max_top_k}, got {top_k}")
    texts = _as_list(inputs, lambda x: isinstance(x, str))
    _check_texts(texts, limits)
    target_ids = None if targets is None else target_token_ids(tokenizer, targets)
    items = []
    for index, e in enumerate(_encode(tokenizer, texts, truncate)):
        positions = [p for p, t in enumerate(e.ids) if t == tokenizer.mask_id]
        if not positions:
            raise ServiceError("validation", f"inputs[{index}] has no {MASK} token"
                                             + (" left after truncation" if truncate and MASK in texts[index] else ""))
        k = top_k if target_ids is None else min(top_k, len(target_ids))  # as the HF pipeline does
        items.append(FillMaskItem(e.ids, e.type_ids, mask_positions=positions, top_k=k, target_ids=target_ids))
    return items


def nsp_items(tokenizer: WordPieceTokenizer, inputs, truncate: bool, limits: Limits) -> list[NspItem]:
    pairs = _as_list(inputs, lambda x: len(x) == 2 and all(isinstance(s, str) for s in x))
    _check_texts(pairs, limits)
    return [NspItem(e.ids, e.type_ids) for e in _encode(tokenizer, pairs, truncate)]


@dataclass
class Piece:
    id: int
    text: str  # the input's characters for a word piece; the token itself for [CLS] / [SEP]
    special: bool
    start: int | None  # character offsets into the input (None for [CLS] / [SEP])
    stop: int | None


def tokenize_texts(tokenizer: WordPieceTokenizer, inputs, add_special_tokens: bool, limits: Limits) -> list[list[Piece]]:
    texts = _as_list(inputs, lambda x: isinstance(x, str))
    _check_texts(texts, limits)
    template = {tokenizer.cls_id, tokenizer.sep_id}
    out = []
    for text, e in zip(texts, tokenizer.encode_batch(texts)):
        pieces = []
        for token_id, token, (start, stop) in zip(e.ids, e.tokens, e.offsets):
            if token_id in template and start == stop:  # added by the template, not in the text
                if add_special_tokens:
                    pieces.append(Piece(token_id, token, True, None, None))
            else:
                pieces.append(Piece(token_id, text[start:stop], False, start, stop))
        out.append(pieces)
    return out
