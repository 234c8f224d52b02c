"""Inputs longer than the model's window, for the pooled embedding routes that ask for it (`"long_input": "chunk"`):
each such input becomes overlapping windows, `[CLS] pieces [SEP]` each, sent as `WindowItem`s with every other input
(one batcher, one token budget). The engine pools each window alone and folds the windows of one input into its vector
before it answers (service.engine.long_inputs: mean weighted by tokens). Inputs that fit the model stay one
`EncodeItem`. A window is as long as the model was meant to read at once (`window_length`), and windows start every
`window - overlap` pieces (service.frontend.token_windows)."""

from __future__ import annotations

from model.pooling import PoolingRecipe
from model.tokenizer import EncodedText, WordPieceTokenizer
from service.errors import ServiceError
from service.frontend.token_windows import window_overlap, window_starts
from service.tasks import EncodeItem, Pooling, WindowItem


def window_length(tokenizer: WordPieceTokenizer, recipe: PoolingRecipe) -> int:
    """Tokens in one window: the length sentence-transformers embeds where the checkpoint names one (all-MiniLM-L6-v2:
    256, though its positions reach 512: it was trained on shorter texts, and attention over 512 costs a fifth more a
    token on a CPU), else the model's maximum."""
    return min(tokenizer.model_max_length, recipe.max_seq_length or tokenizer.model_max_length)


def windowed_items(tokenizer: WordPieceTokenizer, encoded: list[EncodedText], pooling: Pooling, normalize: bool,
                   window: int, overlap: int, field: str) -> list[EncodeItem]:
    """An item for each input that fits the model, `window`-token windows for each that does not."""
    limit = tokenizer.model_max_length
    room = window - 2
    items: list[EncodeItem] = []
    for source, e in enumerate(encoded):
        if len(e.ids) <= limit:
            items.append(EncodeItem(e.ids, e.type_ids, pooling=pooling, normalize=normalize))
            continue
        if pooling == "none":
            raise ServiceError("validation", f"{field}[{source}] is {len(e.ids)} tokens long; long_input: chunk pools "
                               f"each input's windows into one vector, so it needs pooling (the model takes at most "
                               f"{limit} tokens a vector list)", param=field)
        if any(e.type_ids):
            raise ServiceError("validation", f"{field}[{source}] is a pair {len(e.ids)} tokens long; long_input: chunk "
                                             "splits single texts (send truncate: true to cut pairs)", param=field)
        pieces = _pieces(tokenizer, e.ids)
        for start, stop in window_starts(len(pieces), room, window_overlap(room, overlap)):
            ids = [tokenizer.cls_id, *pieces[start:stop], tokenizer.sep_id]
            items.append(WindowItem(ids, [0] * len(ids), pooling=pooling, normalize=False, source=source,
                                    normalize_input=normalize))
    return items


def _pieces(tokenizer: WordPieceTokenizer, ids: list[int]) -> list[int]:
    """A text's pieces without the [CLS] and [SEP] around them (token-id inputs may come without)."""
    start = 1 if ids and ids[0] == tokenizer.cls_id else 0
    stop = len(ids) - 1 if len(ids) > start and ids[-1] == tokenizer.sep_id else len(ids)
    return ids[start:stop]
