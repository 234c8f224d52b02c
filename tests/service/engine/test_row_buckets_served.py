"""A bfloat16 engine on a CPU computes each batch on a rounded-up row count (model.row_buckets), including the ColBERT
projection's rows: every head answers with the same bits as without the spare rows."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from model import load_checkpoint
from service.engine import colbert_head
from service.engine.engine import Engine
from service.tasks import EncodeItem, FillMaskItem, LateInteractionItem, NspItem


def _results(directory, items, rounds: bool, monkeypatch) -> list:
    engine = Engine(load_checkpoint(directory).model, torch.device("cpu"), torch.bfloat16)
    assert engine.rounds_rows
    engine.rounds_rows = rounds
    monkeypatch.setattr(colbert_head, "rounds_rows", lambda device, dtype: rounds)
    batch = engine.collate(items)
    assert batch.packing.spare_rows == ((48 - batch.real_tokens) if rounds else 0)  # 43 or 41 tokens: 48 rows
    return engine.run(batch)


def _same(ours, reference) -> None:
    assert type(ours) is type(reference)
    for field in dataclasses.fields(ours):
        a, b = getattr(ours, field.name), getattr(reference, field.name)
        if isinstance(a, list):
            for x, y in zip(a, b, strict=True):
                _same(x, y)
        else:
            np.testing.assert_array_equal(a, b)


def test_every_head_answers_the_same_bits_on_rounded_rows(tiny_checkpoint, tiny_colbert, monkeypatch):
    ids = list(range(10, 25))
    items = [EncodeItem([2] + ids + [3], [0] * 17, pooling="mean"), EncodeItem([2, 40, 41, 3], [0] * 4),
             FillMaskItem([2, 50, 4, 51, 3], [0] * 5, mask_positions=[2]), NspItem([2] + ids + [3], [0] * 17)]
    rounded, plain = (_results(tiny_checkpoint, items, rounds, monkeypatch) for rounds in (True, False))
    for ours, reference in zip(rounded, plain, strict=True):
        _same(ours, reference)
    colbert = [LateInteractionItem([2] + ids + [4, 4, 3], [0] * 19, keys=17),
               LateInteractionItem([2] + ids[:8] + [3], [0] * 10, kept=[0, 2, 3, 5]),
               LateInteractionItem([2] + ids[:10] + [3], [0] * 12)]
    rounded, plain = (_results(tiny_colbert, colbert, rounds, monkeypatch) for rounds in (True, False))
    for ours, reference in zip(rounded, plain, strict=True):
        _same(ours, reference)
