"""TEI's routes checked against text-embeddings-inference's own OpenAPI document (tests/data/tei-openapi.json),
not against our restatement of it: every answer, good or bad, must have a status the document lists for
the route and a body that matches the document's schema for that status (schemathesis' response checks),
and every error body must be TEI's `ErrorResponse`, whose `error_type` is TEI's enum."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema_rs
import pytest
import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from service.errors import KINDS
from service.frontend.http_errors import TEI_ROUTES, error_body
from tests.service.conftest import serving

pytestmark = pytest.mark.anyio

TEI_DOCUMENT = Path(__file__).parents[2] / "data" / "tei-openapi.json"
TEI = schemathesis.openapi.from_path(TEI_DOCUMENT)
COMPONENTS = json.loads(TEI_DOCUMENT.read_text())["components"]
ERROR_RESPONSE = jsonschema_rs.validator_for({"$ref": "#/components/schemas/ErrorResponse", "components": COMPONENTS})
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# TEI's status for each of its types: `impl From<&ErrorType> for StatusCode` in router/src/http/server.rs.
TEI_STATUS = {"Unhealthy": 503, "Backend": 424, "Overloaded": 429, "Tokenizer": 422, "Validation": 422, "Empty": 400}

OVER_THE_BODY_LIMIT = {"inputs": ["x" * 40_000] * 60}
# (route, request body, status): one request per route that must succeed, then the ways each can fail.
ON_AN_ENCODER = [
    ("/embed", {"inputs": "a crane is flying"}, 200),
    ("/embed", {"inputs": ["a crane", [5, 6, 7]], "normalize": False, "dimensions": 16}, 200),
    ("/embed_all", {"inputs": ["a crane", "the river"], "truncate": True}, 200),
    ("/embed_sparse", {"inputs": "a crane is flying"}, 200),
    ("/tokenize", {"inputs": ["a crane", "the river"], "add_special_tokens": False}, 200),
    ("/decode", {"ids": [[5, 6, 7], [8]]}, 200),
    ("/similarity", {"inputs": {"source_sentence": "a crane", "sentences": ["a bird", "a river"]}}, 200),
    ("/embed", {"inputs": []}, 400),
    ("/embed", {"inputs": 5}, 422),
    ("/embed", {"inputs": ["a"] * 65}, 422),
    ("/embed", {"inputs": "word " * 400}, 422),
    ("/embed", OVER_THE_BODY_LIMIT, 413),
    ("/embed_all", {"inputs": "a", "truncation_direction": "up"}, 422),
    ("/embed_sparse", {"inputs": "   "}, 422),
    ("/tokenize", {"inputs": "a", "prompt_name": "query"}, 422),
    ("/decode", {"ids": []}, 400),
    ("/decode", {"ids": [[1, 99999999]]}, 422),
    ("/similarity", {"inputs": {"source_sentence": "a", "sentences": []}}, 400),
    ("/predict", {"inputs": "a"}, 424),  # no classification head: TEI's Backend, "not a classifier"
    ("/rerank", {"query": "a", "texts": ["b"]}, 424),
]
ON_A_CROSS_ENCODER = [
    ("/rerank", {"query": "a crane", "texts": ["a bird", "a river"], "return_text": True}, 200),
    ("/predict", {"inputs": [["a crane", "a bird"]]}, 200),
    ("/rerank", {"query": "a", "texts": []}, 400),
    ("/rerank", {"query": "   ", "texts": ["a"]}, 422),
    ("/predict", {"inputs": []}, 400),
]


async def assert_as_tei_documents(client, cases) -> None:
    for path, body, status in cases:
        response = await client.post(path, json=body)
        assert response.status_code == status, (path, body, response.text[:300])
        TEI[path]["POST"].Case(body=body).validate_response(response, checks=CHECKS)
        if status >= 400:
            assert response.json()["error_type"] == error_type_for(status), (path, body, response.text)


def error_type_for(status: int) -> str:
    return {400: "Empty", 424: "Backend"}.get(status, "Validation")


async def test_tei_routes_answer_as_teis_document_says(tiny_checkpoint):
    async with serving(tiny_checkpoint) as client:
        await assert_as_tei_documents(client, ON_AN_ENCODER)


async def test_classifier_routes_answer_as_teis_document_says(tiny_cross_encoder):
    async with serving(tiny_cross_encoder) as client:
        await assert_as_tei_documents(client, ON_A_CROSS_ENCODER)


async def test_answers_tei_does_not_document_still_carry_its_error_body(tiny_checkpoint):
    """TEI's server answers a missing key, a wrong content type or method with no body; ours keep TEI's error
    shape there too, and the root routes (absent from TEI's document) use it for every error."""
    async with serving(tiny_checkpoint, api_key="tei-key-123") as client:
        key = {"Authorization": "Bearer tei-key-123"}
        answers = [
            (await client.post("/embed", json={"inputs": "a"}), 401),
            (await client.post("/embed", content=b'{"inputs": "a"}', headers={**key, "content-type": "text/plain"}), 415),
            (await client.get("/embed", headers=key), 405),
            (await client.post("/", json={"inputs": ["a [MASK]", "b"]}, headers=key), 422),
            (await client.post("/invocations", content=b'["a"]', headers={**key, "content-type": "application/json"}),
             422),
        ]
    for response, status in answers:
        assert response.status_code == status, response.text
        ERROR_RESPONSE.validate(response.json())
        assert response.json()["error_type"] == "Validation"


@pytest.mark.parametrize("path", sorted(TEI_ROUTES))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_error_kind_is_a_tei_error_with_teis_status_for_its_type(kind, path):
    status, body = error_body(kind, "what went wrong", path)
    ERROR_RESPONSE.validate(body)
    if kind in ("unauthorized", "payload_too_large", "unsupported_media_type", "not_found", "method_not_allowed",
                "request_timeout"):
        return  # TEI has no type for these; the status stays the one HTTP names (401, 413, 415, 404, 405, 408)
    assert status == TEI_STATUS[body["error_type"]], (kind, status, body)
