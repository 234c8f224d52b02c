"""Schema-driven fuzzing with schemathesis, against a real server: over 1,000 generated requests on every
route of the app's own OpenAPI document. None may get a 5xx, every response must match what the
document promises (status code, content type, body schema), and after each route's requests the server
must be healthy and give the same answers."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import positive_data_acceptance

from devkit.server import start_service
from service.app import create_app
from service.settings import Settings

# The document is static: building the app does not load a model (that happens in its lifespan).
schema = schemathesis.openapi.from_dict(create_app(Settings()).openapi())
EXAMPLES_PER_OPERATION = 150  # x 17 POST routes, half that on the 3 classifier routes, plus the GET routes
# The classifier routes and the root (whose tasks include classification) are fuzzed against a cross-encoder.
CLASSIFIER_ROUTES = "^/(predict|rerank|invocations)$"
# A POST route's cases in one run, at least: hypothesis stops short of max_examples only where the space runs out
# (the fewest, 102, on /invocations at half the examples, 2026-11-28). A GET route may have a handful.
MIN_POST_CASES = EXAMPLES_PER_OPERATION // 2
REFERENCE = {"inputs": ["a crane is flying", ["the river", "flows south"]], "pooling": "mean"}


@pytest.fixture(scope="module")
def fuzz_target(tiny_checkpoint):
    process, url = start_service(tiny_checkpoint)
    yield url, httpx.post(url + "/encode", json=REFERENCE, timeout=30).json()
    process.kill()
    process.wait()


@pytest.fixture
def sent(request):
    """The cases of one test (one route; hypothesis runs them all within it), and after them the test's own checks:
    its cases were sent (a POST route's bodies give hypothesis room for MIN_POST_CASES at least), and its server is
    healthy and answers as before them. Run as the fixture's teardown, the one point after every case."""
    cases: list[str] = []  # the operation of each case ("POST /encode"), whatever method the case itself sent
    yield cases
    url, before = request.getfixturevalue("fuzz_target" if "fuzz_target" in request.fixturenames
                                          else "cross_encoder_target")
    assert cases, "hypothesis generated no case"
    if cases[0].startswith("POST "):
        assert len(cases) >= MIN_POST_CASES, (cases[0], len(cases))
    assert httpx.get(url + "/health", timeout=30).status_code == 200
    assert httpx.post(url + "/encode", json=REFERENCE, timeout=30).json() == before


def check(case, url: str, sent: list) -> None:
    response = case.call(base_url=url, timeout=30)
    key = f"{case.method} {case.path}"
    sent.append(f"{case.operation.method.upper()} {case.operation.path}")
    # 501 is the documented answer of a route the checkpoint has no head for (it names what it has); TEI's
    # routes answer it 424 as TEI does, and a 424 that is not such a refusal is a failure inside (TEI's Backend).
    refused = response.status_code in (501, 424) and "this checkpoint has" in response.text
    failed = response.status_code >= 500 or response.status_code == 424
    assert not failed or refused, f"{key}: {response.status_code} {response.text[:300]}"
    # Every other check stays on. A schema-valid request may still get the documented 422 for rules a
    # schema cannot state (an empty or whitespace text, no [MASK], over the length or count limits).
    excluded = [positive_data_acceptance] + ([not_a_server_error] if refused else [])
    case.validate_response(response, excluded_checks=excluded)


@schema.exclude(path_regex=CLASSIFIER_ROUTES).parametrize()
@settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_generated_requests_get_documented_answers(case, fuzz_target, sent):
    check(case, fuzz_target[0], sent)


@pytest.fixture(scope="module")
def cross_encoder_target(tiny_cross_encoder):
    process, url = start_service(tiny_cross_encoder)
    yield url, httpx.post(url + "/encode", json=REFERENCE, timeout=30).json()
    process.kill()
    process.wait()


@schema.include(path_regex=CLASSIFIER_ROUTES).parametrize()
@settings(max_examples=EXAMPLES_PER_OPERATION // 2, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_generated_requests_to_a_cross_encoder_get_documented_answers(case, cross_encoder_target, sent):
    check(case, cross_encoder_target[0], sent)


def test_every_post_route_is_fuzzed():
    """The routes the two tests above are made for, read off the schema they are made from (not off their counts)."""
    fuzzed = {f"{op.method.upper()} {op.path}" for result in schema.get_all_operations() for op in [result.ok()]}
    assert {"POST /encode", "POST /fill-mask", "POST /nsp", "POST /v1/embeddings", "POST /embed", "POST /embed_all",
            "POST /tokenize", "POST /embeddings", "POST /embed_sparse", "POST /similarity", "POST /decode", "POST /",
            "POST /predict", "POST /rerank", "POST /invocations", "POST /v1/rerank", "POST /v2/rerank",
            "POST /token-vectors", "POST /token-classification", "POST /question-answering"} <= fuzzed
