"""Cross-encoders and classifiers (BertForSequenceClassification checkpoints written by transformers):
/predict and /rerank scores equal transformers' on the same checkpoint, batched and single; routes a
checkpoint cannot serve answer 501 (424 on TEI's routes, as TEI) naming what it has; bad input gets a 4xx
naming the field."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from model import load_checkpoint
from tests.service.conftest import serving

pytestmark = pytest.mark.anyio
QUERY = "how old is the eiffel tower ?"
TEXTS = ["it was built in 1889 for the world fair .", "paris is the capital of france .", "the river flows south .",
         "a crane is flying over the tower , which is old ."]


def reference_logits(directory, entries: list) -> np.ndarray:
    """transformers' logits for texts and [a, b] pairs, one input at a time (no padding involved)."""
    model = transformers.BertForSequenceClassification.from_pretrained(directory).eval()
    tokenizer = load_checkpoint(directory).tokenizer
    rows = []
    for entry in entries:
        encoded = tokenizer.encode(*entry) if isinstance(entry, list) else tokenizer.encode(entry)
        with torch.no_grad():
            rows.append(model(input_ids=torch.tensor([encoded.ids]),
                              token_type_ids=torch.tensor([encoded.type_ids])).logits[0].numpy())
    return np.stack(rows)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


async def test_rerank_equals_transformers_batched_and_single(tiny_cross_encoder):
    want = sigmoid(reference_logits(tiny_cross_encoder, [[QUERY, t] for t in TEXTS])[:, 0])
    async with serving(tiny_cross_encoder) as client:
        batched = (await client.post("/rerank", json={"query": QUERY, "texts": TEXTS, "return_text": True})).json()
        singles = [(await client.post("/rerank", json={"query": QUERY, "texts": [t]})).json()[0] for t in TEXTS]
        raw = (await client.post("/rerank", json={"query": QUERY, "texts": TEXTS, "raw_scores": True})).json()
        predicted = (await client.post("/predict", json={"inputs": [[QUERY, t] for t in TEXTS]})).json()
        one_pair = (await client.post("/predict", json={"inputs": [QUERY, TEXTS[0]]})).json()
        info = (await client.get("/info")).json()
    assert [r["index"] for r in batched] == list(np.argsort(-want, kind="stable"))
    assert [r["score"] for r in batched] == sorted((r["score"] for r in batched), reverse=True)
    for rank in batched:
        assert rank["text"] == TEXTS[rank["index"]]
        assert abs(rank["score"] - want[rank["index"]]) < 1e-4
    np.testing.assert_allclose([s["score"] for s in singles], want, atol=1e-4)
    np.testing.assert_allclose(sorted(r["score"] for r in raw), sorted(np.log(want / (1 - want))), atol=1e-4)
    assert all("text" not in r for r in raw)
    np.testing.assert_allclose([p[0]["score"] for p in predicted], want, atol=1e-4)
    # a list of exactly two texts is one pair, as TEI reads it
    assert one_pair[0]["label"] == "LABEL_0" and one_pair[0]["score"] == pytest.approx(want[0], abs=1e-4)
    assert info["model_type"] == {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}
    assert info["heads"]["classifier"] is True


async def test_predict_equals_transformers_with_softmax_labels(tiny_classifier):
    texts = ["what a lovely day", "the service was slow and rude", "it rained"]
    logits = reference_logits(tiny_classifier, texts)
    probabilities = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    async with serving(tiny_classifier) as client:
        batched = (await client.post("/predict", json={"inputs": texts})).json()
        single = (await client.post("/predict", json={"inputs": texts[1]})).json()
        raw = (await client.post("/predict", json={"inputs": texts[:1] * 3, "raw_scores": True})).json()
        pair = await client.post("/predict", json={"inputs": ["a text", ["a", "pair"], "another"]})
        rerank = await client.post("/rerank", json={"query": "q", "texts": ["a"]})
        root = (await client.post("/", json={"inputs": texts[0], "parameters": {"top_k": 2}})).json()
        root_sigmoid = (await client.post("/", json={"inputs": texts[0],
                                                     "parameters": {"function_to_apply": "sigmoid"}})).json()
        info = (await client.get("/info")).json()
    names = ["negative", "neutral", "positive"]
    for row, answer in zip(probabilities, batched):
        assert [a["label"] for a in answer] == [names[i] for i in np.argsort(-row, kind="stable")]
        assert all(abs(a["score"] - row[names.index(a["label"])]) < 1e-4 for a in answer)
    assert [a["label"] for a in single] == [a["label"] for a in batched[1]]
    np.testing.assert_allclose([a["score"] for a in single], [a["score"] for a in batched[1]], atol=1e-6)
    assert {a["label"]: a["score"] for a in raw[0]} == pytest.approx(dict(zip(names, logits[0])), abs=1e-4)
    np.testing.assert_allclose([[a["score"] for a in r] for r in raw[1:]], [[a["score"] for a in raw[0]]] * 2, atol=1e-6)
    assert pair.status_code == 422 and "inputs[1] is a pair" in pair.json()["error"]
    assert rerank.status_code == 424 and "reads single texts" in rerank.json()["error"]  # TEI's Backend
    assert [r["label"] for r in root[0]] == [a["label"] for a in batched[0]][:2]  # HF's shape: a list per input
    assert root_sigmoid[0][0]["score"] == pytest.approx(float(sigmoid(logits[0]).max()), abs=1e-4)
    assert info["model_type"]["classifier"]["id2label"] == {"0": "negative", "1": "neutral", "2": "positive"}


async def test_cross_encoder_bad_input_names_the_field_and_loses_nothing(tiny_cross_encoder):
    async with serving(tiny_cross_encoder, max_inputs_per_request=8) as client:
        before = (await client.post("/rerank", json={"query": QUERY, "texts": TEXTS})).json()
        cases = [
            ({"query": QUERY, "texts": []}, 400, "texts is empty"),
            ({"query": "   ", "texts": ["a"]}, 422, "query is empty"),
            ({"query": "word " * 600, "texts": ["a"]}, 422, "query is"),
            ({"query": QUERY, "texts": ["a", "  "]}, 422, "texts[1] is empty"),
            ({"query": QUERY, "texts": ["a"] * 9}, 422, "texts has 9 entries"),
            ({"query": QUERY, "texts": "not a list"}, 422, "texts"),
            ({"query": 5, "texts": ["a"]}, 422, "query"),
        ]
        for body, status, words in cases:
            response = await client.post("/rerank", json=body)
            assert response.status_code == status and words in response.json()["error"], (body, response.text)
            assert set(response.json()) == {"error", "error_type"}
        long_ok = await client.post("/rerank", json={"query": "word " * 600, "texts": ["a"], "truncate": True})
        assert long_ok.status_code == 200
        assert (await client.post("/rerank", json={"query": QUERY, "texts": TEXTS})).json() == before
        unsupported = await client.post("/fill-mask", json={"inputs": "a [MASK]"})
        assert unsupported.status_code == 501 and "classification head (1 outputs)" in unsupported.json()["error"]


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
async def test_cross_encoder_in_faster_cpu_precisions_stays_close(tiny_cross_encoder, dtype):
    """The classification head stays float32 (only encoder layers are quantized); scores move a little."""
    want = sigmoid(reference_logits(tiny_cross_encoder, [[QUERY, t] for t in TEXTS])[:, 0])
    async with serving(tiny_cross_encoder, dtype=dtype) as client:
        ranks = (await client.post("/rerank", json={"query": QUERY, "texts": TEXTS})).json()
    got = np.array([r["score"] for r in sorted(ranks, key=lambda r: r["index"])])
    np.testing.assert_allclose(got, want, atol=0.02)
