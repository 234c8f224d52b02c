"""Inputs longer than the model's window on the pooled embedding routes: refused by default, and with
`"long_input": "chunk"` embedded as the mean of their windows weighted by tokens, each window as it embeds alone; in
the same request as short inputs, which answer as alone; bounded like any request."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from model import load_checkpoint
from tests.conftest import wikitext_lines
from tests.service.conftest import serving

pytestmark = pytest.mark.anyio


def long_text(min_pieces: int, tokenizer) -> str:
    words, text = wikitext_lines("valid", limit=400), ""
    for line in words:
        text += " " + line
        if len(tokenizer.encode(text).ids) > min_pieces:
            return text.strip()
    raise AssertionError("not enough text")


def windows_of(ids: list[int], window: int, overlap: int) -> list[list[int]]:
    """[CLS] pieces [SEP] windows of `window` tokens, each starting `window - 2 - overlap` pieces after the last, the
    last one the first to reach the end (restated here from docs/long-inputs.md)."""
    pieces, room, found, start = ids[1:-1], window - 2, [], 0
    while True:
        found.append([ids[0], *pieces[start : start + room], ids[-1]])
        if start + room >= len(pieces):
            return found
        start += room - overlap


def cosine(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("declared", [None, 48])
async def test_a_chunked_input_is_the_token_weighted_mean_of_its_windows(tiny_checkpoint, tmp_path, declared):
    """Windows of the model's length (128: the tiny model's positions), or of the length its sentence-transformers
    config says it embeds."""
    checkpoint = tiny_checkpoint
    if declared:
        checkpoint = tmp_path / "declared"
        shutil.copytree(tiny_checkpoint, checkpoint)
        (checkpoint / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": declared}))
    tokenizer = load_checkpoint(checkpoint).tokenizer
    window = declared or tokenizer.model_max_length
    text = long_text(5 * tokenizer.model_max_length, tokenizer)
    ids = tokenizer.encode(text).ids
    windows = windows_of(ids, window, overlap=16)
    assert len(windows) >= 6
    async with serving(checkpoint, long_input_overlap=16) as client:
        assert (await client.get("/info")).json()["limits"]["long_input_window"] == window
        refused = await client.post("/embed", json={"inputs": ["short", text]})
        chunked = (await client.post("/embed", json={"inputs": [text, "a short one"], "long_input": "chunk"})).json()
        raw = (await client.post("/embed", json={"inputs": text, "long_input": "chunk", "normalize": False})).json()
        alone = [(await client.post("/embed", json={"inputs": w, "normalize": False})).json()[0] for w in windows]
        short = (await client.post("/embed", json={"inputs": "a short one"})).json()[0]
        openai = (await client.post("/v1/embeddings", json={"input": [text], "long_input": "chunk"})).json()
        ours = (await client.post("/encode", json={"inputs": [text], "pooling": "mean", "normalize": True,
                                                   "long_input": "chunk"})).json()
        shortened = (await client.post("/embed", json={"inputs": text, "long_input": "chunk", "dimensions": 16})).json()
    assert refused.status_code == 422 and "inputs[1]" in refused.json()["error"]
    weights = np.array([len(w) for w in windows], dtype=np.float64)
    want = weights @ np.asarray(alone, dtype=np.float64) / weights.sum()
    assert cosine(raw[0], want) >= 0.9999
    np.testing.assert_allclose(raw[0], want, atol=1e-5)  # the mean, not normalised, when not asked
    np.testing.assert_allclose(chunked[0], want / np.linalg.norm(want), atol=1e-5)
    np.testing.assert_allclose(chunked[1], short, atol=1e-6)  # a short input beside a long one answers as alone
    np.testing.assert_allclose(openai["data"][0]["embedding"], chunked[0], atol=1e-6)
    assert openai["usage"]["prompt_tokens"] == len(ids)
    np.testing.assert_allclose(ours["results"][0]["embedding"], chunked[0], atol=1e-6)
    np.testing.assert_allclose(shortened[0], want[:16] / np.linalg.norm(want[:16]), atol=1e-5)


async def test_chunking_is_bounded_and_needs_pooled_single_texts(tiny_checkpoint):
    tokenizer = load_checkpoint(tiny_checkpoint).tokenizer
    text = long_text(3 * tokenizer.model_max_length, tokenizer)
    async with serving(tiny_checkpoint, max_inputs_per_request=8) as client:
        tokens = await client.post("/encode", json={"inputs": text, "long_input": "chunk"})
        pair = await client.post("/encode", json={"inputs": [[text, "b"]], "pooling": "mean", "long_input": "chunk"})
        both = await client.post("/embed", json={"inputs": text, "long_input": "chunk", "truncate": True})
        many = await client.post("/embed", json={"inputs": [text, text, text], "long_input": "chunk"})
        openai = await client.post("/v1/embeddings", json={"input": text})
        fine = await client.post("/embed", json={"inputs": text, "long_input": "chunk"})
    assert tokens.status_code == 422 and "needs pooling" in tokens.json()["error"]
    assert pair.status_code == 422 and "splits single texts" in pair.json()["error"]
    assert both.status_code == 422 and "not both" in both.json()["error"]
    assert many.status_code == 422 and "windows of the model's length; the limit is 8" in many.json()["error"]
    assert openai.status_code == 400 and "tokens long" in openai.json()["error"]["message"]
    assert fine.status_code == 200
