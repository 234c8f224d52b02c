"""The drop-in routes as their users meet them: the official `openai` client against a live server, and
the TEI routes against the shapes of text-embeddings-inference's OpenAPI description."""

from __future__ import annotations

import httpx
import jsonschema_rs
import numpy as np
import openai
import pytest

from devkit.server import start_service
from tests.optional import MINILM, required_or_skip

# The response and error shapes of TEI's OpenAPI description (docs/openapi.json of
# huggingface/text-embeddings-inference), restated as JSON Schema.
FLOATS = {"type": "array", "items": {"type": "number"}}
TEI_SHAPES = {
    "/embed": {"type": "array", "items": FLOATS},
    "/embed_all": {"type": "array", "items": {"type": "array", "items": FLOATS}},
    "/tokenize": {"type": "array", "items": {"type": "array", "items": {
        "type": "object", "required": ["id", "text", "special"], "additionalProperties": False,
        "properties": {"id": {"type": "integer", "minimum": 0}, "text": {"type": "string"},
                       "special": {"type": "boolean"}, "start": {"type": ["integer", "null"], "minimum": 0},
                       "stop": {"type": ["integer", "null"], "minimum": 0}}}}},
    "error": {"type": "object", "required": ["error", "error_type"], "additionalProperties": False,
              "properties": {"error": {"type": "string"}, "error_type": {"enum": [
                  "Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty"]}}},
}


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    process, url = start_service(tiny_checkpoint, "--api-key", "compat-key-123")
    yield url
    process.kill()
    process.wait()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server + "/v1", api_key="compat-key-123", max_retries=0)


def our_vectors(url: str, texts: list[str]) -> np.ndarray:
    body = {"inputs": texts, "pooling": "mean", "normalize": True}
    response = httpx.post(url + "/encode", json=body, headers={"Authorization": "Bearer compat-key-123"}, timeout=30)
    return np.array([r["embedding"] for r in response.json()["results"]], dtype=np.float32)


def test_openai_client_both_encodings_equal_our_mean_normalized_vectors(server, client):
    texts = ["a crane is flying over the river", "short", "the storm moved north ."]
    default = client.embeddings.create(model="anything", input=texts)  # the client asks for base64 by default
    floats = client.embeddings.create(model="anything", input=texts, encoding_format="float")
    single = client.embeddings.create(model="anything", input=texts[0])
    want = our_vectors(server, texts)
    for response in (default, floats):
        assert [d.index for d in response.data] == [0, 1, 2]
        got = np.array([d.embedding for d in response.data], dtype=np.float32)
        np.testing.assert_allclose(got, want, atol=1e-6)
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
        assert response.model == "tiny" and response.object == "list"
    np.testing.assert_allclose(single.data[0].embedding, want[0], atol=1e-6)
    tokens = httpx.post(server + "/tokenize", json={"inputs": texts},
                        headers={"Authorization": "Bearer compat-key-123"}).json()
    assert default.usage.prompt_tokens == default.usage.total_tokens == sum(len(t) for t in tokens)


@pytest.mark.parametrize("kwargs, words", [
    ({"input": [[101, 2023, 102]]}, ["token-id arrays", "check_embedding_ctx_length=False"]),
    ({"input": "x", "dimensions": 65}, ["dimensions must be between 1 and", "width 64", "got 65"]),
    ({"input": []}, ["input is empty"]),
    ({"input": ["ok", "   "]}, ["input[1] is empty"]),
    ({"input": "word " * 500}, ["input[0] is", "tokens long"]),
])
def test_openai_client_raises_its_own_errors_on_bad_input(client, kwargs, words):
    with pytest.raises(openai.BadRequestError) as raised:
        client.embeddings.create(model="m", **kwargs)
    error = raised.value.body
    assert raised.value.status_code == 400 and error["type"] == "invalid_request_error"
    for word in words:
        assert word in error["message"], error
    assert set(error) == {"message", "type", "param", "code"}


def test_openai_client_wrong_key_and_unknown_field(server):
    wrong = openai.OpenAI(base_url=server + "/v1", api_key="not-the-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.embeddings.create(model="m", input="a")
    response = httpx.post(server + "/v1/embeddings", json={"input": "a", "temperature": 1},
                          headers={"Authorization": "Bearer compat-key-123"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "temperature"
    models = openai.OpenAI(base_url=server + "/v1", api_key="compat-key-123").models.list()
    assert [m.id for m in models.data] == ["tiny"]


def test_tei_routes_answer_in_tei_shapes(server):
    headers = {"Authorization": "Bearer compat-key-123"}
    texts = ["a crane is flying", "Hello, wörld!"]
    for path, body in (("/embed", {"inputs": texts}), ("/embed_all", {"inputs": texts}),
                       ("/tokenize", {"inputs": texts}), ("/embed", {"inputs": texts[0], "normalize": False})):
        response = httpx.post(server + path, json=body, headers=headers, timeout=30)
        assert response.status_code == 200, response.text
        jsonschema_rs.validate(TEI_SHAPES[path], response.json())
    embedded = httpx.post(server + "/embed", json={"inputs": texts}, headers=headers).json()
    np.testing.assert_allclose(embedded, our_vectors(server, texts), atol=1e-6)
    per_token = httpx.post(server + "/embed_all", json={"inputs": texts}, headers=headers).json()
    tokens = httpx.post(server + "/tokenize", json={"inputs": texts}, headers=headers).json()
    assert [len(v) for v in per_token] == [len(t) for t in tokens]  # special tokens included
    second = tokens[1]
    assert second[0] == {"id": second[0]["id"], "text": "[CLS]", "special": True, "start": None, "stop": None}
    pieces = [t for t in second if not t["special"]]
    assert all(texts[1][t["start"]:t["stop"]] == t["text"] for t in pieces)  # character offsets into the input
    bare = httpx.post(server + "/tokenize", json={"inputs": texts[1], "add_special_tokens": False},
                      headers=headers).json()
    assert bare == [pieces]
    for path, body, status, kind in (("/embed", {"inputs": []}, 400, "Empty"), ("/embed", {"inputs": 5}, 422, "Validation"),
                                     ("/embed", {"inputs": "a", "truncation_direction": "up"}, 422, "Validation"),
                                     ("/tokenize", {"inputs": "a", "prompt_name": "query"}, 422, "Validation")):
        response = httpx.post(server + path, json=body, headers=headers)
        assert response.status_code == status, response.text
        jsonschema_rs.validate(TEI_SHAPES["error"], response.json())
        assert response.json()["error_type"] == kind


def test_pooling_follows_the_sentence_transformers_config(tmp_path):
    """all-MiniLM-L6-v2 is a mean-pooling, normalizing sentence-transformers model: /v1/embeddings and /embed
    give its sentence embeddings, equal to transformers' last hidden state mean-pooled and normalized."""
    minilm = required_or_skip(*MINILM).MODEL_DIR
    import torch
    import transformers

    texts = ["A man is eating food.", "The new movie is awesome"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm)
    model = transformers.AutoModel.from_pretrained(minilm).eval()
    encoded = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**encoded).last_hidden_state
    mask = encoded["attention_mask"][..., None].float()
    want = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1).numpy()
    process, url = start_service(minilm, "--dtype", "float32")  # held to transformers in float32
    try:
        info = httpx.get(url + "/info").json()
        assert info["pooling"]["mode"] == "mean" and "sentence-transformers" in info["pooling"]["source"]
        via_openai = openai.OpenAI(base_url=url + "/v1", api_key="x").embeddings.create(model="m", input=texts)
        via_tei = httpx.post(url + "/embed", json={"inputs": texts}).json()
    finally:
        process.kill()
        process.wait()
    np.testing.assert_allclose([d.embedding for d in via_openai.data], want, atol=2e-6)
    np.testing.assert_allclose(via_tei, want, atol=2e-6)
