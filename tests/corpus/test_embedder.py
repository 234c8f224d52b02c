"""The engine as a library: batches packed as the service's packer packs them, and the same vectors whichever way
the batches run (two runners on a CPU's halves, or one launching the next batch before reading the last, as on a
GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from corpus.embedder import Embedder
from corpus.settings import JobSettings
from service.engine.engine import Engine
from tests.corpus.job_helpers import sentences


@pytest.fixture(scope="module")
def embedder(tiny_checkpoint):
    made = Embedder(JobSettings(input="-", output="-", checkpoint=str(tiny_checkpoint)))
    yield made
    made.close()


def test_batches_hold_similar_lengths_within_the_budget(embedder):
    lengths = [5, 90, 7, 60, 6, 120, 8, 33] * 40
    batches = embedder.pack(lengths)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    for batch in batches:
        assert max(lengths[i] for i in batch) * len(batch) <= embedder.batch_tokens
        assert len(batch) <= embedder.batch_size
    longest = [max(lengths[i] for i in batch) for batch in batches]
    assert longest == sorted(longest)  # filled in length order: short with short, long with long


def test_every_way_of_running_gives_the_same_vectors_in_input_order(embedder, monkeypatch):
    token_ids = [e.ids for e in embedder.tokenizer.encode_batch(sentences(150), truncate=True)]
    seen = []
    parallel = embedder.embed(token_ids, on_batch=lambda n, tokens: seen.append((n, tokens)))
    assert sum(n for n, _ in seen) == len(token_ids) and sum(t for _, t in seen) == sum(map(len, token_ids))
    alone = embedder.embed(token_ids[7:8])
    np.testing.assert_allclose(parallel[7:8], alone, rtol=1e-5, atol=1e-6)
    pool, embedder._pool = embedder._pool, None
    try:
        monkeypatch.setattr(Engine, "overlaps", property(lambda self: True))  # launch, then finish the one before
        overlapped = embedder.embed(token_ids)
    finally:
        embedder._pool = pool
    np.testing.assert_allclose(overlapped, parallel, rtol=1e-5, atol=1e-6)
    assert embedder.embed([]).shape == (0, embedder.dimensions)
