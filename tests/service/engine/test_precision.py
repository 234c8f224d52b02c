"""CPU precisions as users meet them: int8 and bfloat16 serve every route close to float32, int8 keeps batched
equal to single, /info says what runs, and what cannot run is refused at start-up with a clear message."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from service.engine.precision import PrecisionError, choose
from tests.service.conftest import serving

pytestmark = pytest.mark.anyio
TEXTS = ["a crane is flying over the river", "the storm moved north .", "short"]


async def pooled(client, texts):
    response = await client.post("/encode", json={"inputs": texts, "pooling": "mean", "normalize": True})
    assert response.status_code == 200, response.text
    return np.array([r["embedding"] for r in response.json()["results"]])


@pytest.mark.parametrize("dtype, floor", [("int8", 0.99), ("bfloat16", 0.999)])
async def test_cpu_precisions_stay_close_to_float32(tiny_checkpoint, dtype, floor):
    async with serving(tiny_checkpoint) as client:
        want = await pooled(client, TEXTS)
        fill_want = (await client.post("/fill-mask", json={"inputs": "the [MASK] flows", "top_k": 3})).json()
    async with serving(tiny_checkpoint, dtype=dtype) as client:
        got = await pooled(client, TEXTS)
        info = (await client.get("/info")).json()
        fill = await client.post("/fill-mask", json={"inputs": "the [MASK] flows", "top_k": 3})
        nsp = await client.post("/nsp", json={"inputs": ["a b", "c d"]})
    assert (got * want).sum(1).min() > floor
    assert info["dtype"].startswith(dtype) and info["device"] == "cpu"
    assert fill.status_code == nsp.status_code == 200
    top = fill.json()["results"][0]["masks"][0]["predictions"][0]
    assert abs(top["score"] - fill_want["results"][0]["masks"][0]["predictions"][0]["score"]) < 0.05


async def test_int8_batched_equals_single(tiny_checkpoint):
    """Per-token activation scales: an input's int8 result does not depend on what shares its batch."""
    async with serving(tiny_checkpoint, dtype="int8", max_wait_ms=20) as client:
        together = await asyncio.gather(*(pooled(client, [t]) for t in TEXTS * 4))
        alone = [await pooled(client, [t]) for t in TEXTS * 4]
    for a, b in zip(together, alone):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_int8_on_a_gpu_is_refused_with_a_clear_message():
    with pytest.raises(PrecisionError, match="int8 runs on CPU only"):
        choose("int8", torch.device("cuda"))
    assert choose("auto", torch.device("cpu")).dtype == torch.float32  # auto stays exact on CPU


def test_int8_says_which_path_runs_and_warns_off_the_c_layer(monkeypatch, caplog):
    from kernels import int8_layer, int8_numba, int8_products

    monkeypatch.setattr(int8_layer, "kernel", lambda: SimpleNamespace(products="AMX"))
    assert choose("int8", torch.device("cpu")).name.endswith("; each layer in one C call (AMX products))")
    monkeypatch.setattr(int8_layer, "kernel", lambda: None)
    monkeypatch.setattr(int8_layer, "why_not", lambda: "no C compiler (cc) to build int8_layer.c")
    monkeypatch.setattr(int8_products, "kernel", lambda: SimpleNamespace(instruction_set="VNNI"))
    monkeypatch.setattr(int8_numba, "AVAILABLE", True)
    with caplog.at_level("WARNING", logger="service"):
        precision = choose("int8", torch.device("cpu"))
    assert precision.is_int8 and precision.name.endswith(
        "; layers as modules, row steps in numba, VNNI products: no C compiler (cc) to build int8_layer.c)")
    assert "slower than one C call a layer" in caplog.text
    monkeypatch.setattr(int8_products, "kernel", lambda: SimpleNamespace(instruction_set="AVX2"))
    assert ", row steps in numba, AVX2 products: " in choose("int8", torch.device("cpu")).name
    monkeypatch.setattr(int8_products, "kernel", lambda: None)
    monkeypatch.setattr(int8_numba, "AVAILABLE", False)
    monkeypatch.setattr(int8_layer, "why_not", lambda: "this CPU lacks avx512_vnni")
    assert choose("int8", torch.device("cpu")).name.endswith(
        "; layers as modules, row steps in torch (numba is not installed), torch._int_mm products: this CPU lacks "
        "avx512_vnni)")



async def test_int8_on_a_colbert_quantizes_the_feed_forward_outputs_inputs_to_12_bits(tiny_colbert):
    """Its vectors are compared one by one (MaxSim), where int8's rounding does not average out over a sentence
    (tests/kernels has the 12-bit layers' exactness, BENCHMARKS.md the vectors' figures): /info says so, and the
    engine built for it has those layers, the others' inputs 8-bit."""
    from model import load_checkpoint
    from service.engine.loader import build_engine

    async with serving(tiny_colbert, dtype="int8") as client:
        info = (await client.get("/info")).json()
        answer = await client.post("/token-vectors", json={"inputs": TEXTS})
    assert "the feed-forward output layers' inputs 12-bit" in info["dtype"] and answer.status_code == 200
    cpu = torch.device("cpu")
    engine = build_engine(load_checkpoint(tiny_colbert), cpu, choose("int8", cpu))
    layers = engine.model.bert.encoder.layer
    assert all(layer.output.dense.input_bits == 12 and layer.intermediate.dense.input_bits == 8 and
               layer.attention.output.dense.input_bits == 8 for layer in layers)


async def test_int8_on_an_embedder_keeps_8_bit_inputs_throughout(tiny_checkpoint):
    async with serving(tiny_checkpoint, dtype="int8") as client:
        info = (await client.get("/info")).json()
    assert info["dtype"].startswith("int8") and "12-bit" not in info["dtype"]
