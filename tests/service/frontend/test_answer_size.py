"""A request's answer is bounded as its question is (`max_response_mb`): refused up front with 422 naming the
limit and the request's own figures, before any compute; every request of the documented limits gets through."""

from __future__ import annotations

import pytest

from service.errors import ServiceError
from service.frontend import answer_size
from service.settings import Settings
from tests.service.conftest import serving

pytestmark = pytest.mark.anyio
DEFAULT_MB = Settings.model_fields["max_response_mb"].default
WIDTH = 384  # the bundled model's


def refused(check, *args) -> bool:
    try:
        check(*args)
    except ServiceError as error:
        assert error.kind == "validation" and "max_response_mb" in error.message
        return True
    return False


def test_the_default_refuses_the_answers_of_the_issue_and_lets_documented_requests_through():
    # 64 inputs x 50 masks x top_k 100 (a 22 KB request; 217 MB of JSON on the bundled model: RELIABILITY.md)
    assert refused(answer_size.check_predictions, [(50, 102, 100)] * 64, DEFAULT_MB)
    # /encode of 64 x 512 tokens without pooling (146 MB of JSON, 67 MB in base64)
    assert refused(answer_size.check_vectors, [512] * 64, WIDTH, False, False, DEFAULT_MB)
    assert refused(answer_size.check_vectors, [512] * 64, WIDTH, False, True, DEFAULT_MB)
    # documented normal use: pooled vectors of 64 x 512 tokens, 64-input fill-mask with a few masks at top_k 5,
    # the largest top_k on 64 one-mask inputs, token vectors of a few sentences
    assert not refused(answer_size.check_vectors, [512] * 64, WIDTH, True, False, DEFAULT_MB)
    assert not refused(answer_size.check_predictions, [(3, 64, 5)] * 64, DEFAULT_MB)
    assert not refused(answer_size.check_predictions, [(1, 64, 100)] * 64, DEFAULT_MB)
    assert not refused(answer_size.check_vectors, [128] * 16, WIDTH, False, False, DEFAULT_MB)
    assert not refused(answer_size.check_pieces, 64 * 512, DEFAULT_MB)


async def test_a_request_over_the_cap_is_refused_before_compute(tiny_checkpoint):
    async with serving(tiny_checkpoint, max_response_mb=0.5) as client:
        computed = client.app.state.runtime.metrics.items_computed.labels(model="tiny")
        before = computed._value.get()
        text = "the " + " ".join(["[MASK] river"] * 20)
        response = await client.post("/fill-mask", json={"inputs": [text] * 64, "top_k": 100})
        assert response.status_code == 422, response.text
        message = response.json()["error"]
        assert "1280 masks x top_k 100 = 128000 predictions" in message and "limit is 0.5 MB" in message
        response = await client.post("/encode", json={"inputs": ["word " * 120] * 64, "truncate": True})
        assert response.status_code == 422 and "64 inputs, " in response.json()["error"]
        response = await client.post("/embed_all", json={"inputs": ["word " * 120] * 64, "truncate": True})
        assert response.status_code == 422 and response.json()["error_type"] == "Validation"
        assert computed._value.get() == before  # nothing reached the model
        # the same inputs pooled, or fewer masks, are fine
        pooled = {"inputs": ["word " * 120] * 64, "pooling": "mean", "truncate": True}
        assert (await client.post("/encode", json=pooled)).status_code == 200
        assert (await client.post("/fill-mask", json={"inputs": [text] * 4, "top_k": 5})).status_code == 200


async def test_similarity_takes_as_many_sentences_as_the_input_limit(tiny_checkpoint):
    async with serving(tiny_checkpoint) as client:
        for path in ("/similarity", "/"):
            body = {"inputs": {"source_sentence": "a river", "sentences": ["the stream"] * 64}}
            response = await client.post(path, json=body)
            assert response.status_code == 200 and len(response.json()) == 64, response.text
            body["inputs"]["sentences"].append("one more")
            response = await client.post(path, json=body)
            assert response.status_code == 422 and "sentences has 65 entries" in response.json()["error"]
        response = await client.post("/similarity", json={"inputs": {"source_sentence": " ", "sentences": ["a"]}})
        assert response.status_code == 422 and "source_sentence is empty" in response.json()["error"]
