"""Items as the engine process reads them off the wire (token ids in int32 memoryviews, service.messages) collate and
compute exactly as the same items made in this process (lists), alone and batched with list items."""

from __future__ import annotations

import numpy as np
import torch

from service.engine.engine import Engine
from service.messages import Submit, decode, encode
from service.tasks import EncodeItem, FillMaskItem, NspItem
from tests.conftest import random_model


def _items(tokenizer) -> list:
    one = tokenizer.encode("the river flows to the town")
    pair = tokenizer.encode("it rained all day", "the town was wet")
    mask = tokenizer.encode("the [MASK] flows")
    return [EncodeItem(list(one.ids), list(one.type_ids), "mean", True),
            NspItem(list(pair.ids), list(pair.type_ids)),
            FillMaskItem(list(mask.ids), list(mask.type_ids), [2], 3),
            EncodeItem(list(pair.ids), list(pair.type_ids), "cls", False),
            EncodeItem(list(one.ids), list(one.type_ids), "none", False)]


def _same_results(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert type(x) is type(y)
        for name, value in vars(x).items():
            if isinstance(value, np.ndarray):
                np.testing.assert_array_equal(value, getattr(y, name))
            elif isinstance(value, list):  # fill-mask's per-mask scores
                _same_results(value, getattr(y, name))
            else:
                assert value == getattr(y, name)


def test_items_off_the_wire_compute_exactly_as_list_items(tokenizer):
    engine = Engine(random_model(tokenizer.vocab_size, seed=4), torch.device("cpu"), torch.float32)
    made = _items(tokenizer)
    read = decode(encode(Submit(1, made, 0.0))).items
    assert all(type(item.input_ids) is memoryview and type(item.token_type_ids) is memoryview for item in read)
    for kept, wired in ((made, read), (made, made[:2] + read[2:])):  # all off the wire; the two kinds in one batch
        ours, theirs = engine.collate(kept), engine.collate(wired)
        assert torch.equal(ours.input_ids, theirs.input_ids) and torch.equal(ours.token_type_ids, theirs.token_type_ids)
        assert theirs.input_ids.dtype == torch.int64 and theirs.real_tokens == sum(len(i) for i in made)
        _same_results(engine.run(ours), engine.run(theirs))
