"""A packed sequence whose last tokens are no keys (a ColBERT query's [MASK] expansion) computes what transformers
computes with those tokens' attention mask at 0: every path of packed attention (the CPU kernel, one SDPA call per
sequence, the padded call, FlashAttention varlen on CUDA, the int8 C layer's fallback) against the padded forward
with that mask, in batches that mix such sequences with ordinary ones."""

from __future__ import annotations

import pytest
import torch

import model.attention as attention
from model.packing import Packing
from tests.conftest import random_model
from tests.model.cpu_attention_paths import CPU_ATTENTION_PATHS, use_cpu_attention_path

LENGTHS = [9, 2, 30, 14, 16]
KEYS = [6, 2, 30, 5, 16]  # the first, fourth: their last tokens read the others but are not read


def _inputs(vocab: int) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    ids = [torch.randint(5, vocab, (n,), generator=torch.Generator().manual_seed(n)) for n in LENGTHS]
    padded = torch.zeros(len(LENGTHS), max(LENGTHS), dtype=torch.long)
    mask = torch.zeros_like(padded)
    for row, (row_ids, keys) in enumerate(zip(ids, KEYS)):
        padded[row, : len(row_ids)], mask[row, :keys] = row_ids, 1
    return ids, padded, mask


def _packed_and_reference(ours) -> tuple[torch.Tensor, torch.Tensor]:
    ids, padded, mask = _inputs(ours.config.vocab_size)
    flat = torch.cat(ids)
    real = torch.arange(padded.shape[1])[None, :] < torch.tensor(LENGTHS)[:, None]
    with torch.no_grad():
        packed = ours.encode_packed(flat, torch.zeros_like(flat), Packing.from_lengths(LENGTHS, KEYS))[1]
        reference, _ = ours.bert(padded, torch.zeros_like(padded), mask)
    return packed, reference[real]


def test_the_key_rows_and_their_cumulative_counts():
    packing = Packing.from_lengths([4, 3], [2, 3])
    assert packing.key_lengths == (2, 3) and packing.key_rows.tolist() == [0, 1, 4, 5, 6]
    assert packing.cu_keys.tolist() == [0, 2, 5] and packing.cu_keys.dtype == torch.int32
    assert packing.key_mask[:, 0, 0].tolist() == [[True, True, False, False], [True, True, True, False]]
    unrestricted = Packing.from_lengths([4, 3])
    assert unrestricted.key_lengths is None and unrestricted.key_rows is None


@pytest.mark.parametrize("path", CPU_ATTENTION_PATHS)
def test_every_cpu_path_equals_the_padded_forward_with_the_mask(monkeypatch, path):
    use_cpu_attention_path(monkeypatch, path)
    packed, reference = _packed_and_reference(random_model(300))
    torch.testing.assert_close(packed, reference, rtol=0, atol=2e-5)


def test_varlen_gets_the_keys_packed_on_their_own(monkeypatch):
    """A stand-in for FlashAttention's varlen contract (queries of each sequence attend to that sequence's keys, given
    their cumulative counts) computed with SDPA on the CPU: the answer must be the padded forward's."""
    calls = []

    def fake_varlen(q, k, v, cu_q, cu_k, max_q, max_k):
        calls.append((k.shape[0], cu_k.tolist(), max_k))
        out = torch.empty_like(q)
        for (q0, q1), (k0, k1) in zip(zip(cu_q.tolist(), cu_q.tolist()[1:]), zip(cu_k.tolist(), cu_k.tolist()[1:])):
            heads = lambda t, a, b: t[a:b].transpose(0, 1)[None]  # noqa: E731  (1, nh, L, hd)
            out[q0:q1] = torch.nn.functional.scaled_dot_product_attention(
                heads(q, q0, q1), heads(k, k0, k1), heads(v, k0, k1))[0].transpose(0, 1)
        return out

    monkeypatch.setattr(attention, "varlen_attn", fake_varlen)
    monkeypatch.setattr(attention, "runs_varlen", lambda device, dtype, head_dim: True)
    monkeypatch.setattr("model.bert.runs_varlen", attention.runs_varlen)
    ours = random_model(300)
    packed, reference = _packed_and_reference(ours)
    assert calls[0] == (sum(KEYS), [0, 6, 8, 38, 43, 59], 30)
    torch.testing.assert_close(packed, reference, rtol=0, atol=2e-5)


def test_int8_layers_that_restrict_keys_run_their_parts():
    """The int8 C layer attends each sequence to all of itself: with keys restricted the layer's parts run, and the
    result is the padded forward's through the same int8 layers (per-token scales: the same rows, the same steps)."""
    from kernels.quantize import quantize

    ours = quantize(random_model(300), "per-token")
    packed, reference = _packed_and_reference(ours)
    torch.testing.assert_close(packed, reference, rtol=0, atol=1e-3)
