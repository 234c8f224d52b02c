"""The static-shape path of CUDA graphs (service.engine.graphs), run on the CPU: every batch padded to a bucket
of tokens and a fixed number of sequence slots, its inputs staged in one buffer, the encoder called on the
buffer's views (what a graph replays on a GPU). Attention there is FlashAttention over packed sequences; here
a reference of it in plain PyTorch that leaves the rows of no sequence NaN, so that any padding row read by a
head would show. Compared with the engine's eager path, item by item; the capture itself is tested on a GPU
(tests/gpu/test_cuda_graphs.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import model.attention as attention
import model.bert as bert
from model.packing import Packing
from service.engine.engine import Engine
from service.engine.graphs import EncoderGraphs, Layout, stage, token_buckets
from service.engine.graph_check import check_lengths, disagreement
from service.engine.loader import adopt_if_faithful, capture_graphs
from service.tasks import EncodeItem, FillMaskItem, NspItem
from tests.conftest import random_model

VOCAB = 300


def reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k):
    """FlashAttention's varlen contract on the CPU: each sequence attends to itself; rows of no sequence are
    not written (NaN here)."""
    out = torch.full_like(q, float("nan"))
    bounds = cu_q.tolist()
    assert bounds == cu_k.tolist() and max(b - a for a, b in zip(bounds, bounds[1:])) <= max_q
    for start, end in zip(bounds, bounds[1:]):
        if end > start:
            heads = [t[start:end].transpose(0, 1)[None] for t in (q, k, v)]  # (1, nh, L, hd)
            out[start:end] = F.scaled_dot_product_attention(*heads)[0].transpose(0, 1)
    return out


@pytest.fixture
def static_path(monkeypatch):
    """Patch in packed attention for the CPU; returns a function that gives an engine graphs of its own."""
    monkeypatch.setattr(attention, "varlen_attn", reference_varlen)
    monkeypatch.setattr(bert, "runs_varlen", lambda *args: True)

    def with_graphs(engine: Engine, most_tokens: int, slots: int) -> EncoderGraphs:
        graphs = EncoderGraphs(engine.model, engine.device, most_tokens, slots, capture=False)
        graphs.capture_all()
        engine.use_graphs(graphs)
        return graphs
    return with_graphs


def engine_for(**overrides) -> Engine:
    return Engine(random_model(VOCAB, max_position_embeddings=160, **overrides), torch.device("cpu"), torch.float32)


def items_of(lengths, seed: int) -> list:
    """A mix of every head's items, of the given lengths."""
    generator = np.random.default_rng(seed)
    items = []
    for n, length in enumerate(lengths):
        ids = [1, *generator.integers(5, VOCAB, length - 2).tolist(), 2]
        types = [0] * length
        kind = n % 5
        if kind == 0:
            items.append(EncodeItem(ids, types, pooling="none"))
        elif kind == 1:
            items.append(EncodeItem(ids, types, pooling="mean", normalize=True))
        elif kind == 2:
            items.append(EncodeItem(ids, types, pooling="cls"))
        elif kind == 3:  # every other one scores chosen tokens only
            targets = [7, 11, 19, 23, 42] if n % 2 else None
            items.append(FillMaskItem(ids, types, mask_positions=[1, length - 2], top_k=4, target_ids=targets))
        else:
            items.append(NspItem(ids, [0] * (length // 2) + [1] * (length - length // 2)))
    return items


def flat(result) -> np.ndarray:
    """A result's numbers, whatever its kind."""
    if hasattr(result, "masks"):
        return np.concatenate([np.concatenate([m.token_ids.astype(np.float64), m.scores]) for m in result.masks])
    value = next(v for v in vars(result).values() if isinstance(v, np.ndarray))
    return value.astype(np.float64).ravel()


def assert_same(eager: list, graphed: list) -> None:
    assert len(eager) == len(graphed)
    for a, b in zip(eager, graphed):
        assert type(a) is type(b)
        assert np.isfinite(flat(b)).all(), "a padding row reached a result"
        np.testing.assert_allclose(flat(b), flat(a), rtol=1e-4, atol=1e-5)


def test_buckets_cover_every_count_with_little_padding():
    for most in (16384, 1000, 64, 100):
        buckets = token_buckets(most)
        assert buckets == sorted(set(buckets)) and buckets[-1] == most and buckets[0] == min(64, most)
        for tokens in range(1, most + 1):
            bucket = next(b for b in buckets if b >= tokens)
            assert bucket - tokens < 64 or bucket - tokens <= tokens / 8, (most, tokens, bucket)
    assert len(token_buckets(16384)) <= 50  # what start-up captures


def test_staged_layout():
    packing = Packing.from_lengths([3, 5])
    ids, types = np.arange(10, 18), np.array([0, 0, 0, 0, 0, 1, 1, 1])
    layout = Layout(tokens=64, slots=4)
    ids_at, types_at, positions, rows, ends, starts = layout.views(stage(ids, types, packing, layout, pin=False))
    assert ids_at[:8].tolist() == ids.tolist() and not ids_at[8:].any() and types_at[:8].tolist() == types.tolist()
    assert positions[:8].tolist() == [0, 1, 2, 0, 1, 2, 3, 4] and rows[:8].tolist() == [0, 0, 0, 1, 1, 1, 1, 1]
    assert ends.tolist() == [0, 3, 8, 8, 8] and starts.tolist() == [0, 3, 0, 0]  # empty slots: end where the last does


def test_graphed_batches_equal_eager_ones(static_path):
    engine = engine_for()
    batches = [items_of(lengths, seed) for seed, lengths in enumerate(
        [(130, 5, 17, 9, 64, 3, 33, 40, 12, 7), (4, 6, 5), (64,), (60, 4), (150, 150, 90, 33, 21, 8, 8, 8)])]
    eager = [engine.run(engine.collate(items)) for items in batches]
    graphs = static_path(engine, most_tokens=1024, slots=16)
    for items, expected in zip(batches, eager):  # after a bigger batch, a smaller one in the same memory
        batch = engine.collate(items)
        assert batch.layout is not None and batch.layout.tokens >= batch.real_tokens
        assert_same(expected, engine.run(batch))
    assert len(graphs) == len(graphs.buckets)


def test_graphs_split_below_a_lower_embedding_layer(static_path):
    engine = engine_for(num_hidden_layers=3, embedding_layer=2)
    items = items_of((20, 9, 31, 6, 12, 40), seed=7)
    encode_only = [i for i in items if isinstance(i, EncodeItem)]
    eager = [engine.run(engine.collate(part)) for part in (items, encode_only)]
    graphs = static_path(engine, most_tokens=256, slots=8)
    assert len(graphs) == 2 * len(graphs.buckets)  # the embedding layer's depth, and the whole stack for heads
    for part, expected in zip((items, encode_only), eager):
        assert_same(expected, engine.run(engine.collate(part)))


def test_batches_that_fit_no_graph_run_eagerly(static_path):
    engine = engine_for()
    items = items_of((20,) * 5, seed=3)
    expected = engine.run(engine.collate(items))
    static_path(engine, most_tokens=128, slots=4)
    too_many = engine.collate(items)  # five sequences, four slots
    too_long = engine.collate([EncodeItem([1] + [7] * 140 + [2], [0] * 142)])  # over the largest bucket
    assert too_many.staged is None and too_long.staged is None
    assert_same(expected, engine.run(too_many))
    assert engine.collate(items[:4]).staged is not None


def test_no_graphs_on_a_cpu():
    engine = engine_for()
    assert capture_graphs(engine, 1024, 16, runners=1) == 0 and engine.graphs is None


def test_batches_launched_ahead_finish_with_their_own_answers(static_path):
    """As the runner does on a GPU: the next batch is launched (and its graph replayed) before the last one is
    finished; each batch's results come from its own outputs."""
    engine = engine_for()
    batches = [items_of(lengths, seed) for seed, lengths in enumerate([(40, 9, 17, 5, 30), (12, 7, 60), (33,) * 4])]
    eager = [engine.run(engine.collate(items)) for items in batches]
    static_path(engine, most_tokens=512, slots=8)
    launched = [engine.launch(engine.collate(items)) for items in batches]
    for expected, handle in zip(eager, launched):
        assert_same(expected, engine.finish(handle))


def test_graphed_batches_and_their_padding_rows_are_counted(static_path):
    from service.metrics import Metrics

    engine = engine_for()
    eager = engine.collate(items_of((20, 9), seed=1))
    static_path(engine, most_tokens=512, slots=8)
    graphed = engine.collate(items_of((20, 9, 40), seed=2))
    metrics = Metrics()
    for batch in (eager, graphed):
        metrics.observe_batch(0.01, batch)
    text = metrics.render().decode()
    assert "bert_batches_graphed_total 1.0" in text
    assert f"bert_graph_padding_rows_total {float(128 - 69)}" in text  # 69 tokens padded up to the 128 bucket


def graphs_for(engine: Engine, most_tokens: int = 512, slots: int = 8) -> EncoderGraphs:
    graphs = EncoderGraphs(engine.model, engine.device, most_tokens, slots, capture=False)
    graphs.capture_all()
    return graphs


def corrupt(graphs: EncoderGraphs, key, monkeypatch, output: int = 0, fail: bool = False) -> None:
    """Make one graph's replay drift (its `output`: 0 the embedding-layer states, 1 the last layer's) or raise."""
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
    metrics.observe_graphs(graphs.live, list(engine.graphs_fallen_back))
    text = metrics.render().decode()
    assert 'bert_cuda_graph_live{graph="64x8"} 0.0' in text and 'bert_cuda_graph_live{graph="512x8"} 1.0' in text


class LateReader(Engine):
    """An engine that reads a graphed batch's states when it finishes the batch, not when it launches it: the
    order that would be wrong on a GPU, where the next launched batch's replay overwrites those states."""

    @torch.inference_mode()
    def launch(self, batch):
        embedded, hidden, packing = self.graphs.replay(batch.staged, batch.layout, batch.real_tokens, batch.size,
                                                       self._runs_heads(batch.items))
        return batch, embedded, hidden, packing

    @torch.inference_mode()
    def finish(self, launched):
        from service.engine.heads import launch_heads

        batch, embedded, hidden, packing = launched
        results = [None] * batch.size
        for collect in launch_heads(self.model, batch.items, embedded, hidden, packing, batch.starts()):
            collect(results)
        return results


def test_the_launch_ahead_test_catches_a_batch_read_too_late(static_path):
    """The stand-in overwrites a graph's outputs at every replay as a CUDA graph does: an engine that reads a batch
    after the next one was launched answers with the wrong states, and the comparison of the launch-ahead test
    fails on the CPU."""
    model = random_model(VOCAB, max_position_embeddings=160)
    plain, engine = Engine(model, torch.device("cpu"), torch.float32), LateReader(model, torch.device("cpu"),
                                                                                 torch.float32)
    batches = [items_of(lengths, seed) for seed, lengths in enumerate([(40, 9, 17, 5, 30), (12, 7, 60, 22)])]
    eager = [plain.run(plain.collate(items)) for items in batches]  # one bucket: 101 tokens each
    static_path(engine, most_tokens=512, slots=8)
    launched = [engine.launch(engine.collate(items)) for items in batches]
    with pytest.raises(AssertionError):
        for expected, handle in zip(eager, launched):
            assert_same(expected, engine.finish(handle))


def test_start_up_reports_live_and_fallen_back_graphs(static_path, monkeypatch, tiny_checkpoint):
    """load_engine: what the check kept and dropped reaches the facts (/info) and /metrics."""
    import service.engine.loader as loader
    from service.metrics import Metrics
    from service.settings import Settings

    def stand_in_graphs(engine, most_tokens, slots, runners):
        graphs = graphs_for(engine, most_tokens=256, slots=8)
        corrupt(graphs, (128, True), monkeypatch)
        return adopt_if_faithful(engine, graphs)
    monkeypatch.setattr(loader, "capture_graphs", stand_in_graphs)
    metrics = Metrics()
    loaded = loader.load_engine(Settings(checkpoint=tiny_checkpoint, device="cpu"), metrics)
    try:
        facts = loaded.facts
        assert facts.cuda_graphs == 3 and facts.cuda_graphs_live == ["64x8", "192x8", "256x8"]
        assert facts.cuda_graphs_eager[0].startswith("128x8: token vectors drift")
        assert 'bert_cuda_graph_live{graph="128x8"} 0.0' in metrics.render().decode()
    finally:
        loaded.batcher.stop()


def test_the_gpu_tests_fill_mask_comparison_on_the_cpu(static_path):
    """tests/gpu's comparison of fill-mask (the bundled model's best token on its confident cloze answers), run here
    through the stand-in graphs: it passes on batches replayed and launched ahead, and fails on a batch read late."""
    from model.checkpoint import load_checkpoint
    from tests.gpu.confident import CHECKPOINT, assert_same_fill_mask, cloze_items

    checkpoint = load_checkpoint(CHECKPOINT)
    engine = Engine(checkpoint.model, torch.device("cpu"), torch.float32)
    batches = [cloze_items(checkpoint.tokenizer, copies) for copies in (2, 1)]
    eager = [engine.run(engine.collate(items)) for items in batches]
    static_path(engine, most_tokens=1024, slots=128)
    launched = [engine.launch(engine.collate(items)) for items in batches]
    for expected, handle in zip(eager, launched, strict=True):
        assert assert_same_fill_mask(expected, engine.finish(handle)) >= 10

    late = LateReader(checkpoint.model, torch.device("cpu"), torch.float32)
    static_path(late, most_tokens=1024, slots=128)
    same_bucket = [cloze_items(checkpoint.tokenizer)[::-1], cloze_items(checkpoint.tokenizer)]  # one bucket, two orders
    expected = engine.run(engine.collate(same_bucket[0]))
    handles = [late.launch(late.collate(items)) for items in same_bucket]
    with pytest.raises(AssertionError):
        assert_same_fill_mask(expected, late.finish(handles[0]))
