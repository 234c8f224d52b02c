"""Request inputs -> tokenized, typed work items, with every input check that needs the tokenizer.

Plain functions of the tokenizer and the limits; the front door runs them on the event loop for
small requests (cheaper than a thread hop) and in a worker thread for large ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from model.pooling import PoolingRecipe
from model.tokenizer import MASK, EncodedText, WordPieceTokenizer
from service.errors import ServiceError
from service.frontend.long_inputs import windowed_items
from service.tasks import ClassifyItem, EncodeItem, FillMaskItem, NspItem, Pooling, SparseItem


@dataclass
class Limits:
    max_inputs_per_request: int
    max_input_chars: int
    max_top_k: int
    max_response_mb: float = 32.0  # the answer's estimated size (service.frontend.answer_size)


def _as_list(inputs, is_single) -> list:
    return [inputs] if is_single(inputs) else list(inputs)


def check_texts(texts: list, limits: Limits, field: str = "inputs") -> None:
    # Every text is valid Unicode already: the body parser (service.frontend.body) refuses lone surrogates.
    if not texts:
        raise ServiceError("empty", f"{field} is empty; send at least one input", param=field)
    if len(texts) > limits.max_inputs_per_request:
        raise ServiceError("validation", f"{field} has {len(texts)} entries; the limit is "
                                         f"{limits.max_inputs_per_request} per request", param=field)
    for index, entry in enumerate(texts):
        if is_token_ids(entry):
            if len(entry) > limits.max_input_chars:
                raise ServiceError("validation", f"{field}[{index}] has {len(entry)} token ids; the limit is "
                                                 f"{limits.max_input_chars}", param=field)
            continue
        if isinstance(entry, list) and not entry:
            raise ServiceError("validation", f"{field}[{index}] is an empty list", param=field)
        parts = entry if isinstance(entry, (list, tuple)) else [entry]
        for part in parts:
            if not part.strip():
                raise ServiceError("validation", f"{field}[{index}] is empty or whitespace only", param=field)
            if len(part) > limits.max_input_chars:
                raise ServiceError("validation", f"{field}[{index}] has {len(part)} characters; the limit is "
                                                 f"{limits.max_input_chars}", param=field)


@dataclass(frozen=True)
class Preparation:
    """How a request's texts become tokens: cut when too long (and at which end), or read in windows (`chunk`:
    service.frontend.long_inputs), and a prompt (a sentence-transformers prompt's text) put before each text."""

    truncate: bool = False
    direction: Literal["right", "left"] = "right"
    prompt: str = ""
    chunk: bool = False


def is_token_ids(value) -> bool:
    """A non-empty list of integers: token ids of the served tokenizer (TEI's routes accept them)."""
    return isinstance(value, list) and bool(value) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)


def _encode(tokenizer: WordPieceTokenizer, entries: list, prep: Preparation, field: str = "inputs") -> list[EncodedText]:
    texts = [e for e in entries if not is_token_ids(e)]
    if prep.prompt:
        texts = [prep.prompt + t if isinstance(t, str) else [prep.prompt + t[0], t[1]] for t in texts]
    encoded = iter(tokenizer.encode_batch([tuple(e) if isinstance(e, list) else e for e in texts],
                                          truncate=prep.truncate, direction=prep.direction))
    out = [_from_ids(tokenizer, e, index, prep, field) if is_token_ids(e) else next(encoded)
           for index, e in enumerate(entries)]
    for index, e in enumerate(out):
        if len(e.ids) > tokenizer.model_max_length and not prep.chunk:
            raise ServiceError("validation", f"{field}[{index}] is {len(e.ids)} tokens long; the model takes at most "
                                             f"{tokenizer.model_max_length} (send truncate: true to cut it)", param=field)
    if prep.chunk and prep.truncate:
        raise ServiceError("validation", "send truncate: true or long_input: chunk, not both", param="long_input")
    return out


def _from_ids(tokenizer: WordPieceTokenizer, ids: list[int], index: int, prep: Preparation, field: str) -> EncodedText:
    """Token ids as given (as text-embeddings-inference takes them: no special tokens added, so send what
    /tokenize returns), checked against the vocabulary, cut like text when asked."""
    size = tokenizer.vocab_size
    bad = next((i for i in ids if not 0 <= i < size), None)
    if bad is not None:
        raise ServiceError("validation", f"{field}[{index}] has token id {bad}, outside the vocabulary "
                                         f"(0 to {size - 1})", param=field)
    limit = tokenizer.model_max_length
    if prep.truncate and len(ids) > limit:
        ids = ids[:limit] if prep.direction == "right" else ids[-limit:]
    return EncodedText(ids=list(ids), type_ids=[0] * len(ids), vocab=tokenizer.vocab,
                       offsets=[(0, 0)] * len(ids), truncated=False)


def is_pair(value) -> bool:
    """A [text, text_pair] pair (a list of exactly two texts, as text-embeddings-inference reads it)."""
    return isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)


def _as_entries(inputs) -> list:
    """A request's inputs as a list: one text, one token-id list, or a list of either (TEI's `Input`)."""
    return [inputs] if isinstance(inputs, str) or is_token_ids(inputs) else list(inputs)


def encode_items(tokenizer: WordPieceTokenizer, inputs, pooling: Pooling, normalize: bool, prep: Preparation,
                 limits: Limits, field: str = "inputs", window: int = 0, overlap: int = 0
                 ) -> tuple[list[EncodeItem], list[EncodedText]]:
    """Items (with `prep.chunk`, a long input's windows of `window` tokens, `overlap` pieces shared by neighbours),
    and each input's encoding (its tokens as text, when asked). `field` names the inputs in errors."""
    entries = _as_entries(inputs)
    check_texts(entries, limits, field)
    encoded = _encode(tokenizer, entries, prep, field)
    if not prep.chunk:
        return [EncodeItem(e.ids, e.type_ids, pooling=pooling, normalize=normalize) for e in encoded], encoded
    items = windowed_items(tokenizer, encoded, pooling, normalize, window, overlap, field)
    if len(items) > limits.max_inputs_per_request:  # each window is an input's work
        raise ServiceError("validation", f"{field} make {len(items)} windows of the model's length; the limit is "
                                         f"{limits.max_inputs_per_request} per request: send fewer or shorter texts",
                           param=field)
    return items, encoded


def sparse_items(tokenizer: WordPieceTokenizer, inputs, prep: Preparation, limits: Limits) -> list[SparseItem]:
    entries = _as_entries(inputs)
    check_texts(entries, limits)
    return [SparseItem(e.ids, e.type_ids) for e in _encode(tokenizer, entries, prep)]


def classify_items(tokenizer: WordPieceTokenizer, entries: list, prep: Preparation, limits: Limits,
                   field: str = "inputs") -> list[ClassifyItem]:
    """Texts and [a, b] pairs (already a list) for a sequence classifier or cross-encoder."""
    check_texts(entries, limits, field)
    return [ClassifyItem(e.ids, e.type_ids) for e in _encode(tokenizer, entries, prep, field)]


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
    prep = Preparation(truncate)
    if not 1 <= top_k <= limits.max_top_k:
        raise ServiceError("validation", f"top_k must be between 1 and {limits.max_top_k}, got {top_k}")
    texts = _as_list(inputs, lambda x: isinstance(x, str))
    check_texts(texts, limits)
    target_ids = None if targets is None else target_token_ids(tokenizer, targets)
    items = []
    for index, e in enumerate(_encode(tokenizer, texts, prep)):
        positions = [p for p, t in enumerate(e.ids) if t == tokenizer.mask_id]
        if not positions:
            raise ServiceError("validation", f"inputs[{index}] has no {MASK} token"
                                             + (" left after truncation" if truncate and MASK in texts[index] else ""))
        k = top_k if target_ids is None else min(top_k, len(target_ids))  # as the HF pipeline does
        items.append(FillMaskItem(e.ids, e.type_ids, mask_positions=positions, top_k=k, target_ids=target_ids))
    return items


def nsp_items(tokenizer: WordPieceTokenizer, inputs, truncate: bool, limits: Limits) -> list[NspItem]:
    pairs = _as_list(inputs, lambda x: len(x) == 2 and all(isinstance(s, str) for s in x))
    check_texts(pairs, limits)
    return [NspItem(e.ids, e.type_ids) for e in _encode(tokenizer, pairs, Preparation(truncate))]


@dataclass
class Piece:
    id: int
    text: str  # the input's characters for a word piece; the token itself for [CLS] / [SEP]
    special: bool
    start: int | None  # character offsets into the input (None for [CLS] / [SEP])
    stop: int | None


def tokenize_texts(tokenizer: WordPieceTokenizer, inputs, add_special_tokens: bool, limits: Limits,
                   prompt: str = "") -> list[list[Piece]]:
    texts = _as_list(inputs, lambda x: isinstance(x, str))
    check_texts(texts, limits)
    texts = [prompt + text for text in texts]
    template = {tokenizer.cls_id, tokenizer.sep_id}
    out = []
    for text, e in zip(texts, tokenizer.encode_batch(texts, offsets=True)):
        pieces = []
        for token_id, token, (start, stop) in zip(e.ids, e.tokens, e.offsets):
            if token_id in template and start == stop:  # added by the template, not in the text
                if add_special_tokens:
                    pieces.append(Piece(token_id, token, True, None, None))
            else:
                pieces.append(Piece(token_id, text[start:stop], False, start, stop))
        out.append(pieces)
    return out


def preparation(recipe: PoolingRecipe, truncate: bool | None, direction: str = "right",
                prompt_name: str | None = None, long_input: str = "refuse") -> Preparation:
    """A request's Preparation; `prompt_name` must be one of the checkpoint's sentence-transformers
    prompts (without one, its default prompt applies, as sentence-transformers does); `long_input` chunk reads inputs
    longer than the model in windows."""
    prompts = dict(recipe.prompts)
    name = prompt_name if prompt_name is not None else recipe.default_prompt_name
    if name is not None and name not in prompts:
        known = ", ".join(repr(p) for p in sorted(prompts)) or "none (its sentence-transformers config defines none)"
        raise ServiceError("validation", f"prompt_name {name!r} is not a prompt of this model; its prompts: {known}",
                           param="prompt_name")
    return Preparation(bool(truncate), "left" if direction.lower() == "left" else "right", prompts.get(name, ""),
                       long_input == "chunk")
