"""The load generator's lean HTTP/1.1 client (bench.serving.http_client) against a real server (uvicorn): what it
reads back must be what the server sent, whatever the framing, and a cut-off answer must fail, not count."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from bench.serving.http_client import Connection, HTTPError
from bench.serving.load import drive, drive_processes, live_request


async def echo(request: Request) -> JSONResponse:
    return JSONResponse({"method": request.method, "body": (await request.body()).decode(),
                         "type": request.headers.get("content-type")})


async def chunked(request: Request) -> StreamingResponse:
    async def parts():
        for word in (b"one ", b"two ", b"three"):
            yield word
    return StreamingResponse(parts(), media_type="text/plain")


async def closing(request: Request) -> Response:
    return Response(b"bye", headers={"Connection": "close"})


async def refused(request: Request) -> JSONResponse:
    return JSONResponse({"error": "no"}, status_code=422)


APP = Starlette(routes=[Route("/echo", echo, methods=["GET", "POST"]), Route("/chunked", chunked),
                        Route("/closing", closing), Route("/refused", refused, methods=["POST"]),
                        Route("/live", closing)])


@pytest.fixture(scope="module")
def url():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(APP, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        threading.Event().wait(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def test_bodies_statuses_and_framings_come_back_as_sent(url):
    async def session():
        async with Connection(url) as connection:
            posted = await connection.request("POST", "/echo", json.dumps({"inputs": "héllo"}).encode())
            got = await connection.request("GET", "/echo")
            streamed = await connection.request("GET", "/chunked")
            closed = await connection.request("GET", "/closing")
            after_close = await connection.request("GET", "/echo")  # reconnects by itself
            refusal = await connection.request("POST", "/refused", b"{}")
            missing = await connection.request("GET", "/nowhere")
        return posted, got, streamed, closed, after_close, refusal, missing

    posted, got, streamed, closed, after_close, refusal, missing = asyncio.run(session())
    assert posted[0] == 200 and json.loads(posted[1]) == {"method": "POST", "body": '{"inputs": "h\\u00e9llo"}',
                                                          "type": "application/json"}
    assert got[0] == 200 and json.loads(got[1])["method"] == "GET"
    assert streamed == (200, b"one two three")
    assert closed == (200, b"bye") and after_close[0] == 200
    assert refusal == (422, b'{"error":"no"}')
    assert missing[0] == 404


def test_an_answer_cut_short_fails():
    async def scenario():
        async def half_answer(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(half_answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with Connection(f"http://127.0.0.1:{port}") as connection:
                with pytest.raises(HTTPError, match="closed before the answer was whole"):
                    await connection.request("GET", "/")
        finally:
            server.close()

    asyncio.run(scenario())


def test_the_load_generator_stops_at_the_first_error(url):
    refused_request = lambda texts: ("/refused", {"inputs": texts})  # noqa: E731
    with pytest.raises(RuntimeError, match="422"):
        asyncio.run(drive(url, ["a"], 2, 1.0, {"a": 1}, refused_request))
    latencies, sequences, _, _ = asyncio.run(drive(url, ["a"], 2, 0.3, {"a": 1}, live_request))
    assert latencies and sequences == 0  # GET /live carries no inputs


def test_the_clients_of_several_processes_are_counted_together(url):
    cpu_s: list[float] = []
    latencies, sequences, _, seconds = drive_processes(url, ["a"], 3, 0.3, {"a": 1}, "live", 0, processes=2,
                                                       cpu_s=cpu_s)
    assert len(latencies) >= 3 and sequences == 0 and seconds >= 0.3  # every client answered at least once
    # Both children's own CPU over the load: some, and less than two processes could spend in its wall time (their
    # start-up, an interpreter and its imports each, is not counted).
    assert len(cpu_s) == 1 and 0 < cpu_s[0] < 2 * (seconds + 0.5)


def test_a_load_process_that_fails_fails_the_run(url):
    with pytest.raises(RuntimeError, match="load-generator process failed"):
        drive_processes(url, ["a"], 2, 0.3, {"a": 1}, "no-such-request", 0, processes=2)


def test_only_plain_http_urls_are_taken():
    with pytest.raises(ValueError, match="plain http"):
        Connection("https://example.org")
