"""A client that leaves while its request waits: its inputs are dropped before they reach the device, under
uvicorn (one timer watches every request) and under any other ASGI server (a task per request)."""

from __future__ import annotations

import asyncio
import re
import threading

import httpx
import pytest
import uvicorn

from devkit.server import free_port
from service.app import create_app
from service.engine.engine import Engine
from service.frontend.fast_routes import DirectEntry
from service.settings import Settings

pytestmark = pytest.mark.anyio


class HeldEngine(Engine):
    """Holds the first batch on the device until released, and remembers the first token of every input run."""

    release = threading.Event()
    entered = threading.Event()
    seen: list[int] = []

    def run(self, batch):
        self.seen.extend(item.input_ids[1] for item in batch.items)
        self.entered.set()
        self.release.wait(30)
        return super().run(batch)


def _reset() -> None:
    HeldEngine.release.clear()
    HeldEngine.entered.clear()
    HeldEngine.seen.clear()


def _settings(checkpoint) -> Settings:
    return Settings(checkpoint=str(checkpoint), concurrent_batches=1, max_batch_size=1, warmup=False)


def _dropped(metrics: str) -> float:
    found = re.search(r'^bert_items_dropped_total\{model="[^"]*",reason="disconnected"\} (\S+)$', metrics, re.M)
    return float(found.group(1)) if found else 0.0


async def _dropped_soon(client: httpx.AsyncClient) -> float:
    """The count of inputs dropped for a departed client, once it is not 0 (or after 10 s): an input that left
    while waiting prepared for the device is dropped when a runner takes it, just after the held batch ends."""
    for _ in range(200):
        dropped = _dropped((await client.get("/metrics")).text)
        if dropped:
            return dropped
        await asyncio.sleep(0.05)
    return 0.0


async def test_under_uvicorn_a_client_that_hangs_up_loses_its_queued_inputs_only(tiny_checkpoint):
    _reset()
    app = create_app(_settings(tiny_checkpoint), engine_factory=HeldEngine)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(DirectEntry(app), host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.ensure_future(server.serve())
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            while not server.started or (await client.get("/health")).status_code != 200:
                await asyncio.sleep(0.05)
            first = asyncio.ensure_future(client.post("/embed", json={"inputs": "hello"}))
            assert await asyncio.to_thread(HeldEngine.entered.wait, 10)
            tokenizer = app.state.runtime.checkpoint.tokenizer
            leaving_id = tokenizer.encode("world").ids[1]

            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            body = b'{"inputs": "world"}'
            writer.write(b"POST /embed HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
            await asyncio.sleep(0.3)  # queued behind the held batch
            writer.close()
            await writer.wait_closed()
            await asyncio.sleep(0.3)  # several sweeps

            HeldEngine.release.set()  # (its input may wait prepared for the device: it is dropped there)
            assert (await first).status_code == 200
            assert await _dropped_soon(client) == 1.0
            staying = await client.post("/embed", json={"inputs": "world"})  # the server serves on
            assert staying.status_code == 200
            assert HeldEngine.seen.count(leaving_id) == 1  # the second "world" only: the one that left never ran
    finally:
        HeldEngine.release.set()
        server.should_exit = True
        await serving


async def test_under_another_server_a_disconnect_message_drops_the_inputs_too(tiny_checkpoint):
    _reset()
    app = create_app(_settings(tiny_checkpoint), engine_factory=HeldEngine)  # no DirectEntry: the task watches
    async with app.router.lifespan_context(app):
        await app.state.loading
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=30)
        first = asyncio.ensure_future(client.post("/embed", json={"inputs": "hello"}))
        assert await asyncio.to_thread(HeldEngine.entered.wait, 10)
        leaving_id = app.state.runtime.checkpoint.tokenizer.encode("world").ids[1]

        hang_up = asyncio.Event()
        messages = [{"type": "http.request", "body": b'{"inputs": "world"}', "more_body": False}]

        async def receive():
            if messages:
                return messages.pop()
            await hang_up.wait()
            return {"type": "http.disconnect"}

        answers = []

        async def send(message):
            answers.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/embed", "raw_path": b"/embed", "root_path": "", "query_string": b"",
                 "headers": [(b"host", b"t"), (b"content-type", b"application/json")], "client": ("127.0.0.1", 1),
                 "server": ("127.0.0.1", 80)}
        leaving = asyncio.ensure_future(app(scope, receive, send))
        await asyncio.sleep(0.3)
        hang_up.set()
        await asyncio.wait_for(leaving, 10)  # answered at once, while the device is still held
        assert answers[0]["status"] == 503 and b"client disconnected" in answers[1]["body"]

        HeldEngine.release.set()
        assert (await first).status_code == 200
        assert await _dropped_soon(client) == 1.0
        assert leaving_id not in HeldEngine.seen
        await client.aclose()
