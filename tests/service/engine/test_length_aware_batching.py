"""Length-aware batching where attention pads (float32 on CUDA, or a torch without varlen attention): the
batcher's padding cap at its default keeps one long input out of a batch of short ones, as the engine prices
padding; where varlen attention runs (bfloat16/float16 on CUDA) padding costs nothing and they share a batch.

The engine's FLOP model, on CUDA: per_sequence = not model.attention_pads(device, dtype, head_dim)."""

from __future__ import annotations

import random
from functools import partial

import pytest
import torch

import model.attention as attention
from model import BertConfig, attention_pads
from model.flops import packed_batch_flops
from service.engine.batch_choice import choose_batch
from service.engine.batcher import BatchPolicy, Entry, Ticket
from service.settings import Settings

BERT_BASE = BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                       intermediate_size=3072)
CUDA = torch.device("cuda:0")


def first_batch(dtype: torch.dtype) -> list[int]:
    """Lengths in the first batch the default policy forms from 60 short inputs (the oldest first) and one
    of 300 word pieces, priced as a CUDA engine in `dtype` prices it."""
    lengths = [30] * 30 + [300] + [30] * 30
    ticket = Ticket(deadline=1e18, size=len(lengths), sink=None)
    queue = [Entry([1] * n, ticket, index) for index, n in enumerate(lengths)]
    per_sequence = not attention_pads(CUDA, dtype, BERT_BASE.head_dim)
    flops = partial(packed_batch_flops, BERT_BASE, attention_per_sequence=per_sequence)
    policy = BatchPolicy(max_batch_tokens=1 << 20, max_batch_size=128,
                         max_padding_fraction=Settings.model_fields["max_padding_fraction"].default)
    return sorted(e.length for e in choose_batch(queue, policy, flops))


def test_float32_on_cuda_keeps_the_long_input_apart():
    assert first_batch(torch.float32) == [30] * 60


@pytest.mark.skipif(attention.varlen_kernel() is None, reason="this torch has no torch.nn.attention.varlen")
def test_varlen_on_cuda_mixes_lengths_freely():
    assert first_batch(torch.bfloat16) == [30] * 60 + [300]


def test_without_varlen_bfloat16_on_cuda_is_length_aware_too(monkeypatch):
    monkeypatch.setattr(attention, "varlen_attn", None)
    assert first_batch(torch.bfloat16) == [30] * 60


@pytest.mark.parametrize("seed", range(4))
def test_unpriced_batches_are_the_batches_zero_padding_pricing_makes(seed):
    """An engine whose attention never pads (varlen) lets the batcher skip pricing (`flops` None): the batches
    must be those that pricing every candidate at zero padding forms, batch after batch, within every cap."""
    rng = random.Random(seed)
    lengths = [rng.randint(3, 300) for _ in range(300)]
    ticket = Ticket(deadline=1e18, size=len(lengths), sink=None)
    priced = partial(packed_batch_flops, BERT_BASE, attention_per_sequence=True)
    policy = BatchPolicy(max_batch_tokens=4096, max_batch_size=64, max_padding_fraction=0.10)
    queues = {way: [Entry([1] * n, ticket, i) for i, n in enumerate(lengths)] for way in ("priced", "unpriced")}
    while queues["priced"]:
        batches = {}
        for way, queue in queues.items():
            chosen = choose_batch(queue, policy, priced if way == "priced" else None)
            queues[way] = [e for e in queue if all(e is not c for c in chosen)]
            batches[way] = [e.index for e in chosen]
        assert batches["priced"] == batches["unpriced"]
        assert len(batches["priced"]) <= 64 and max(lengths[i] for i in batches["priced"]) * len(
            batches["priced"]) <= 4096
    assert not queues["unpriced"]
