"""CUDA graphs of the encoder (service.engine.graphs) captured and replayed on the GPU, in bfloat16 and float16:
start-up captures one graph per bucket and checks it; then batches of every head, mixed lengths, a smaller
batch after a bigger one in the same memory, batches launched ahead of the last one's finish, answer as the
eager engine does. Skipped where they do not run
(no CUDA, torch without varlen attention, `python -m bench.gpu --dry-run` on the CPU); the same static path is
tested on the CPU in tests/service/test_graphs.py."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import model.attention as attention
from service.engine.engine import Engine
from service.engine.loader import capture_graphs
from tests.conftest import random_model
from tests.service.test_graphs import VOCAB, flat, items_of

DEVICE = torch.device(os.environ.get("BERT_TEST_DEVICE", "cuda"))
HEAD_DIM = 64
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE.type == "cuda" and not torch.cuda.is_available(), reason="no CUDA device here"),
    pytest.mark.skipif(not attention.runs_varlen(DEVICE, torch.bfloat16, HEAD_DIM),
                       reason=f"varlen attention does not run on {DEVICE} with torch {torch.__version__}"),
]
BATCHES = [(130, 5, 17, 9, 64, 3, 33, 40, 12, 7), (4, 6, 5), (64,), (60, 4), (150, 150, 90, 33, 21, 8, 8, 8)]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def assert_close(eager, graphed) -> None:
    """Graphed and eager results of one item agree as far as half precision lets them (the two run products of
    different shapes): fill-mask's best token among the eager top three and its scores within 0.02; vectors and
    logits at cosine 0.999."""
    assert type(eager) is type(graphed)
    if hasattr(eager, "masks"):
        for a, b in zip(eager.masks, graphed.masks):
            assert b.token_ids[0] in a.token_ids[:3] and np.allclose(a.scores, b.scores, atol=0.02)
    else:
        assert np.isfinite(flat(graphed)).all() and cosine(flat(eager), flat(graphed)) >= 0.999


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_replayed_batches_answer_as_eager_ones(dtype):
    model = random_model(VOCAB, hidden_size=2 * HEAD_DIM, num_attention_heads=2, intermediate_size=256,
                         max_position_embeddings=256, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    engine = Engine(model, DEVICE, dtype)
    batches = [items_of(lengths, seed) for seed, lengths in enumerate(BATCHES)]
    eager = [engine.run(engine.collate(items)) for items in batches]
    captured = capture_graphs(engine, 2048, 16, runners=1)
    assert captured > 0 and engine.graphs is not None and captured == len(engine.graphs.buckets)
    for items, expected in zip(batches, eager):
        batch = engine.collate(items)
        assert batch.staged is not None and batch.staged.is_pinned()
        for a, b in zip(expected, engine.run(batch)):
            assert_close(a, b)


def test_batches_launched_ahead_finish_with_their_own_answers():
    """The runner's order on a GPU: batch k+1 is launched (its graph replayed over the same memory) before batch k
    is finished; k's heads were queued before that replay, so k's results are its own."""
    model = random_model(VOCAB, hidden_size=2 * HEAD_DIM, num_attention_heads=2, intermediate_size=256,
                         max_position_embeddings=256, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    engine = Engine(model, DEVICE, torch.bfloat16)
    assert engine.overlaps
    batches = [items_of(lengths, seed) for seed, lengths in enumerate(BATCHES)]
    eager = [engine.run(engine.collate(items)) for items in batches]
    assert capture_graphs(engine, 2048, 16, runners=1) > 0
    launched = [engine.launch(engine.collate(items)) for items in batches]
    for expected, handle in zip(eager, launched):
        for a, b in zip(expected, engine.finish(handle)):
            assert_close(a, b)


def test_no_graphs_with_two_batches_at_once_or_in_float32():
    model = random_model(VOCAB, hidden_size=2 * HEAD_DIM, num_attention_heads=2, max_position_embeddings=256)
    assert capture_graphs(Engine(model, DEVICE, torch.bfloat16), 1024, 8, runners=2) == 0
    assert capture_graphs(Engine(model, DEVICE, torch.float32), 1024, 8, runners=1) == 0
