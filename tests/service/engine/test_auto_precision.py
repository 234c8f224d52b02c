"""`--dtype auto` on a CPU (service.engine.precision_probe): bfloat16 where the CPU computes it natively and the model's
answers stay at float32's, float32 otherwise; /info and the log say which and why, and an explicit --dtype is kept.

Whether this machine's CPU has native bfloat16 is set by each test (the probe's verdict does not depend on it:
emulated bfloat16 rounds the same), so the tests say the same on any CI machine."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model import load_checkpoint, save_checkpoint
from service.engine import precision_probe
from service.engine.precision_probe import AUTO_MIN_COSINE, bfloat16_fidelity, choose_auto_on_cpu
from service.settings import DEFAULT_CHECKPOINT
from tests.conftest import random_model
from tests.service.conftest import serving

pytestmark = pytest.mark.anyio
TEXTS = ["a crane is flying over the river", "the storm moved north .", "short"]


@pytest.fixture
def native_bfloat16(monkeypatch):
    monkeypatch.setattr(precision_probe, "cpu_has_native_bf16", lambda: True)


@pytest.fixture(scope="module")
def wide_range(tmp_path_factory, tokenizer):
    """A model whose word embeddings all sit on a large offset (300 in every dimension): float32 keeps the small
    differences between words on top of it and the embedding LayerNorm takes the offset away; bfloat16, with 8 bits
    of mantissa, rounds 300 + 0.02 to 300 and loses the words (the kind of weight range that rounding cannot
    carry)."""
    model = random_model(tokenizer.vocab_size, seed=4)
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.weight.add_(300.0)
    directory = tmp_path_factory.mktemp("wide-range") / "wide-range"
    save_checkpoint(directory, model, tokenizer)
    return directory


async def pooled(client, texts):
    response = await client.post("/encode", json={"inputs": texts, "pooling": "mean", "normalize": True})
    assert response.status_code == 200, response.text
    return np.array([r["embedding"] for r in response.json()["results"]])


async def test_a_faithful_model_is_served_in_bfloat16_and_info_says_why(native_bfloat16):
    async with serving(DEFAULT_CHECKPOINT, dtype="auto") as client:
        info = (await client.get("/info")).json()
        got = await pooled(client, TEXTS)
    async with serving(DEFAULT_CHECKPOINT, dtype="float32") as client:
        want = await pooled(client, TEXTS)
        exact_info = (await client.get("/info")).json()
    assert info["dtype"] == "bfloat16", info["dtype_reason"]
    reason = info["dtype_reason"]
    assert reason.startswith("auto: bfloat16") and "pooled vectors cosine" in reason
    assert "fill-mask top-1" in reason and "next-sentence" in reason  # the bundled model's two heads were asked
    assert (got * want).sum(1).min() > 0.999 and not np.array_equal(got, want)  # bfloat16 ran, and stayed close
    assert exact_info["dtype"] == "float32" and exact_info["dtype_reason"] == ""  # an explicit --dtype is kept


def test_a_model_whose_answers_move_in_bfloat16_stays_float32(native_bfloat16, wide_range, caplog):
    fidelity = bfloat16_fidelity(load_checkpoint(wide_range))
    assert fidelity.min_cosine < AUTO_MIN_COSINE and not fidelity.faithful
    with caplog.at_level("WARNING", logger="service"):
        chosen = choose_auto_on_cpu(load_checkpoint(wide_range))
    assert chosen.dtype == torch.float32 and chosen.reason.startswith("auto: float32 (bfloat16 is native")
    assert "pooled vectors cosine" in chosen.reason and "moved this model's answers" in caplog.text


def test_without_native_bfloat16_auto_stays_float32(monkeypatch, tiny_checkpoint):
    monkeypatch.setattr(precision_probe, "cpu_has_native_bf16", lambda: False)
    chosen = choose_auto_on_cpu(load_checkpoint(tiny_checkpoint))
    assert chosen.dtype == torch.float32 and chosen.reason == "auto: float32 (this CPU has no native bfloat16)"


def test_the_probe_leaves_the_float32_model_as_the_engine_would_build_it(tiny_checkpoint):
    checkpoint = load_checkpoint(tiny_checkpoint)
    bfloat16_fidelity(checkpoint)
    assert all(p.dtype == torch.float32 for p in checkpoint.model.parameters())
