"""Property-based fuzzing of hostile request bodies against real servers, in both process arrangements
(`--workers 0`: one process; `--workers 2`: two front ends and an engine process).

Every field of every POST route's body (read off the app's OpenAPI document; the root route's fields off
its task models) gets, in turn, each class of value that once answered 5xx: nesting thousands deep, numbers
past every integer and float, lone surrogates as JSON escapes, invalid UTF-8; placed as the field's value,
inside a list there, or beside it under an unknown key. A fifth class sends a good body under odd
encodings (gzip and deflate, right and wrong; unknown codings; a gzip bomb; a byte order mark; UTF-16).
Most of those values never reach a field: the one body parser (service/frontend/body.py) refuses the body
as a whole first. So each answer is sorted by the stage that gave it (`stage`), and a sixth class, wrong
types, sends well-formed JSON values of the wrong type or size in every field, which the parser lets through
to that field's own validation. No answer may be a 5xx (nor TEI's 424 "Backend" other than a route the
checkpoint has no head for), every refusal must come from one of the stages, and after each test the server
is healthy and gives the same answer to the same request. `make test` runs EXAMPLES per class and route;
`pytest -m slow` SLOW_EXAMPLES. Each server's tally by class and stage is printed when it stops; RELIABILITY.md
states it.
"""

from __future__ import annotations

import copy
import gzip
import json
import zlib
from collections import Counter
from dataclasses import dataclass, field

import httpx
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from devkit.server import start_service
from service.app import create_app
from service.frontend.routes_root import RootClassifyRequest, RootEmbedRequest, RootFillMaskRequest
from service.frontend.schemas_tei import TeiSimilarityRequest
from service.settings import Settings

EXAMPLES = 8  # per class, route and arrangement in `make test`
SLOW_EXAMPLES = 100
ARRANGEMENTS = ("0", "2")  # --workers
CLASSES = ("deep nesting", "huge numbers", "lone surrogates", "invalid UTF-8", "encodings")
REFERENCE = ("/encode", {"inputs": ["a crane is flying", ["the river", "flows south"]], "pooling": "mean"})
# A good body per route, into which the hostile values go.
BASES = {
    "/encode": {"inputs": ["a crane is flying"], "pooling": "mean"},
    "/fill-mask": {"inputs": "the [MASK] flows .", "top_k": 3, "targets": ["river"]},
    "/nsp": {"inputs": [["it rains .", "the river rises ."]]},
    "/embed": {"inputs": ["a crane is flying"], "prompt_name": None},
    "/embed_all": {"inputs": "a crane"},
    "/embed_sparse": {"inputs": "a river"},
    "/similarity": {"inputs": {"source_sentence": "a river", "sentences": ["the stream"]}},
    "/tokenize": {"inputs": "Hello rivers"},
    "/decode": {"ids": [[2, 30, 31]]},
    "/v1/embeddings": {"input": ["a crane is flying"], "model": "x"},
    "/embeddings": {"input": "a crane"},
    "/predict": {"inputs": "a crane"},
    "/rerank": {"query": "a crane", "texts": ["a bird"]},
    "/v1/rerank": {"model": "m", "query": "a crane", "documents": ["a bird", {"text": "a river"}], "top_n": 1},
    "/v2/rerank": {"model": "m", "query": "a crane", "documents": ["a bird"], "max_tokens_per_doc": None},
    "/token-vectors": {"inputs": ["a crane"], "mode": "query", "dtype": "float16"},
    "/token-classification": {"inputs": ["a crane"], "aggregation_strategy": "simple", "ignore_labels": ["O"],
                              "stride": 4},
    "/question-answering": {"inputs": {"question": "what flies ?", "context": "a crane"}, "top_k": 2,
                            "max_answer_len": 3, "doc_stride": 2, "max_seq_len": 32, "align_to_words": True},
    "/": {"inputs": "the [MASK] flows .", "parameters": {"top_k": 2}},
    "/invocations": {"inputs": {"source_sentence": "a river", "sentences": ["the stream"]}},
}
def _fields(schema: dict, components: dict, prefix: tuple = (), depth: int = 0) -> list[tuple]:
    """Every property path of a JSON schema (through $ref and anyOf), objects inside objects included."""
    if "$ref" in schema:
        schema = components[schema["$ref"].rsplit("/", 1)[-1]]
    paths = []
    for option in schema.get("anyOf", []):
        paths += _fields(option, components, prefix, depth)
    for name, sub in schema.get("properties", {}).items():
        paths.append((*prefix, name))
        if depth < 2:
            paths += _fields(sub, components, (*prefix, name), depth + 1)
    return list(dict.fromkeys(paths))


def route_fields() -> dict[str, list[tuple]]:
    document = create_app(Settings()).openapi()
    components = document["components"]["schemas"]
    routes = {}
    for path, operations in document["paths"].items():
        body = operations.get("post", {}).get("requestBody", {}).get("content", {}).get("application/json")
        if body is not None:
            routes[path] = _fields(body["schema"], components)
    root = []  # the root's body is any object in the document; its fields are those of its task models
    for model in (RootEmbedRequest, RootFillMaskRequest, RootClassifyRequest, TeiSimilarityRequest):
        schema = model.model_json_schema()
        root += _fields(schema, schema.get("$defs", {}))
    for path in ("/", "/invocations"):
        routes[path] = list(dict.fromkeys(routes[path] + root))
    return routes


FIELDS = route_fields()
# The names a refusal at a field's own validation starts its message with: every name of the route's field paths,
# and the unknown key the draws put beside a field.
FIELD_NAMES = {route: {name for path in paths for name in path} | {"x_fuzz"} for route, paths in FIELDS.items()}
MARK = "\u2063fuzz\u2063"  # stands for the hostile value in the JSON text, then replaced by its raw bytes


def deep_values() -> st.SearchStrategy[bytes]:
    def nest(depth: int, kind: str) -> bytes:
        if kind == "list":
            return b"[" * depth + b"]" * depth
        if kind == "object":
            return b'{"a":' * depth + b"1" + b"}" * depth
        return b'[{"a":' * (depth // 2) + b"0" + b"}]" * (depth // 2)
    return st.builds(nest, st.integers(900, 3000), st.sampled_from(["list", "object", "mixed"]))


def huge_numbers() -> st.SearchStrategy[bytes]:
    digits = st.integers(19, 6000).map(lambda n: b"9" * n)
    return st.one_of(
        digits, digits.map(lambda d: b"-" + d), digits.map(lambda d: b"1." + d),
        st.sampled_from([b"1e999", b"-1e400", b"1e-400", b"NaN", b"Infinity", b"-Infinity", b"18446744073709551616",
                         b"-9223372036854775809", b"0" * 5000]),
    )


def _string(parts: list[bytes]) -> bytes:
    return b'"' + b"".join(parts) + b'"'


TEXT = st.text(alphabet="abc [MASK]", max_size=8).map(str.encode)


def surrogates() -> st.SearchStrategy[bytes]:
    lone = st.sampled_from([b"\\ud800", b"\\udbff", b"\\udc00", b"\\udfff", b"\\ud83d", b"\\ude00\\ud83d"])
    return st.lists(st.one_of(TEXT, lone), min_size=1, max_size=4).filter(
        lambda parts: any(b"\\ud" in p for p in parts)).map(_string)


def invalid_utf8() -> st.SearchStrategy[bytes]:
    broken = st.sampled_from([b"\xff", b"\xfe", b"\xc3", b"\xe9", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf",
                              b"\x80", b"\xf0\x9f\x98"])
    return st.lists(st.one_of(TEXT, broken), min_size=1, max_size=4).filter(
        lambda parts: any(p and p[0] >= 0x80 for p in parts)).map(_string)


HOSTILE = {"deep nesting": deep_values(), "huge numbers": huge_numbers(), "lone surrogates": surrogates(),
           "invalid UTF-8": invalid_utf8()}


def _put(body: dict, path: tuple, value) -> dict:
    body = copy.deepcopy(body)
    node = body
    for name in path[:-1]:
        if not isinstance(node.get(name), dict):
            node[name] = {}
        node = node[name]
    node[path[-1]] = value
    return body


@st.composite
def hostile_body(draw, route: str, kind: str) -> tuple[bytes, dict]:
    """(body, extra headers) for one request of class `kind` to `route`."""
    base = BASES[route]
    good = json.dumps(base).encode()
    if kind == "encodings":
        variant = draw(st.sampled_from(["gzip", "deflate", "raw deflate", "gzip twice", "gzip, not compressed",
                                        "truncated gzip", "gzip bomb", "br", "unknown", "bom", "utf-16"]))
        bodies = {
            "gzip": (gzip.compress(good), "gzip"), "deflate": (zlib.compress(good), "deflate"),
            "raw deflate": (zlib.compress(good, wbits=-zlib.MAX_WBITS), "deflate"),
            "gzip twice": (gzip.compress(gzip.compress(good)), "gzip, gzip"),
            "gzip, not compressed": (good, "gzip"), "truncated gzip": (gzip.compress(good)[:-9], "gzip"),
            "gzip bomb": (gzip.compress(b" " * 3_000_000 + good), "gzip"), "br": (good, "br"),
            "unknown": (good, draw(st.sampled_from(["foo", "compress", "zstd", "identity, br"]))),
            "bom": (b"\xef\xbb\xbf" + good, None), "utf-16": (json.dumps(base).encode("utf-16"), None),
        }
        content, coding = bodies[variant]
        return content, ({"content-encoding": coding} if coding else {})
    path = draw(st.sampled_from(FIELDS[route]))
    placement = draw(st.sampled_from(["value", "in a list", "under an unknown key"]))
    value = {"value": MARK, "in a list": ["ok", MARK], "under an unknown key": None}[placement]
    body = _put(base, path, value) if placement != "under an unknown key" else _put(base, (*path[:-1], "x_fuzz"), MARK)
    raw = draw(HOSTILE[kind])
    return json.dumps(body).encode().replace(json.dumps(MARK).encode(), raw, 1), {}


def acceptable(response: httpx.Response) -> bool:
    """No 5xx; TEI's 424 only for a route this checkpoint has no head for (TEI's own answer), which says so."""
    refused_route = response.status_code in (424, 501) and "this checkpoint has" in response.text
    return refused_route or (response.status_code < 500 and response.status_code != 424)


# How service/frontend/body.py and the body size guard (service/frontend/guards.py) word a refusal of the body as a
# whole: its size, its content coding, or its JSON; "body: " is the location of a body that is not an object at all
# (service/frontend/http_errors.py). The first stage a request meets, before any field is read.
BODY_REFUSALS = ("the request body ", "content-encoding ", "body: ")
STAGES = ("body", "field", "no head", "answered")


def _message(response: httpx.Response) -> tuple[str, str | None]:
    """(message, param) of an error answer, in any of the four APIs' shapes (service/frontend/http_errors.py)."""
    body = response.json()
    error = body.get("error", body.get("message"))
    if isinstance(error, dict):  # OpenAI's
        return error["message"], error.get("param")
    return error, None


def stage(response: httpx.Response, route: str) -> str:
    """Which stage answered: "body" (refused as a whole, before any field is read), "field" (refused by a field's
    own validation, which names it), "no head" (the fields were read; the checkpoint has no head for the route),
    "answered" (2xx); anything else is "unexplained", which no test lets pass."""
    if response.status_code < 300:
        return "answered"
    message, param = _message(response)
    if "this checkpoint has" in message:
        return "no head"
    if message.startswith(BODY_REFUSALS):
        return "body"
    if param in FIELD_NAMES[route] or any(message.startswith(_stem(name)) for name in FIELD_NAMES[route]):
        return "field"
    return "unexplained"


def _stem(name: str) -> str:
    """A field's name as a message may start with it: "targets" -> "target '' is not a single vocabulary token"."""
    return name.removesuffix("s")


@dataclass
class Target:
    arrangement: str  # --workers
    client: httpx.Client
    before: dict  # the answer to REFERENCE before any fuzzing
    tally: Counter = field(default_factory=Counter)  # (class, stage) -> answers, for the report alone

    def send(self, route: str, kind: str, content: bytes, headers: dict | None = None) -> tuple[httpx.Response, str]:
        response = self.client.post(route, content=content, headers={"content-type": "application/json",
                                                                      **(headers or {})})
        answered_by = stage(response, route) if acceptable(response) else "5xx"
        self.tally[(kind, answered_by)] += 1
        return response, answered_by

    def assert_unchanged(self) -> None:
        """The server is healthy and answers as before: what a test's own requests must leave behind."""
        assert self.client.get("/health").status_code == 200
        assert self.client.post(REFERENCE[0], json=REFERENCE[1]).json() == self.before


@pytest.fixture(scope="module", params=ARRANGEMENTS, ids=lambda w: f"workers-{w}")
def server(request, tiny_checkpoint):
    process, url = start_service(tiny_checkpoint, "--workers", request.param, "--drain-seconds", "0")
    with httpx.Client(base_url=url, timeout=60) as client:
        target = Target(request.param, client, client.post(REFERENCE[0], json=REFERENCE[1]).json())
        yield target
    process.kill()
    process.wait()
    report(request.config, target)


def report(config, target: Target) -> None:
    """The tally by class and stage, on the terminal even when output is captured (RELIABILITY.md's table)."""
    lines = [f"hostile bodies, --workers {target.arrangement}: answers by class and stage ({', '.join(STAGES)})"]
    kinds = (*CLASSES, *(f"sweep: {kind}" for kind in SWEEP), "wrong types",
             *(f"wrong types: {name}" for name in WRONG_TYPES))
    for kind in kinds:
        counts = {name: target.tally[(kind, name)] for name in (*STAGES, "unexplained", "5xx")
                  if target.tally[(kind, name)]}
        if counts:
            lines.append(f"  {kind}: {sum(counts.values())} requests, {counts}")
    with config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
        print("\n" + "\n".join(lines))


def fuzz(target: Target, route: str, kind: str, examples: int) -> None:
    sent = 0

    # Reproducible, and different for each route and class (one derandomized seed would draw the same for all).
    @seed(zlib.crc32(f"{route} {kind}".encode()))
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(request=hostile_body(route, kind))
    def one(request):
        nonlocal sent
        content, headers = request
        response, answered_by = target.send(route, kind, content, headers)
        sent += 1
        assert acceptable(response), \
            f"{route} {kind}: {response.status_code} {response.text[:300]} for {content[:200]!r}"
        assert answered_by in STAGES, f"{route} {kind}: no stage gave {response.status_code} {response.text[:300]}"

    one()
    assert sent >= min(examples, 5), f"{route} {kind}: hypothesis drew only {sent} bodies"
    target.assert_unchanged()


@pytest.mark.parametrize("kind", CLASSES)
@pytest.mark.parametrize("route", sorted(BASES))
def test_hostile_bodies_get_no_5xx(server, route, kind):
    fuzz(server, route, kind, EXAMPLES)


# One fixed value of each class in every field, as its value and inside a list there: each is beyond what the one
# body parser reads (deeper than 1,024 levels, a number past a float, a lone surrogate, invalid UTF-8), so wherever it
# sits the body is refused as a whole before any field is read. What this sweep shows is that every route's body goes
# through that parser; it exercises no field's validation (the wrong types below do).
SWEEP = {"deep nesting": b"[" * 2000 + b"]" * 2000, "huge numbers": b"9" * 4301, "lone surrogates": b'"a\\ud800"',
         "invalid UTF-8": b'"caf\xe9"'}


@pytest.mark.parametrize("route", sorted(BASES))
def test_every_field_of_every_route_has_each_class_refused_by_the_body_parser(server, route):
    for kind, raw in SWEEP.items():
        for path in FIELDS[route]:
            for value in (MARK, [MARK]):
                content = json.dumps(_put(BASES[route], path, value)).encode().replace(json.dumps(MARK).encode(), raw)
                response, answered_by = server.send(route, f"sweep: {kind}", content)
                assert answered_by == "body", f"{route} {path} {kind}: {response.status_code} {response.text[:300]}"
    server.assert_unchanged()


# Well-formed JSON of the wrong type or size for most fields: the parser reads each, so each reaches the field's own
# validation (or the route's checks after it), which must refuse it naming the field, or take it where it is valid
# there (null for an optional field, a string where a text is expected).
WRONG_TYPES = {"object": {"a": 1}, "10,000-element list": ["a"] * 10_000, "empty list": [], "empty string": "",
               "string": "a", "negative": -1, "zero": 0, "2^63 - 1": 2**63 - 1, "2^64 (read as a float)": 2**64,
               "fraction": 1.5, "boolean": True, "null": None}


@pytest.mark.parametrize("route", sorted(BASES))
def test_every_field_of_every_route_validates_values_of_the_wrong_type(server, route):
    for path in FIELDS[route]:
        for name, value in WRONG_TYPES.items():
            content = json.dumps(_put(BASES[route], path, value)).encode()
            response, answered_by = server.send(route, "wrong types", content)
            server.tally[(f"wrong types: {name}", answered_by)] += 1
            where = f"{route} {'.'.join(path)} = {name}: {response.status_code} {response.text[:300]}"
            assert acceptable(response), where
            assert answered_by in ("field", "no head", "answered"), where  # never the body parser: the JSON is good
            if answered_by == "field":  # it names this field, not merely some field of the route
                message, param = _message(response)
                assert param in path or any(message.startswith(_stem(part)) for part in path), where
    server.assert_unchanged()


@pytest.mark.slow
@pytest.mark.parametrize("kind", CLASSES)
@pytest.mark.parametrize("route", sorted(BASES))
def test_hostile_bodies_get_no_5xx_at_length(server, route, kind):
    fuzz(server, route, kind, SLOW_EXAMPLES)


def test_every_post_route_has_a_base_body_to_fuzz():
    assert set(FIELDS) == set(BASES), "a POST route without a base body is not fuzzed"


def test_each_answer_is_put_down_to_the_stage_its_message_names():
    def answer(status: int, body: dict) -> httpx.Response:
        return httpx.Response(status, json=body)

    nested = {"error": "the request body is nested more than 1024 levels deep (...)"}
    assert stage(answer(422, nested), "/encode") == "body"
    assert stage(answer(415, {"message": "content-encoding 'br' is not supported; ..."}), "/v1/rerank") == "body"
    assert stage(answer(422, {"error": "top_k must be between 1 and 100, got 0"}), "/fill-mask") == "field"
    assert stage(answer(422, {"error": "target '' is not a single vocabulary token"}), "/fill-mask") == "field"
    assert stage(answer(400, {"error": {"message": "Input should be a valid integer", "param": "dimensions"}}),
                 "/v1/embeddings") == "field"
    no_head = {"error": "this route needs a classifier; this checkpoint has: ..."}
    assert stage(answer(424, no_head), "/predict") == "no head"
    assert stage(answer(200, {"results": []}), "/encode") == "answered"
    # A refusal that names neither the body nor a field of this route is no stage's: the sweeps fail on it.
    assert stage(answer(422, {"error": "invalid request"}), "/encode") == "unexplained"
    assert stage(answer(422, {"error": "top_k must be between 1 and 100"}), "/encode") == "unexplained"
