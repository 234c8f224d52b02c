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
from torch.overrides import TorchFunctionMode

import model.attention as attention
import model.bert as bert
from model.packing import Packing
from service.engine.engine import Engine
from service.engine.graphs import EncoderGraphs, Layout, StandIn, stage, token_buckets
from service.engine.loader import capture_graphs
from service.tasks import ClassifyItem, EncodeItem, FillMaskItem, NspItem
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


class TorchCalls(TorchFunctionMode):
    """The torch calls made while it is entered, by name, but for those inside a stand-in graph's replay (one call to
    a CUDA graph) and the views and reads that stay in the interpreter (indexing, sizes, `.numpy()`)."""

    KEPT_IN = {"__get__", "__getitem__", "numpy", "__len__", "dim", "size"}

    def __init__(self, monkeypatch):
        super().__init__()
        self.names: list[str] = []
        self.replaying = False
        replay = StandIn.replay

        def uncounted(stand_in):
            self.replaying = True
            try:
                replay(stand_in)
            finally:
                self.replaying = False
        monkeypatch.setattr(StandIn, "replay", uncounted)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if not self.replaying and name not in self.KEPT_IN:
            self.names.append(name)
        return func(*args, **(kwargs or {}))


def test_embedding_batches_are_pooled_in_the_replay(static_path, monkeypatch):
    """An embedding batch's vectors, every pooling and normalisation, come pooled out of the replay and equal the eager
    engine's; the padding rows (NaN here) and the unused slots reach none of them. Its launch makes no torch call but
    the copy in and the copy down besides the replay (on a GPU each call gives the interpreter up: pooling after the
    replay took seven more for a normalised mean)."""
    from service.engine.pooling import POOLED

    engine = engine_for()
    generator = np.random.default_rng(5)
    variants = [("none", False), *POOLED]
    lengths = (3, 40, 17, 90, 6, 11, 1)
    items = [EncodeItem([1, *generator.integers(5, VOCAB, n).tolist(), 2], [0] * (n + 2), pooling=pooling,
                        normalize=normalize) for n, (pooling, normalize) in zip(lengths, variants * 2)]
    parts = [items] + [[EncodeItem(item.input_ids, item.token_type_ids, pooling=pooling, normalize=normalize)
                        for item in items] for pooling, normalize in POOLED]
    eager = [engine.run(engine.collate(part)) for part in parts]
    static_path(engine, most_tokens=512, slots=16)
    for part, expected in zip(parts, eager):
        batch = engine.collate(part)
        assert batch.staged is not None and not batch.runs_heads
        with TorchCalls(monkeypatch) as calls:
            handle = engine.launch(batch)
        # the mixed batch: its token vectors made float32, and one copy down for each of its five variants
        assert calls.names == (["copy_", "float"] + ["to"] * 5 if part is items else ["copy_", "to"]), calls.names
        assert_same(expected, engine.finish(handle))
    normalized = engine.run(engine.collate(parts[-1]))
    assert all(abs(np.linalg.norm(result.vector) - 1) < 1e-5 for result in normalized)


def test_cls_head_batches_are_scored_in_the_replay(static_path, monkeypatch):
    """A rerank (sequence classifier) or next-sentence batch's logits come out of the whole stack's replay, computed
    for every slot, and equal the eager engine's; its launch makes no torch call but the copy in and one copy down a
    head (the head run after the replay took six more)."""
    model = random_model(VOCAB, max_position_embeddings=160)
    model.classifier = torch.nn.Linear(model.config.hidden_size, 3)  # a sequence classifier beside the NSP head
    engine = Engine(model, torch.device("cpu"), torch.float32)
    generator = np.random.default_rng(6)
    pairs = [[1, *generator.integers(5, VOCAB, n).tolist(), 2] for n in (5, 30, 12, 61, 8)]
    types = [[0] * (len(ids) // 2) + [1] * (len(ids) - len(ids) // 2) for ids in pairs]
    reranks = [ClassifyItem(ids, kinds) for ids, kinds in zip(pairs, types)]
    nsps = [NspItem(ids, kinds) for ids, kinds in zip(pairs, types)]
    mixed = [reranks[0], nsps[1], EncodeItem(pairs[2], [0] * len(pairs[2]), pooling="cls"), reranks[3], nsps[4]]
    parts = {"rerank": reranks, "nsp": nsps, "mixed": mixed}
    eager = {name: engine.run(engine.collate(part)) for name, part in parts.items()}
    static_path(engine, most_tokens=256, slots=8)
    for name, part in parts.items():
        batch = engine.collate(part)
        assert batch.staged is not None and batch.runs_heads
        with TorchCalls(monkeypatch) as calls:
            handle = engine.launch(batch)
        assert calls.names == ["copy_"] + ["to"] * (3 if name == "mixed" else 1), (name, calls.names)
        assert_same(eager[name], engine.finish(handle))


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
        metrics.for_model("m").observe_batch(0.01, batch)
    text = metrics.render().decode()
    assert 'bert_batches_graphed_total{model="m"} 1.0' in text
    # 69 tokens padded up to the 128 bucket
    assert f'bert_graph_padding_rows_total{{model="m"}} {float(128 - 69)}' in text


class LateReader(Engine):
    """An engine that reads a graphed batch's states when it finishes the batch, not when it launches it: the
    order that would be wrong on a GPU, where the next launched batch's replay overwrites those states."""

    @torch.inference_mode()
    def launch(self, batch):
        embedded, hidden, packing, graphed = self.graphs.replay(batch.staged, batch.layout, batch.real_tokens,
                                                                batch.size, batch.runs_heads)
        return batch, embedded, hidden, packing, graphed

    @torch.inference_mode()
    def finish(self, launched):
        from service.engine.heads import launch_heads

        batch, embedded, hidden, packing, graphed = launched
        results = [None] * batch.size
        for collect in launch_heads(self.model, batch.items, embedded, hidden, packing, batch.starts(), graphed):
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
