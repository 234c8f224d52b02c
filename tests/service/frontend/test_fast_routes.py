"""The computing routes answered by `service.frontend.fast_routes` (entered directly, as uvicorn serves them)
and by FastAPI itself give the same answer to every request of the nasty-input table and to a good request on
every POST route: same status, same headers that matter, same body."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager

import httpx
import pytest

from service.engine.link import LocalLink
from service.frontend.app import create_http_app
from service.frontend.fast_routes import DirectEntry
from service.frontend.runtime import Runtime
from service.metrics import Metrics
from service.settings import Settings
from tests.service.frontend.test_nasty_inputs import CASES, JSON

pytestmark = pytest.mark.anyio

GOOD = [
    ("/encode", {"inputs": ["a crane is flying", ["the river", "flows south"]], "pooling": "mean"}),
    ("/encode", {"inputs": "a crane", "encoding_format": "base64"}),
    ("/fill-mask", {"inputs": "the [MASK] flows .", "top_k": 3}),
    ("/nsp", {"inputs": [["it rains .", "the river rises ."]]}),
    ("/embed", {"inputs": ["a crane is flying", "the river"], "normalize": False}),
    ("/embed_all", {"inputs": "a crane"}),
    ("/embed_sparse", {"inputs": "a river"}),
    ("/similarity", {"inputs": {"source_sentence": "a river", "sentences": ["the stream", "a crane"]}}),
    ("/tokenize", {"inputs": "Hello rivers"}),
    ("/decode", {"ids": [[2, 30, 31]]}),
    ("/v1/embeddings", {"input": ["a crane is flying"], "model": "x"}),
    ("/embeddings", {"input": "a crane"}),
    ("/", {"inputs": "the [MASK] flows ."}),
    ("/", {"inputs": "a crane"}),
    ("/invocations", {"inputs": {"source_sentence": "a river", "sentences": ["the stream"]}}),
    ("/encode", {"inputs": "a"}),  # the API key's absence is checked on the app that has one (below)
]


@asynccontextmanager
async def both(checkpoint, **overrides):
    settings = Settings(checkpoint=checkpoint, **overrides)
    clients = []
    for fast in (True, False):
        metrics = Metrics()
        app = create_http_app(Runtime(settings, LocalLink(settings, metrics), metrics), fast_routes=fast)
        context = app.router.lifespan_context(app)
        await context.__aenter__()
        await app.state.loading
        served = DirectEntry(app) if fast else app  # as uvicorn serves it
        clients.append((context, httpx.AsyncClient(transport=httpx.ASGITransport(app=served), base_url="http://t")))
    try:
        yield [client for _, client in clients]
    finally:
        for context, client in clients:
            await client.aclose()
            await context.__aexit__(None, None, None)


def same(fast: httpx.Response, slow: httpx.Response, name: str) -> None:
    assert fast.status_code == slow.status_code, (name, fast.text, slow.text)
    assert fast.headers.get("content-type") == slow.headers.get("content-type"), name
    assert fast.headers.get("retry-after") == slow.headers.get("retry-after"), name
    assert fast.json() == slow.json(), name


async def test_every_request_gets_the_same_answer_both_ways(tiny_checkpoint):
    async with both(tiny_checkpoint, max_body_bytes=2 * 1024 * 1024) as (fast, slow):
        for route, body in GOOD:
            content = json.dumps(body).encode()
            same(await fast.post(route, content=content, headers=JSON),
                 await slow.post(route, content=content, headers=JSON), route)
        for name, route, body, headers, _, _ in CASES:
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            same(await fast.post(route, content=content, headers=headers),
                 await slow.post(route, content=content, headers=headers), name)


async def test_the_api_key_guards_the_fast_routes_too(tiny_checkpoint):
    async with both(tiny_checkpoint, api_key="a-long-secret") as (fast, slow):
        for route, body in GOOD:
            for headers in ({}, {"Authorization": "Bearer wrong-secret"}):
                same(await fast.post(route, json=body, headers=headers),
                     await slow.post(route, json=body, headers=headers), route)
            assert (await fast.post(route, json=body)).status_code == 401
        good = await fast.post("/encode", json={"inputs": "a"}, headers={"Authorization": "Bearer a-long-secret"})
        assert good.status_code == 200


async def test_the_fast_path_serves_every_post_route(tiny_checkpoint):
    """Every computing route is in the fast table (a new route that it cannot call would fall back to FastAPI
    silently, and cost what this module exists to save)."""
    from service.frontend.fast_routes import FastRoutes

    async with both(tiny_checkpoint) as (fast, _):
        assert (await fast.get("/health")).status_code == 200  # the middleware stack is built on the first request
        entry = fast._transport.app
        layer = entry.app.middleware_stack
        while not isinstance(layer, FastRoutes):
            layer = layer.app
        posts = {path for path, operations in entry.app.openapi()["paths"].items() if "post" in operations}
        assert set(layer.table) == posts and len(posts) >= 14
        assert entry.paths == posts  # and each enters it directly
