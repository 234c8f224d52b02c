"""The encode head's results: an embedding batch pooled alike (read in one pass) and a batch that mixes poolings (read
item by item) give each item its own pooling of its own tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model.packing import Packing
from service.engine.heads import _encode
from service.tasks import EncodeItem, PooledVector, TokenVectors


def _expected(item: EncodeItem, tokens: np.ndarray) -> np.ndarray:
    pooled = tokens if item.pooling == "none" else tokens[0] if item.pooling == "cls" else tokens.mean(axis=0)
    return pooled / np.linalg.norm(pooled, axis=-1, keepdims=True) if item.normalize else pooled


@pytest.mark.parametrize("poolings", [
    [("mean", True)] * 5,  # alike: one pass
    [("cls", False)] * 5,
    [("mean", True), ("cls", False), ("none", False), ("mean", False), ("mean", True)],  # mixed: item by item
    [("none", False)] * 5,
])
def test_every_item_gets_its_own_pooling_of_its_own_tokens(poolings):
    lengths = [3, 7, 2, 5, 4]
    items = [EncodeItem([1] * n, [0] * n, pooling, normalize) for n, (pooling, normalize) in zip(lengths, poolings)]
    hidden = torch.randn(sum(lengths), 6, generator=torch.Generator().manual_seed(3))
    packing = Packing.from_lengths(lengths)
    starts = [start for start, _ in packing.spans]
    results: list = [None] * len(items)
    _encode(items, hidden, packing, starts)(results)
    for item, start, result in zip(items, starts, results):
        tokens = hidden[start : start + len(item)].numpy()
        assert type(result) is (TokenVectors if item.pooling == "none" else PooledVector)
        got = result.vectors if item.pooling == "none" else result.vector
        np.testing.assert_allclose(got, _expected(item, tokens), rtol=1e-5, atol=1e-6)
