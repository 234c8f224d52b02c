"""Every route against transformers on the same checkpoint, batched equals single, and the contract."""

from __future__ import annotations

import asyncio
import base64
import random

import numpy as np
import pytest
import torch
import transformers

from service.settings import Settings
from tests.conftest import wikitext_lines
from tests.service.conftest import serving

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def reference(tiny_checkpoint):
    model = transformers.BertForPreTraining.from_pretrained(tiny_checkpoint).eval()
    tokenizer = transformers.BertTokenizerFast.from_pretrained(tiny_checkpoint)
    return model, tokenizer


async def test_encode_matches_transformers_last_hidden_state(tiny_checkpoint, reference):
    model, tokenizer = reference
    texts = ["a crane is flying over the river", "short", ["the first sentence .", "and the second one ."]]
    async with serving(tiny_checkpoint) as client:
        response = await client.post("/encode", json={"inputs": texts})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "tiny" and body["dim"] == 64 and len(body["results"]) == 3
    total = 0
    for text, result in zip(texts, body["results"]):
        enc = tokenizer(*text, return_tensors="pt") if isinstance(text, list) else tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            want = model.bert(**enc).last_hidden_state[0].numpy()
        got = np.array(result["embeddings"], dtype=np.float32)
        assert result["tokens"] == tokenizer.convert_ids_to_tokens(enc["input_ids"][0])
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= 1e-5
        total += got.shape[0]
    assert body["usage"]["input_tokens"] == total


async def test_pooling_normalize_and_base64(tiny_checkpoint):
    text = "the river flows into the sea"
    async with serving(tiny_checkpoint) as client:
        tokens = (await client.post("/encode", json={"inputs": text})).json()["results"][0]
        cls = (await client.post("/encode", json={"inputs": text, "pooling": "cls"})).json()["results"][0]
        mean = (await client.post("/encode", json={"inputs": text, "pooling": "mean", "normalize": True})).json()
        b64 = (await client.post("/encode", json={"inputs": text, "encoding_format": "base64"})).json()["results"][0]
        b64_mean = (await client.post("/encode", json={"inputs": [text], "pooling": "mean", "normalize": True,
                                                       "encoding_format": "base64"})).json()["results"][0]
    vectors = np.array(tokens["embeddings"], dtype=np.float32)
    np.testing.assert_allclose(cls["embedding"], vectors[0], atol=1e-6)
    expected_mean = vectors.mean(0) / np.linalg.norm(vectors.mean(0))
    np.testing.assert_allclose(mean["results"][0]["embedding"], expected_mean, atol=1e-5)
    decoded = np.stack([np.frombuffer(base64.b64decode(row), dtype="<f4") for row in b64["embeddings"]])
    np.testing.assert_array_equal(decoded, vectors)
    np.testing.assert_allclose(np.frombuffer(base64.b64decode(b64_mean["embedding"]), dtype="<f4"), expected_mean,
                               atol=1e-5)


async def test_fill_mask_matches_the_transformers_pipeline(tiny_checkpoint, reference):
    _, tokenizer = reference
    mlm = transformers.BertForMaskedLM.from_pretrained(tiny_checkpoint).eval()
    pipe = transformers.pipeline("fill-mask", model=mlm, tokenizer=tokenizer, device="cpu")
    text = "the cat sat on the [MASK] ."
    want = pipe(text, top_k=5)
    async with serving(tiny_checkpoint) as client:
        response = await client.post("/fill-mask", json={"inputs": text, "top_k": 5})
        targeted = await client.post("/fill-mask", json={"inputs": text, "targets": ["river", "the"], "top_k": 5})
    assert response.status_code == 200, response.text
    masks = response.json()["results"][0]["masks"]
    assert len(masks) == 1 and masks[0]["position"] == tokenizer(text)["input_ids"].index(tokenizer.mask_token_id)
    got = masks[0]["predictions"]
    assert [p["token"] for p in got] == [w["token"] for w in want]
    np.testing.assert_allclose([p["score"] for p in got], [w["score"] for w in want], atol=1e-5)
    assert [p["token_str"] for p in got] == [w["token_str"] for w in want]
    assert got[0]["sequence"] == want[0]["sequence"]

    want_targets = pipe(text, targets=["river", "the"])
    got_targets = targeted.json()["results"][0]["masks"][0]["predictions"]
    assert [p["token_str"] for p in got_targets] == [w["token_str"] for w in want_targets]
    np.testing.assert_allclose([p["score"] for p in got_targets], [w["score"] for w in want_targets], atol=1e-5)


async def test_fill_mask_several_masks_and_inputs(tiny_checkpoint):
    async with serving(tiny_checkpoint) as client:
        response = await client.post("/fill-mask", json={"inputs": ["[MASK] is [MASK] .", "one [MASK]"], "top_k": 3})
    results = response.json()["results"]
    assert [len(r["masks"]) for r in results] == [2, 1]
    first = results[0]["masks"]
    assert first[0]["position"] < first[1]["position"]
    for mask in first:
        scores = [p["score"] for p in mask["predictions"]]
        assert scores == sorted(scores, reverse=True) and len(scores) == 3
    assert "[MASK]" in first[0]["predictions"][0]["sequence"]  # the other mask stays visible


async def test_nsp_matches_transformers(tiny_checkpoint, reference):
    model, tokenizer = reference
    pairs = [["the storm grew stronger .", "it reached the coast on monday ."], ["a b c", "d e f"]]
    async with serving(tiny_checkpoint) as client:
        many = (await client.post("/nsp", json={"inputs": pairs})).json()["results"]
        one = (await client.post("/nsp", json={"inputs": pairs[0]})).json()["results"]
    assert len(many) == 2 and len(one) == 1
    for pair, result in zip(pairs, many):
        with torch.no_grad():
            logits = model(**tokenizer(*pair, return_tensors="pt")).seq_relationship_logits[0]
        probs = torch.softmax(logits, -1)
        assert abs(result["score"] - probs[0].item()) <= 1e-5
        np.testing.assert_allclose(result["logits"], logits.numpy(), atol=1e-5)
        assert result["is_next"] == (probs[0].item() >= 0.5)
    assert_close_json(one[0], many[0], atol=1e-6)


def random_request(rng: random.Random, sentences: list[str]) -> tuple[str, dict]:
    kind = rng.choice(["encode", "fill-mask", "nsp"])
    if kind == "encode":
        inputs = [rng.choice(sentences) for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.3:
            inputs.append([rng.choice(sentences), rng.choice(sentences)])
        return "/encode", {"inputs": inputs, "pooling": rng.choice(["none", "cls", "mean"]), "truncate": True}
    if kind == "fill-mask":
        words = rng.choice(sentences).split()
        words[rng.randrange(len(words))] = "[MASK]"
        return "/fill-mask", {"inputs": " ".join(words), "top_k": rng.randint(1, 8)}
    return "/nsp", {"inputs": [rng.choice(sentences), rng.choice(sentences)], "truncate": True}


async def test_batched_equals_single(tiny_checkpoint):
    """64 concurrent requests of mixed lengths and routes return what each returns alone."""
    lines = [line for line in wikitext_lines("test", limit=400) if 5 < len(line.split()) < 60]
    sentences = [" ".join(line.split()[: random.Random(i).randint(4, 60)]) for i, line in enumerate(lines)]
    rng = random.Random(7)
    requests = [random_request(rng, sentences) for _ in range(64)]
    async with serving(tiny_checkpoint, max_wait_ms=20) as client:
        together = await asyncio.gather(*(client.post(path, json=body) for path, body in requests))
        alone = [await client.post(path, json=body) for path, body in requests]
        metrics = (await client.get("/metrics")).text
    for (path, _), a, b in zip(requests, together, alone):
        assert a.status_code == b.status_code == 200, (a.text, b.text)
        assert_close_json(a.json(), b.json(), atol=1e-5)
    largest_batch = max(float(line.split()[-1]) for line in metrics.splitlines()
                        if line.startswith("bert_batch_sequences_count"))
    assert largest_batch > 0
    batches = float(next(line.split()[-1] for line in metrics.splitlines() if line.startswith("bert_batch_sequences_count")))
    items = float(next(line.split()[-1] for line in metrics.splitlines() if line.startswith("bert_items_computed_total")))
    assert items / batches > 1.5  # the concurrent half really was batched


def assert_close_json(a, b, atol: float) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_close_json(a[key], b[key], atol)
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_close_json(x, y, atol)
    elif isinstance(a, float):
        assert abs(a - b) <= atol, (a, b)
    else:
        assert a == b


async def test_health_info_metrics_and_docs(tiny_checkpoint):
    async with serving(tiny_checkpoint) as client:
        assert (await client.get("/health")).json() == {"status": "ok"}
        info = (await client.get("/info")).json()
        await client.post("/nsp", json={"inputs": ["a", "b"]})
        await client.post("/nsp", json={"inputs": ["a"]})
        metrics = (await client.get("/metrics")).text
        openapi = (await client.get("/openapi.json")).json()
        docs = await client.get("/docs")
    assert info["config"]["hidden_size"] == 64 and info["device"] == "cpu" and info["dtype"] == "float32"
    assert info["heads"] == {"mlm": True, "nsp": True, "classifier": False, "token_classifier": False,
                             "question_answering": False, "late_interaction": False}
    assert info["late_interaction"] is None
    assert info["limits"]["max_batch_tokens"] == 16384 and info["limits"]["api_key"] is None
    # cpu_batch_tokens auto: 6 MiB over a 128-wide float32 feed-forward is 12,288 tokens; the power of two below
    assert info["limits"]["batch_tokens_in_force"] == 8192
    for name in ("bert_requests_total", "bert_request_failures_total", "bert_queue_depth", "bert_queue_time_seconds",
                 "bert_inference_seconds", "bert_batch_sequences", "bert_batch_tokens", "bert_batch_padding_fraction"):
        assert name in metrics
    assert 'bert_request_failures_total{error_type="validation",model="tiny",route="/nsp"} 1.0' in metrics
    assert {"/encode", "/fill-mask", "/nsp", "/health", "/info", "/metrics"} <= set(openapi["paths"])
    assert "examples" in str(openapi["components"]["schemas"]["EncodeRequest"])
    assert docs.status_code == 200


async def test_liveness_is_not_readiness(tiny_checkpoint):
    """/live stays 200 while /health turns 503 for draining (a probe must not restart a pod that is finishing
    its work); it turns 503 only when the server cannot recover, here a compute thread that has died."""
    async with serving(tiny_checkpoint, api_key="a-long-secret") as client:
        runtime = client.app.state.runtime
        assert (await client.get("/live")).json() == {"status": "alive", "state": "ready"}  # no key needed
        runtime.lifecycle.drain()
        assert (await client.get("/health")).status_code == 503
        draining = await client.get("/live")
        assert draining.status_code == 200 and draining.json()["state"] == "draining"
        runtime.lifecycle.state = "ready"
        runtime.link.models.stop()  # the threads end, as a crashed one would
        dead = await client.get("/live")
        assert dead.status_code == 503 and "thread" in dead.json()["error"]
        openapi = (await client.get("/openapi.json", headers={"Authorization": "Bearer a-long-secret"})).json()
    assert "/live" in openapi["paths"]


async def test_api_key_from_a_file_is_required_and_not_shown(tiny_checkpoint, tmp_path):
    key_file = tmp_path / "api-key"
    key_file.write_text("a-long-secret-from-a-file\n")  # a mounted Secret ends with a newline as often as not
    async with serving(tiny_checkpoint, api_key_file=key_file) as client:
        assert (await client.post("/nsp", json={"inputs": ["a", "b"]})).status_code == 401
        auth = {"Authorization": "Bearer a-long-secret-from-a-file"}
        assert (await client.post("/nsp", json={"inputs": ["a", "b"]}, headers=auth)).status_code == 200
        info = (await client.get("/info", headers=auth)).text
    assert "a-long-secret" not in info and str(tmp_path) not in info


async def test_cpu_batch_size_setting(tiny_checkpoint):
    """A number is taken as it is (within max_batch_tokens), and /info says what is in force."""
    assert Settings().cpu_batch_tokens == "auto" and Settings(cpu_batch_tokens="measure").cpu_batch_tokens == "measure"
    assert Settings(cpu_batch_tokens="2048").cpu_batch_tokens == 2048  # as the flag and BERT_CPU_BATCH_TOKENS give it
    for bad in (8, "big", 0):
        with pytest.raises(ValueError, match="cpu_batch_tokens"):
            Settings(cpu_batch_tokens=bad)
    for setting, in_force in ((512, 512), (20000, 16384)):
        async with serving(tiny_checkpoint, cpu_batch_tokens=setting) as client:
            assert (await client.get("/info")).json()["limits"]["batch_tokens_in_force"] == in_force


async def test_max_batch_size_setting(tiny_checkpoint):
    """auto is 64 sequences on a CPU (256 on a GPU: service/engine/loader.py); a number is taken as it is; /info
    (ours and TEI's max_batch_requests) says what is in force, and the batcher holds to it."""
    assert Settings().max_batch_size == "auto" and Settings(max_batch_size="3").max_batch_size == 3
    for bad in (0, -1, "many"):
        with pytest.raises(ValueError, match="max_batch_size"):
            Settings(max_batch_size=bad)
    for setting, in_force in (("auto", 64), (3, 3)):
        async with serving(tiny_checkpoint, max_batch_size=setting) as client:
            info = (await client.get("/info")).json()
            assert info["limits"]["batch_size_in_force"] == in_force
            assert info["max_batch_requests"] == in_force
            inputs = [f"sentence number {n}" for n in range(10)]
            assert (await client.post("/encode", json={"inputs": inputs})).status_code == 200
            metrics = {line.split()[0]: float(line.split()[1]) for line in (await client.get("/metrics")).text.splitlines()
                       if line.startswith("bert_batch_sequences_")}
            assert metrics['bert_batch_sequences_sum{model="tiny"}'] == 10
            assert metrics['bert_batch_sequences_count{model="tiny"}'] >= (4 if setting == 3 else 1)  # 10 inputs, 3 a batch


async def test_cuda_graphs_setting_on_a_cpu(tiny_checkpoint):
    """On by default, a flag either way; a CPU captures none, and /info and /metrics say every batch ran op by op."""
    assert Settings().cuda_graphs is True and Settings(cuda_graphs="false").cuda_graphs is False
    async with serving(tiny_checkpoint) as client:
        limits = (await client.get("/info")).json()["limits"]
        assert limits["cuda_graphs_in_force"] == 0 and limits["cuda_graphs"] == {"live": [], "eager": []}
        assert (await client.post("/encode", json={"inputs": ["one", "two"]})).status_code == 200
        assert 'bert_batches_graphed_total{model="tiny"} 0.0' in (await client.get("/metrics")).text
