"""The start-up check of CUDA graphs (service.engine.graph_check, service.engine.loader.adopt_if_faithful), on the
CPU through the stand-in graphs of tests/service/engine/test_graphs.py: every graph replayed on a batch that fills it and
compared with the eager engine through the heads it feeds; a capture that raises, a replay that raises or drifts,
dropped alone; what was kept and dropped in the log, the model's facts (/info) and /metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from service.engine.engine import Engine
from service.engine.graph_check import check_lengths, disagreement
from service.engine.graphs import EncoderGraphs
from service.engine.loader import adopt_if_faithful
from tests.conftest import random_model
from tests.service.engine.test_graphs import VOCAB, assert_same, engine_for, items_of, static_path  # noqa: F401 (a fixture)


def graphs_for(engine: Engine, most_tokens: int = 512, slots: int = 8) -> EncoderGraphs:
    graphs = EncoderGraphs(engine.model, engine.device, most_tokens, slots, capture=False)
    graphs.capture_all()
    return graphs


def corrupt(graphs: EncoderGraphs, key, monkeypatch, output: int = 0, fail: bool = False) -> None:
    """Make one graph's replay drift (its `output`: 0 the embedding-layer states, 1 the last layer's, 3 and 4 the
    next-sentence and classifier logits it computes) or raise."""
    stand_in = graphs.graphs[key][0]
    replay = stand_in.replay

    def wrong():
        if fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        replay()
        stand_in.outputs[output].copy_(stand_in.outputs[output].flip(-1))
    monkeypatch.setattr(stand_in, "replay", wrong)


def test_fill_lengths_fill_each_graph():
    for tokens, slots, longest in ((64, 256, 512), (16384, 256, 512), (512, 8, 160), (4096, 4, 160), (128, 8, 16)):
        lengths = check_lengths(tokens, slots, longest)
        assert len(lengths) == min(slots, tokens // 3) and all(3 <= n <= longest for n in lengths)
        assert sum(lengths) == min(tokens, len(lengths) * longest)
        if 3 * len(lengths) < sum(lengths) < len(lengths) * longest:
            assert len(set(lengths)) > 1  # long and short side by side


def test_every_graph_is_checked_and_adopted_when_faithful(static_path, caplog):
    caplog.set_level("INFO", logger="service")
    engine = engine_for()
    graphs = graphs_for(engine)
    assert adopt_if_faithful(engine, graphs) == len(graphs) == len(graphs.buckets) and engine.graphs is graphs
    assert graphs.eager == {} and "8 of 8 live" in caplog.text


def test_a_drifting_graph_is_dropped_alone_and_its_batches_run_eagerly(static_path, monkeypatch, caplog):
    engine = engine_for()
    items = items_of((20, 9, 40), seed=2)  # 69 tokens: the 128 bucket
    expected = engine.run(engine.collate(items))
    graphs = graphs_for(engine)
    corrupt(graphs, (128, True), monkeypatch)
    assert adopt_if_faithful(engine, graphs) == len(graphs.buckets) - 1 and engine.graphs is graphs
    assert list(graphs.eager) == ["128x8"] and "token vectors drift" in graphs.eager["128x8"]
    assert "CUDA graph 128x8 falls back to eager: token vectors drift" in caplog.text
    batch = engine.collate(items)
    assert batch.staged is None  # its bucket's graph is gone: eager
    assert_same(expected, engine.run(batch))
    assert engine.collate(items_of((20, 9, 200), seed=2)).layout.tokens == 256  # the others still replay


def test_a_replay_that_raises_drops_that_graph_alone(static_path, monkeypatch):
    engine = engine_for()
    graphs = graphs_for(engine)
    corrupt(graphs, (512, True), monkeypatch, fail=True)
    assert adopt_if_faithful(engine, graphs) == len(graphs.buckets) - 1
    assert graphs.eager["512x8"].startswith("replay failed: RuntimeError: operation not permitted")


def test_a_capture_that_raises_drops_that_graph_alone(static_path, monkeypatch):
    engine = engine_for()
    graphs = EncoderGraphs(engine.model, engine.device, 512, 8, capture=False)
    record = graphs._record

    def failing(layout, for_heads):
        if layout.tokens == 256:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
        return record(layout, for_heads)
    monkeypatch.setattr(graphs, "_record", failing)
    graphs.capture_all()
    assert adopt_if_faithful(engine, graphs) == len(graphs.buckets) - 1
    assert graphs.eager["256x8"].startswith("capture failed: RuntimeError: CUDA error")
    assert engine.collate(items_of((100, 90, 40), seed=4)).staged is None  # 230 tokens: the 256 bucket, eager


def test_a_graph_feeding_the_heads_is_checked_through_each_head(static_path, monkeypatch):
    """With a split (embedding layer below the top), the graph of the whole stack feeds fill-mask, NSP and the
    classifier only: its drift shows in their answers, and drops it alone (the embedding-layer graph stays)."""
    model = random_model(VOCAB, max_position_embeddings=160, num_hidden_layers=3, embedding_layer=2)
    classifier = torch.nn.Linear(model.config.hidden_size, 3)
    model.classifier = classifier
    engine = Engine(model, torch.device("cpu"), torch.float32)
    assert engine.has_mlm_head and engine.has_nsp_head and engine.num_labels == 3
    graphs = graphs_for(engine, most_tokens=256)
    corrupt(graphs, (192, True), monkeypatch, output=1)  # the last layer's states of the 192 bucket
    assert adopt_if_faithful(engine, graphs) == 2 * len(graphs.buckets) - 1
    assert list(graphs.eager) == ["192x8:heads"] and "drifts" in graphs.eager["192x8:heads"]
    assert "192x8:embedding" in graphs.live


@pytest.mark.parametrize("output, kind", [(3, "nsp"), (4, "classify")])
def test_a_graph_whose_cls_head_logits_drift_is_dropped(static_path, monkeypatch, output, kind):
    """The whole stack's graphs compute the [CLS] heads' logits themselves (a reranker's scores): a graph whose
    next-sentence or classifier logits come out wrong fails the check alone, through that head."""
    model = random_model(VOCAB, max_position_embeddings=160)
    model.classifier = torch.nn.Linear(model.config.hidden_size, 3)
    engine = Engine(model, torch.device("cpu"), torch.float32)
    graphs = graphs_for(engine)
    corrupt(graphs, (128, True), monkeypatch, output=output)
    assert adopt_if_faithful(engine, graphs) == len(graphs.buckets) - 1
    assert list(graphs.eager) == ["128x8"] and graphs.eager["128x8"].startswith(f"{kind} drifts")


@pytest.mark.parametrize("spoil", ["direction", "length"])
def test_a_graph_whose_pooled_vectors_drift_is_dropped(static_path, monkeypatch, spoil):
    """The graphs pool the states themselves (every variant, service/engine/pooling.py): a graph whose pooled vectors
    point elsewhere, or have another length (the normalised ones no longer of length 1), fails the check alone."""
    engine = engine_for()
    graphs = graphs_for(engine)
    stand_in = graphs.graphs[128, True][0]
    replay = stand_in.replay

    def wrong():
        replay()
        pooled = stand_in.outputs[2]
        pooled.copy_(pooled.flip(-1) if spoil == "direction" else pooled * 1.1)
    monkeypatch.setattr(stand_in, "replay", wrong)
    assert adopt_if_faithful(engine, graphs) == len(graphs.buckets) - 1
    assert list(graphs.eager) == ["128x8"]
    assert graphs.eager["128x8"].startswith("pooled vectors drift" if spoil == "direction"
                                            else "pooled vectors' lengths drift")


def test_the_check_sees_each_head_drift():
    """disagreement() compares every kind of answer: one head's drift alone fails the batch."""
    from service.tasks import ClassLogits, MaskScores, FillMaskScores, NspLogits, TokenVectors

    generator = np.random.default_rng(0)
    vectors = [TokenVectors(generator.normal(size=(5, 8)).astype(np.float32)) for _ in range(3)]
    ids = np.arange(10, 42)
    masks = [FillMaskScores([MaskScores(1, ids, generator.dirichlet(np.ones(32)))]) for _ in range(3)]
    nsp = [NspLogits(generator.normal(size=2)) for _ in range(3)]
    labels = [ClassLogits(generator.normal(size=3)) for _ in range(3)]
    eager = vectors + masks + nsp + labels
    assert disagreement(eager, eager)[0] is None
    assert "3 results for" in disagreement(eager, eager[:3])[0]
    for first, kind in ((3, "fill-mask"), (6, "nsp"), (9, "classify")):
        wrong = list(eager)
        for n in range(first, first + 3):
            if kind == "fill-mask":
                mask = eager[n].masks[0]
                wrong[n] = FillMaskScores([MaskScores(1, mask.token_ids, mask.scores[::-1].copy())])
            else:
                wrong[n] = type(eager[n])(-eager[n].logits)
        assert disagreement(eager, wrong)[0].startswith(f"{kind} drifts"), kind


def test_graph_states_reach_metrics_and_model_facts(static_path, monkeypatch):
    from service.metrics import Metrics

    engine = engine_for()
    graphs = graphs_for(engine)
    corrupt(graphs, (64, True), monkeypatch)
    adopt_if_faithful(engine, graphs)
    metrics = Metrics()
    metrics.for_model("m").observe_graphs(graphs.live, list(engine.graphs_fallen_back))
    text = metrics.render().decode()
    assert 'bert_cuda_graph_live{graph="64x8",model="m"} 0.0' in text
    assert 'bert_cuda_graph_live{graph="512x8",model="m"} 1.0' in text


def test_start_up_reports_live_and_fallen_back_graphs(static_path, monkeypatch, tiny_checkpoint):
    """The service's start-up: what the check kept and dropped reaches the facts (/info) and /metrics."""
    import service.engine.loader as loader
    from service.engine.models import load_models
    from service.metrics import Metrics
    from service.settings import Settings

    def stand_in_graphs(engine, most_tokens, slots, runners):
        graphs = graphs_for(engine, most_tokens=256, slots=8)
        corrupt(graphs, (128, True), monkeypatch)
        return adopt_if_faithful(engine, graphs)
    monkeypatch.setattr(loader, "capture_graphs", stand_in_graphs)
    metrics = Metrics()
    models = load_models(Settings(checkpoint=tiny_checkpoint, device="cpu"), metrics)
    try:
        facts = models.facts[0]
        assert facts.cuda_graphs == 3 and facts.cuda_graphs_live == ["64x8", "192x8", "256x8"]
        assert facts.cuda_graphs_eager[0].startswith("128x8: token vectors drift")
        assert 'bert_cuda_graph_live{graph="128x8",model="tiny"} 0.0' in metrics.render().decode()
    finally:
        models.stop()
