"""CUDA graphs of the encoder (service.engine.graphs) captured and replayed on the GPU, in bfloat16 and float16:
start-up captures one graph per bucket and checks it; then batches of every head, mixed lengths, a smaller
batch after a bigger one in the same memory, batches launched ahead of the last one's finish, answer as the
eager engine does. Skipped where they do not run
(no CUDA, torch without varlen attention, `python -m bench.gpu --dry-run` on the CPU); the same static path is
tested on the CPU in tests/service/engine/test_graphs.py."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import model.attention as attention
from service.engine.engine import Engine
from service.engine.loader import capture_graphs
from model.checkpoint import load_checkpoint
from tests.conftest import random_model
from tests.gpu.confident import CHECKPOINT, assert_same_fill_mask, cloze_items
from tests.service.engine.test_graphs import VOCAB, flat, items_of

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
    different shapes): the same shapes first; vectors and logits at cosine 0.999; a random model's fill-mask (no
    confident answer: the best tokens may swap) by the scores of the tokens both name, relatively (within 0.05 nats).
    Fill-mask's best token is compared on a trained model's confident answers (tests/gpu/confident.py)."""
    assert type(eager) is type(graphed)
    if hasattr(eager, "masks"):
        assert len(graphed.masks) == len(eager.masks)
        for a, b in zip(eager.masks, graphed.masks, strict=True):
            assert a.position == b.position and len(a.token_ids) == len(b.token_ids) == len(b.scores)
            shared = {int(t): s for t, s in zip(a.token_ids, a.scores)}
            both = [(shared[int(t)], s) for t, s in zip(b.token_ids, b.scores) if int(t) in shared]
            assert len(both) >= len(a.token_ids) // 2, (a.token_ids, b.token_ids)
            assert all(abs(np.log(x) - np.log(y)) <= 0.05 for x, y in both), both
    else:
        a, b = flat(eager), flat(graphed)
        assert a.shape == b.shape and np.isfinite(b).all() and cosine(a, b) >= 0.999


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_replayed_batches_answer_as_eager_ones(dtype):
    model = random_model(VOCAB, hidden_size=2 * HEAD_DIM, num_attention_heads=2, intermediate_size=256,
                         max_position_embeddings=256, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    engine = Engine(model, DEVICE, dtype)
    batches = [items_of(lengths, seed) for seed, lengths in enumerate(BATCHES)]
    eager = [engine.run(engine.collate(items)) for items in batches]
    captured = capture_graphs(engine, 2048, 16, runners=1)
    assert captured > 0 and engine.graphs is not None and captured == len(engine.graphs.buckets)
    assert engine.graphs_fallen_back == {}, engine.graphs_fallen_back  # the start-up check kept every graph
    for items, expected in zip(batches, eager):
        batch = engine.collate(items)
        assert batch.staged is not None and batch.staged.is_pinned()
        graphed = engine.run(batch)
        assert len(graphed) == len(expected)
        for a, b in zip(expected, graphed, strict=True):
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
    for expected, handle in zip(eager, launched, strict=True):
        graphed = engine.finish(handle)
        assert len(graphed) == len(expected)
        for a, b in zip(expected, graphed, strict=True):
            assert_close(a, b)


def test_no_graphs_with_two_batches_at_once_or_in_float32():
    model = random_model(VOCAB, hidden_size=2 * HEAD_DIM, num_attention_heads=2, max_position_embeddings=256)
    assert capture_graphs(Engine(model, DEVICE, torch.bfloat16), 1024, 8, runners=2) == 0
    assert capture_graphs(Engine(model, DEVICE, torch.float32), 1024, 8, runners=1) == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_replayed_fill_mask_gives_the_eager_best_token_where_the_model_is_confident(dtype):
    """The bundled model on the cloze probe: through CUDA graphs, and launched ahead of the last batch's finish, the
    same best token as the eager engine on every confident mask (tests/gpu/confident.py)."""
    checkpoint = load_checkpoint(CHECKPOINT)
    engine = Engine(checkpoint.model, DEVICE, dtype)
    batches = [cloze_items(checkpoint.tokenizer, copies) for copies in (3, 1, 2)]  # a bigger bucket, then smaller
    eager = [engine.run(engine.collate(items)) for items in batches]
    assert capture_graphs(engine, 2048, 128, runners=1) > 0 and engine.graphs_fallen_back == {}
    for items, expected in zip(batches, eager, strict=True):
        batch = engine.collate(items)
        assert batch.staged is not None
        assert_same_fill_mask(expected, engine.run(batch))
    launched = [engine.launch(engine.collate(items)) for items in batches]
    for expected, handle in zip(eager, launched, strict=True):
        assert_same_fill_mask(expected, engine.finish(handle))


def test_the_start_up_check_drops_a_drifting_graph_alone():
    """A real CUDA graph whose outputs are spoilt after its replay: the check drops it, keeps the others, and its
    bucket's batches run eagerly and answer right."""
    from service.engine.graphs import EncoderGraphs
    from service.engine.loader import adopt_if_faithful

    checkpoint = load_checkpoint(CHECKPOINT)
    engine = Engine(checkpoint.model, DEVICE, torch.bfloat16)
    items = cloze_items(checkpoint.tokenizer)
    eager = engine.run(engine.collate(items))
    graphs = EncoderGraphs(engine.model, engine.device, 2048, 64)
    graphs.capture_all()
    tokens = engine.collate(items).real_tokens
    key = (next(b for b in graphs.buckets if b >= tokens), True)
    graph, outputs = graphs.graphs[key]

    class Spoilt:
        def replay(self):
            graph.replay()
            outputs[0].mul_(-1)
    graphs.graphs[key] = (Spoilt(), outputs)
    assert adopt_if_faithful(engine, graphs) == len(graphs.buckets) - 1
    assert list(engine.graphs_fallen_back) == [graphs.name(key)]
    batch = engine.collate(items)
    assert batch.staged is None
    assert_same_fill_mask(eager, engine.run(batch))
