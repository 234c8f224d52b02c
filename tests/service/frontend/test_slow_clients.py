"""Clients that hold connections without finishing their requests, against real servers on loopback: stalled
bodies get 408 and their connections closed, and never take the admission slots complete requests need;
headers have a deadline; connections beyond the cap are refused; answers while draining close their
connection. Short settings, so that each case takes a few seconds."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time

import httpx
import pytest

from devkit.server import start_service

BODY_IDLE_S, BODY_TOTAL_S, HEADERS_S = 1.0, 3.0, 1.5
STALLED = 512  # as many as --max-concurrent-requests' default
# The stalled bodies' idle limit in the starvation case: long enough that a loaded machine answers the complete
# requests well within it (512 stalled connections and 32 requests took 2 s on a busy 2-core CI machine).
STALLED_IDLE_S = 6.0


def serve(checkpoint, body_idle_s: float):
    process, url = start_service(checkpoint, "--workers", "2", "--body-idle-timeout-s", str(body_idle_s),
                                 "--body-timeout-s", str(max(BODY_TOTAL_S, body_idle_s + 1)),
                                 "--header-timeout-s", str(HEADERS_S))
    yield process, url
    process.kill()
    process.wait()


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    yield from serve(tiny_checkpoint, BODY_IDLE_S)


@pytest.fixture
def patient_server(tiny_checkpoint):
    yield from serve(tiny_checkpoint, STALLED_IDLE_S)


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def read_answer(sock: socket.socket) -> tuple[int, dict, dict, bool]:
    """(status, headers, JSON body, whether the server then closed the connection) of one answer."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed without an answer after {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    while len(body) < int(headers["content-length"]):
        body += sock.recv(65536)
    closed = sock.recv(1) == b""
    return int(lines[0].split()[1]), headers, json.loads(body), closed


def stalled_post(url: str, sent: bytes = b'{"inputs": "a ri', declared: int = 100) -> socket.socket:
    sock = connect(url)
    sock.sendall(b"POST /embed HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % declared + sent)
    return sock


def nothing_to_read(sock: socket.socket) -> bool:
    """Whether the server has neither answered nor closed this connection yet (asked without waiting)."""
    timeout = sock.gettimeout()
    sock.settimeout(0)  # with a timeout, Python's recv first waits for something to read
    try:
        sock.recv(1, socket.MSG_PEEK)  # an answer's first byte, or b"" once closed
    except BlockingIOError:
        return True
    finally:
        sock.settimeout(timeout)
    return False


def test_stalled_bodies_do_not_starve_complete_requests(patient_server):
    """512 connections that send their headers and part of their body: complete requests are still answered
    (they used to get 429 for as long as the stalled connections stayed), and each stalled one gets 408 with
    its connection closed once its body has been idle for body_idle_timeout_s."""
    _, url = patient_server
    stalled = [stalled_post(url) for _ in range(STALLED)]
    opened = time.monotonic()

    async def real_requests() -> list[int]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            answers = await asyncio.gather(*(client.post("/embed", json={"inputs": f"river {i}"}) for i in range(32)))
        return [a.status_code for a in answers]

    assert asyncio.run(real_requests()) == [200] * 32
    # Answered while every stalled body still held its connection: none of them has had its 408 yet.
    assert all(nothing_to_read(sock) for sock in stalled), f"{time.monotonic() - opened:.1f} s after the stall"
    for sock in stalled:
        status, headers, body, closed = read_answer(sock)
        assert status == 408 and headers["connection"] == "close" and closed, (status, headers)
        assert "stalled" in body["error"] and body["error_type"] == "Validation"  # /embed speaks TEI's error shape
        sock.close()
    waited = time.monotonic() - opened
    assert STALLED_IDLE_S * 0.9 < waited < STALLED_IDLE_S + 3, waited
    assert httpx.post(url + "/embed", json={"inputs": "after"}).status_code == 200


def test_a_trickling_body_is_cut_at_the_overall_limit(server):
    """A byte every half second never trips the idle limit; the overall one ends it."""
    _, url = server
    sock = stalled_post(url, sent=b"{")
    started = time.monotonic()
    sock.settimeout(0.45)
    try:
        while True:
            sock.sendall(b" ")
            try:
                if sock.recv(1, socket.MSG_PEEK):
                    break
            except TimeoutError:
                pass
            assert time.monotonic() - started < BODY_TOTAL_S + 3, "the trickle was never cut"
    except (BrokenPipeError, ConnectionResetError):
        pass
    sock.settimeout(5)
    status, headers, body, closed = read_answer(sock)
    assert status == 408 and closed and f"within {BODY_TOTAL_S:g} s" in body["error"], body
    assert BODY_TOTAL_S - 0.2 < time.monotonic() - started < BODY_TOTAL_S + 1.5
    sock.close()


def test_headers_that_never_finish_are_cut(server):
    """uvicorn closes a connection only when it has been idle after an answer: one that opens and sends nothing,
    or sends its headers a little at a time, was kept for ever."""
    _, url = server
    silent, partial = connect(url), connect(url)
    partial.sendall(b"GET /health HTTP/1.1\r\nHost: te")
    started = time.monotonic()
    status, headers, body, closed = read_answer(partial)
    assert status == 408 and closed and "headers" in body["error"], body
    assert silent.recv(1) == b""  # closed without an answer: it never asked anything
    assert HEADERS_S - 0.2 < time.monotonic() - started < HEADERS_S + 1.5
    # Its deadline runs from the first byte of each request on a kept-alive connection, not from the opening.
    with httpx.Client(base_url=url) as client:
        assert client.get("/live").status_code == 200
        time.sleep(HEADERS_S + 0.5)
        assert client.get("/live").status_code == 200
    silent.close()
    partial.close()


def test_oversized_headers_are_refused(server):
    """Within its deadline a fast client could send megabytes of headers, every one kept by the parser."""
    _, url = server
    sock = connect(url)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\n")
    try:
        for n in range(100):  # 100 x 1 KiB headers: refused past 64 KiB
            sock.sendall(b"X-Filler-%d: %s\r\n" % (n, b"a" * 1024))
    except (BrokenPipeError, ConnectionResetError):
        pass  # closed by the server mid-way: what is checked below
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    assert data.startswith(b"HTTP/1.1 400 "), data[:200]
    sock.close()
    assert httpx.get(url + "/live").status_code == 200


def test_connections_beyond_the_cap_are_refused_with_503(tiny_checkpoint):
    process, url = start_service(tiny_checkpoint, "--workers", "0", "--max-connections", "8")
    try:
        idle = [connect(url) for _ in range(8)]
        time.sleep(0.2)  # accepted by the server
        refused = httpx.post(url + "/encode", json={"inputs": "a river"})
        assert refused.status_code == 503 and refused.headers["connection"] == "close", refused.headers
        assert refused.json()["error_type"] == "unavailable" and "8 connections" in refused.json()["error"]
        assert refused.headers["retry-after"] == "1"
        for sock in idle:
            sock.close()
        time.sleep(0.2)
        assert httpx.post(url + "/encode", json={"inputs": "a river"}).status_code == 200
    finally:
        process.kill()
        process.wait()


def test_answers_while_draining_close_their_connection(tiny_checkpoint):
    """A keep-alive client whose server starts draining gets a 503 that closes its connection, so its next request
    goes on a new connection (to another replica, behind a balancer) instead of being lost on one that the
    server closes without an answer when the drain ends. (Each front end of --workers N drains the same way.)"""
    process, url = start_service(tiny_checkpoint, "--workers", "0", "--drain-seconds", "2")
    try:
        with httpx.Client(base_url=url, timeout=10) as client:
            assert client.post("/embed", json={"inputs": "a river"}).headers.get("connection") != "close"
            process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 5
            while (health := client.get("/health")).status_code == 200:
                assert time.monotonic() < deadline
            assert health.status_code == 503 and health.headers["connection"] == "close"
            refused = client.post("/embed", json={"inputs": "a river"})
            assert refused.status_code == 503 and refused.headers["connection"] == "close"
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
