"""The engine as a library: started as the service starts it, its batches run by the service's batcher, and the same
vectors whichever way the batches run (two runners on a CPU's halves, or one launching the next batch before reading
the last, as on a GPU)."""

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


def test_every_way_of_running_gives_the_same_vectors_in_input_order(embedder, monkeypatch):
    token_ids = [e.ids for e in embedder.tokenizer.encode_batch(sentences(150), truncate=True)]
    seen = []
    parallel = embedder.embed(token_ids, on_batch=lambda n, tokens: seen.append((n, tokens)))
    assert sum(n for n, _ in seen) == len(token_ids) and sum(t for _, t in seen) == sum(map(len, token_ids))
    alone = embedder.embed(token_ids[7:8])
    np.testing.assert_allclose(parallel[7:8], alone, rtol=1e-5, atol=1e-6)
    monkeypatch.setattr(Engine, "overlaps", property(lambda self: True))  # launch, then finish the one before
    overlapped = embedder.embed(token_ids)
    np.testing.assert_allclose(overlapped, parallel, rtol=1e-5, atol=1e-6)
    assert embedder.embed([]).shape == (0, embedder.dimensions)


def test_the_job_starts_and_batches_as_the_service_does(embedder, tiny_checkpoint):
    """One start-up and one batcher for both: the job's engine is sized, typed and batched as the service's engine
    for the same checkpoint and options."""
    from service.engine.batcher import Batcher
    from service.engine.loader import start_engine
    from service.settings import Settings

    service = start_engine(Settings(checkpoint=str(tiny_checkpoint), dtype="auto").engine_options())
    job = embedder.started
    assert isinstance(embedder.batcher, Batcher) and embedder.batcher.engine is job.engine
    assert (job.precision, job.runners, job.batch_tokens, job.batch_size) == \
        (service.precision, service.runners, service.batch_tokens, service.batch_size)
    assert embedder.batcher.policy.max_batch_tokens == job.batch_tokens
