"""Fused attention projections (model/fuse.py): the same outputs as the three separate Linears, on the packed
path, the padded path and the heads."""

from __future__ import annotations

import copy

import torch

from model.fuse import fuse_attention_projections
from model.packing import Packing
from tests.conftest import random_model


def test_fused_projections_give_the_same_outputs():
    separate = random_model(300)
    fused = fuse_attention_projections(copy.deepcopy(separate))
    layers = [layer.attention.self for layer in fused.bert.encoder.layer]
    assert all(a.fused_qkv is not None and a.query is None for a in layers)
    assert sum(p.numel() for p in fused.parameters()) == sum(p.numel() for p in separate.parameters())
    lengths = [9, 2, 30, 14]
    ids = [torch.randint(5, 300, (n,), generator=torch.Generator().manual_seed(n)) for n in lengths]
    flat = torch.cat(ids)
    padded_ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(padded_ids)
    for row, row_ids in enumerate(ids):
        padded_ids[row, : len(row_ids)], mask[row, : len(row_ids)] = row_ids, 1
    with torch.no_grad():
        packed = [m.encode_packed(flat, torch.zeros_like(flat), Packing.from_lengths(lengths))[1]
                  for m in (separate, fused)]
        torch.testing.assert_close(packed[1], packed[0], rtol=0, atol=1e-5)
        outputs = [m(padded_ids, torch.zeros_like(padded_ids), mask) for m in (separate, fused)]
    for name in ("last_hidden_state", "pooled_output", "mlm_logits", "nsp_logits"):
        torch.testing.assert_close(getattr(outputs[1], name), getattr(outputs[0], name), rtol=0, atol=1e-5)
    assert fuse_attention_projections(fused) is fused  # a second call leaves fused layers alone
