"""Serving a checkpoint whose heads read layers above its embedding layer (`config.embedding_layer`): the
embedding routes answer from that layer and the heads from the top, as `transformers` computes them from the
same directory, and requests of both kinds batched together equal each alone."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
import transformers

from model import load_checkpoint, save_checkpoint
from service.engine.engine import Engine
from service.tasks import EncodeItem, FillMaskItem
from tests.conftest import random_model
from tests.service.conftest import serving
from tests.service.frontend.test_api import assert_close_json

pytestmark = pytest.mark.anyio
TEXTS = ["a crane is flying over the river", "the first sentence .", "it rained all day in the town"]


@pytest.fixture(scope="module")
def stacked(tmp_path_factory, tokenizer):
    directory = tmp_path_factory.mktemp("stacked") / "stacked"
    save_checkpoint(directory, random_model(tokenizer.vocab_size, seed=9, num_hidden_layers=3, embedding_layer=2),
                    tokenizer)
    return directory


async def test_embedding_routes_serve_the_embedding_layer_and_heads_the_top(stacked):
    reference = transformers.BertForPreTraining.from_pretrained(stacked).eval()
    tokenizer = transformers.BertTokenizerFast.from_pretrained(stacked)
    masked = "the river flows to the [MASK] ."
    async with serving(stacked) as client:
        tokens = (await client.post("/encode", json={"inputs": TEXTS})).json()["results"]
        openai = (await client.post("/v1/embeddings", json={"input": TEXTS, "model": "stacked"})).json()["data"]
        fill = (await client.post("/fill-mask", json={"inputs": masked, "top_k": 3})).json()["results"][0]
        info = (await client.get("/info")).json()
    for text, got, vector in zip(TEXTS, tokens, openai):
        with torch.no_grad():
            states = reference(**tokenizer(text, return_tensors="pt"), output_hidden_states=True).hidden_states
        want = states[2][0].numpy()
        np.testing.assert_allclose(np.array(got["embeddings"], dtype=np.float32), want, atol=1e-5)
        assert np.abs(states[3][0].numpy() - want).max() > 1e-2  # the top layer differs: the test can tell
        mean = want.mean(0) / np.linalg.norm(want.mean(0))
        np.testing.assert_allclose(vector["embedding"], mean, atol=1e-5)
    encoded = tokenizer(masked, return_tensors="pt")
    with torch.no_grad():
        logits = reference(**encoded).prediction_logits[0]
    at = encoded["input_ids"][0].tolist().index(tokenizer.mask_token_id)
    scores, ids = logits[at].softmax(-1).topk(3)
    assert [p["token"] for p in fill["masks"][0]["predictions"]] == ids.tolist()
    np.testing.assert_allclose([p["score"] for p in fill["masks"][0]["predictions"]], scores.numpy(), atol=1e-5)
    assert info["config"]["embedding_layer"] == 2 and info["config"]["num_hidden_layers"] == 3


async def test_embeddings_and_fill_mask_batched_together_equal_each_alone(stacked):
    requests = [("/encode", {"inputs": text, "pooling": "mean"}) for text in TEXTS] + \
        [("/fill-mask", {"inputs": text.replace("the", "[MASK]", 1), "top_k": 2}) for text in TEXTS if "the" in text] + \
        [("/nsp", {"inputs": [[TEXTS[0], TEXTS[2]]]})]
    async with serving(stacked, max_wait_ms=30) as client:
        together = await asyncio.gather(*(client.post(path, json=body) for path, body in requests))
        alone = [await client.post(path, json=body) for path, body in requests]
    for a, b in zip(together, alone):
        assert a.status_code == b.status_code == 200, (a.text, b.text)
        assert_close_json(a.json(), b.json(), atol=1e-5)


def test_a_batch_of_embeddings_is_priced_at_the_layers_it_runs(stacked):
    """The metrics' FLOPs count the two layers an embedding-only batch runs, and all three once a head is asked."""
    model = load_checkpoint(stacked).model
    engine = Engine(model, torch.device("cpu"), torch.float32)
    ids, types = [2, 7, 9, 11, 3], [0] * 5
    embeddings_only = engine.collate([EncodeItem(ids, types), EncodeItem(ids, types)])
    with_a_head = engine.collate([EncodeItem(ids, types), FillMaskItem(ids, types, mask_positions=[2])])
    assert embeddings_only.flops == pytest.approx(with_a_head.flops * 2 / 3)
    assert embeddings_only.flops > 0
