"""Which attention kernel a packed batch runs (model.attention), decided without a GPU: FlashAttention varlen
only on CUDA in half precision with a torch that has it; the lengths it is given (Packing.cu_seqlens,
max_length); and that where it would run, it is really called on the packed layout with no padding."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import model
import model.attention as attention
from devkit.paths import REPO_ROOT
from model.packing import Packing
from tests.conftest import random_model

CUDA, CPU = torch.device("cuda:0"), torch.device("cpu")


@pytest.mark.skipif(attention.varlen_kernel() is None, reason="this torch has no torch.nn.attention.varlen")
@pytest.mark.parametrize(("device", "dtype", "head_dim", "expected"), [
    (CUDA, torch.bfloat16, 64, True), (CUDA, torch.float16, 32, True), (CUDA, torch.float32, 64, False),
    (CPU, torch.bfloat16, 64, False), (CPU, torch.float32, 64, False), (CUDA, torch.bfloat16, 12, False),
    (CUDA, torch.bfloat16, 512, False)])
def test_varlen_runs_only_on_cuda_in_half_precision(device, dtype, head_dim, expected):
    assert attention.runs_varlen(device, dtype, head_dim) is expected
    assert model.attention_pads(device, dtype, head_dim) is not expected


def test_without_varlen_in_torch_cuda_pads(monkeypatch):
    monkeypatch.setattr(attention, "varlen_attn", None)
    assert not attention.runs_varlen(CUDA, torch.bfloat16, 64)
    assert model.attention_pads(CUDA, torch.bfloat16)


def test_cumulative_lengths_and_longest():
    packing = Packing.from_lengths([5, 17, 3])
    assert packing.cu_seqlens.dtype == torch.int32 and packing.cu_seqlens.tolist() == [0, 5, 22, 25]
    assert packing.max_length == 17
    moved = packing.to(torch.device("cpu"))
    assert moved.cu_seqlens.tolist() == [0, 5, 22, 25] and moved.max_length == 17
    assert Packing.from_lengths([4]).cu_seqlens.tolist() == [0, 4]


def test_packed_path_calls_varlen_with_the_packed_layout(monkeypatch):
    """Where varlen runs, every layer hands it (N, nh, hd) q/k/v and the batch's cu_seqlens, and its answer is
    the model's. A stand-in computes varlen's contract (each sequence attends to itself) with SDPA on CPU,
    so the result must equal the padded path's."""
    calls = []

    def fake_varlen(q, k, v, cu_q, cu_k, max_q, max_k):
        calls.append((q.shape, cu_q.tolist(), max_q))
        assert cu_q is cu_k and max_q == max_k
        out = torch.empty_like(q)
        bounds = cu_q.tolist()
        for start, stop in zip(bounds, bounds[1:]):
            heads = lambda t: t[start:stop].transpose(0, 1)[None]  # noqa: E731  (1, nh, L, hd)
            attended = torch.nn.functional.scaled_dot_product_attention(heads(q), heads(k), heads(v))
            out[start:stop] = attended[0].transpose(0, 1)
        return out

    monkeypatch.setattr(attention, "varlen_attn", fake_varlen)
    monkeypatch.setattr(attention, "runs_varlen", lambda device, dtype, head_dim: True)
    monkeypatch.setattr("model.bert.runs_varlen", attention.runs_varlen)
    ours = random_model(300)
    lengths = [9, 2, 30, 14]
    ids = [torch.randint(5, 300, (n,), generator=torch.Generator().manual_seed(n)) for n in lengths]
    width = max(lengths)
    padded_ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(padded_ids)
    for row, row_ids in enumerate(ids):
        padded_ids[row, : len(row_ids)], mask[row, : len(row_ids)] = row_ids, 1
    flat = torch.cat(ids)
    with torch.no_grad():
        packed = ours.encode_packed(flat, torch.zeros_like(flat), Packing.from_lengths(lengths))[1]
        padded, _ = ours.bert(padded_ids, torch.zeros_like(padded_ids), mask)
    config = ours.config
    assert len(calls) == config.num_hidden_layers
    assert calls[0] == ((sum(lengths), config.num_attention_heads, config.head_dim), [0, 9, 11, 41, 55], 30)
    torch.testing.assert_close(packed, padded[mask.bool()], rtol=0, atol=1e-5)


def test_training_with_attention_dropout_keeps_the_padded_path(monkeypatch):
    """varlen_attn has no dropout: a model training with attention dropout must not reach it."""
    monkeypatch.setattr(attention, "runs_varlen", lambda device, dtype, head_dim: True)
    monkeypatch.setattr("model.bert.runs_varlen", attention.runs_varlen)
    monkeypatch.setattr(attention, "varlen_attn", lambda *a: pytest.fail("varlen called while training with dropout"))
    ours = random_model(300, attention_probs_dropout_prob=0.1).train()
    flat = torch.randint(5, 300, (12,))
    ours.encode_packed(flat, torch.zeros_like(flat), Packing.from_lengths([5, 7]))


def test_a_cpu_process_loads_and_runs_a_model_without_importing_torch_dynamo(tiny_checkpoint):
    """torch.nn.attention.varlen imports torch._dynamo: some 2 s of every engine's, corpus job's and trainer's
    start-up on a CPU, where varlen never runs. It is imported on first use, where a batch could run it."""
    script = f"""
import sys, torch
import corpus.cli, service.engine.server, trainer.loop
from model import load_checkpoint
from model.packing import Packing
network = load_checkpoint({str(tiny_checkpoint)!r}).model
ids = torch.arange(5, 20)
with torch.no_grad():
    network.encode_packed(ids, torch.zeros_like(ids), Packing.from_lengths([6, 9]))
print(sorted(name for name in sys.modules if name.startswith("torch._dynamo"))[:3])
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"
