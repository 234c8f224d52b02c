"""text-embeddings-inference's remaining routes and fields, against transformers where there is a number:
/embed_sparse (SPLADE from the MLM head), /similarity, /decode, token-id inputs, truncation_direction,
prompt_name, dimensions, /info, and the root route's task rule."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import transformers

from model import load_checkpoint
from tests.service.conftest import serving

pytestmark = pytest.mark.anyio
TEXTS = ["a crane is flying over the river", "the river flows to the sea"]


def masked_lm(directory):
    return transformers.BertForMaskedLM.from_pretrained(directory).eval()


async def test_embed_sparse_equals_splade_over_transformers_logits(tiny_checkpoint):
    tokenizer = load_checkpoint(tiny_checkpoint).tokenizer
    model = masked_lm(tiny_checkpoint)
    async with serving(tiny_checkpoint) as client:
        batched = (await client.post("/embed_sparse", json={"inputs": TEXTS})).json()
        single = (await client.post("/embed_sparse", json={"inputs": TEXTS[1]})).json()
    for text, answer in zip(TEXTS, batched):
        ids = torch.tensor([tokenizer.encode(text).ids])
        with torch.no_grad():
            weights = torch.log1p(torch.relu(model(input_ids=ids).logits[0])).amax(0).numpy()
        nonzero = np.flatnonzero(weights)
        assert [v["index"] for v in answer] == nonzero.tolist()  # zeros left out, ascending ids
        np.testing.assert_allclose([v["value"] for v in answer], weights[nonzero], atol=1e-4)
    assert [v["index"] for v in single[0]] == [v["index"] for v in batched[1]]


async def test_similarity_decode_ids_and_truncation(tiny_checkpoint):
    async with serving(tiny_checkpoint) as client:
        vectors = np.array((await client.post("/embed", json={"inputs": ["a crane", *TEXTS]})).json())
        similarity = (await client.post("/similarity", json={
            "inputs": {"source_sentence": "a crane", "sentences": TEXTS}})).json()
        tokens = (await client.post("/tokenize", json={"inputs": TEXTS[0]})).json()[0]
        ids = [t["id"] for t in tokens]
        by_ids = (await client.post("/embed", json={"inputs": [ids, TEXTS[1]]})).json()
        by_text = (await client.post("/embed", json={"inputs": TEXTS})).json()
        decoded = (await client.post("/decode", json={"ids": [ids, ids[1:3]]})).json()
        with_specials = (await client.post("/decode", json={"ids": ids, "skip_special_tokens": False})).json()
        long_text = " ".join(f"w{i}" for i in range(300))
        right = (await client.post("/embed_all", json={"inputs": long_text, "truncate": True})).json()[0]
        left = (await client.post("/embed_all", json={"inputs": long_text, "truncate": True,
                                                      "truncation_direction": "Left"})).json()[0]
        ends = (await client.post("/tokenize", json={"inputs": long_text})).json()[0]
    np.testing.assert_allclose(similarity, vectors[1:] @ vectors[0], atol=1e-5)
    np.testing.assert_allclose(by_ids, by_text, atol=1e-5)  # ids of /tokenize embed as their text does
    assert decoded == [TEXTS[0], " ".join(t["text"] for t in tokens[1:3])]
    assert with_specials == [f"[CLS] {TEXTS[0]} [SEP]"]
    assert len(right) == len(left) == 128  # the tiny model's limit
    assert not np.allclose(right[1], left[1])  # the cut was made at different ends
    assert len(ends) > 128


async def test_dimensions_truncate_then_normalise(tiny_checkpoint):
    async with serving(tiny_checkpoint) as client:
        full = np.array((await client.post("/embed", json={"inputs": TEXTS, "normalize": False})).json())
        short = np.array((await client.post("/embed", json={"inputs": TEXTS, "dimensions": 16})).json())
        short_raw = np.array((await client.post("/embed", json={"inputs": TEXTS, "dimensions": 16,
                                                                "normalize": False})).json())
        openai_short = (await client.post("/v1/embeddings", json={"input": TEXTS, "dimensions": 16})).json()
        alias = (await client.post("/embeddings", json={"input": TEXTS, "dimensions": 16})).json()
    want = full[:, :16] / np.linalg.norm(full[:, :16], axis=1, keepdims=True)
    np.testing.assert_allclose(short, want, atol=1e-5)
    np.testing.assert_allclose(short_raw, full[:, :16], atol=1e-5)
    np.testing.assert_allclose([d["embedding"] for d in openai_short["data"]], want, atol=1e-5)
    assert alias == openai_short


async def test_prompts_of_the_sentence_transformers_config(tiny_checkpoint, tmp_path):
    directory = tmp_path / "prompted"
    shutil.copytree(tiny_checkpoint, directory)
    (directory / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": None}))
    async with serving(directory) as client:
        prompted = (await client.post("/embed", json={"inputs": "a crane", "prompt_name": "query"})).json()
        spelled_out = (await client.post("/embed", json={"inputs": "query: a crane"})).json()
        unknown = await client.post("/embed", json={"inputs": "a crane", "prompt_name": "document"})
        tokens = (await client.post("/tokenize", json={"inputs": "a crane", "prompt_name": "passage"})).json()
        info = (await client.get("/info")).json()
    np.testing.assert_allclose(prompted, spelled_out, atol=1e-6)
    assert unknown.status_code == 422 and "'passage', 'query'" in unknown.json()["error"]
    assert "".join(t["text"] for t in tokens[0] if not t["special"]).startswith("passage:a")
    assert info["prompts"] == {"passage": "passage: ", "query": "query: "}


async def test_info_has_the_fields_tei_clients_read(tiny_checkpoint):
    async with serving(tiny_checkpoint, max_inputs_per_request=12) as client:
        info = (await client.get("/info")).json()
    assert info["model_id"] == "tiny" and info["max_input_length"] == 128 and info["max_client_batch_size"] == 12
    assert info["model_type"] == {"embedding": {"pooling": "mean"}} and info["model_dtype"] == "float32"
    assert {"max_concurrent_requests", "max_batch_tokens", "auto_truncate", "version"} <= set(info)
    assert info["model"] == "tiny" and "limits" in info  # ours stay beside TEI's


async def test_root_route_follows_its_rule(tiny_checkpoint):
    async with serving(tiny_checkpoint) as client:
        embedded = await client.post("/", json={"inputs": TEXTS, "normalize": True})
        nested = await client.post("/invocations", json={"inputs": TEXTS, "parameters": {"normalize": True}})
        filled = await client.post("/", json={"inputs": "the river [MASK] to the sea", "parameters": {"top_k": 3}})
        two_masks = await client.post("/", json={"inputs": "[MASK] river [MASK] to the sea"})
        similar = await client.post("/", json={"inputs": {"source_sentence": "a crane", "sentences": TEXTS}})
        explicit = (await client.post("/embed", json={"inputs": TEXTS})).json()
        fill_explicit = (await client.post("/fill-mask", json={"inputs": "the river [MASK] to the sea",
                                                               "top_k": 3})).json()
    assert embedded.headers["x-task"] == "feature-extraction" and embedded.json() == explicit
    assert nested.json() == explicit
    assert filled.headers["x-task"] == "fill-mask"
    predictions = fill_explicit["results"][0]["masks"][0]["predictions"]
    assert filled.json() == [{"score": p["score"], "token": p["token"], "token_str": p["token_str"],
                              "sequence": p["sequence"]} for p in predictions]
    assert len(two_masks.json()) == 2 and len(two_masks.json()[0]) == 5  # a list per mask
    assert similar.headers["x-task"] == "sentence-similarity" and len(similar.json()) == 2


async def test_root_task_setting_sets_the_default(tiny_checkpoint):
    async with serving(tiny_checkpoint, root_task="fill-mask") as client:
        refused = await client.post("/", json={"inputs": "no mask here"})
        similar = await client.post("/", json={"inputs": {"source_sentence": "a", "sentences": ["b"]}})
    assert refused.status_code == 422 and "has no [MASK]" in refused.json()["error"]
    assert similar.status_code == 200  # the request's shape still wins
