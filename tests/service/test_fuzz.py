"""Schema-driven fuzzing with schemathesis, against a real server: over 1,000 generated requests on every
route of the app's own OpenAPI document. None may get a 5xx, every response must match what the
document promises (status code, content type, body schema), and the server must be healthy and give
the same answers afterwards."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from devkit.server import start_service
from service.app import create_app
from service.settings import Settings

# The document is static: building the app does not load a model (that happens in its lifespan).
schema = schemathesis.openapi.from_dict(create_app(Settings()).openapi())
EXAMPLES_PER_OPERATION = 350  # x 3 POST routes, plus the GET routes: over 1,000 requests
sent: dict[str, int] = {}
REFERENCE = {"inputs": ["a crane is flying", ["the river", "flows south"]], "pooling": "mean"}


@pytest.fixture(scope="module")
def fuzz_target(tiny_checkpoint):
    process, url = start_service(tiny_checkpoint)
    before = httpx.post(url + "/encode", json=REFERENCE, timeout=30).json()
    yield url, before
    process.kill()
    process.wait()


@schema.parametrize()
@settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_generated_requests_get_documented_answers(case, fuzz_target):
    url, _ = fuzz_target
    response = case.call(base_url=url, timeout=30)
    key = f"{case.method} {case.path}"
    sent[key] = sent.get(key, 0) + 1
    assert response.status_code < 500, f"{key}: {response.status_code} {response.text[:300]}"
    # Every other check stays on. A schema-valid request may still get the documented 422 for rules a
    # schema cannot state (an empty or whitespace text, no [MASK], over the length or count limits).
    case.validate_response(response, excluded_checks=[positive_data_acceptance])


def test_fuzzing_sent_enough_and_the_server_still_answers_the_same(fuzz_target):
    url, before = fuzz_target
    assert sum(sent.values()) >= 1000, sent
    assert {"POST /encode", "POST /fill-mask", "POST /nsp", "POST /v1/embeddings", "POST /embed", "POST /embed_all",
            "POST /tokenize"} <= set(sent)
    assert httpx.get(url + "/health", timeout=30).status_code == 200
    after = httpx.post(url + "/encode", json=REFERENCE, timeout=30).json()
    assert after == before
