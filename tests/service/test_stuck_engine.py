"""An engine that stops making progress (a stopped process, a hung device or thread) is noticed: requests are
answered 503 by their deadline and its grace whatever the engine does, `/live` fails (so the orchestrator
restarts the server) and `/health` says why; when the engine moves again, both recover. Short settings."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import httpx
import pytest

from devkit.server import start_service
from service.engine.engine import Engine
from service.messages import Heartbeat, decode, encode
from tests.service.conftest import serving
from tests.service.test_processes import children

QUEUE_S, GRACE_S, STALL_S = 2.0, 0.5, 3.0


def test_the_heartbeat_travels_and_says_when_the_engine_is_stuck():
    assert decode(encode(Heartbeat(4.5))) == Heartbeat(4.5)
    assert Heartbeat(0.0).problem(3.0) is None and Heartbeat(2.9).problem(3.0) is None
    assert "finished no batch for 5 s" in Heartbeat(4.6).problem(3.0)


def test_a_stopped_engine_process_is_noticed_and_requests_end_by_their_deadline(tiny_checkpoint):
    """The drill of docs/processes.md's Faults table: SIGSTOP the engine of a --workers 2 server. Its requests used
    to wait for as long as it stayed stopped (39 s for a 30 s deadline), with /live and /health at 200."""
    process, url = start_service(tiny_checkpoint, "--workers", "2", "--queue-timeout-s", str(QUEUE_S),
                                 "--deadline-grace-s", str(GRACE_S), "--stall-timeout-s", str(STALL_S))
    engine = children(process.pid)["service.engine.server"][0]
    try:
        assert httpx.post(url + "/embed", json={"inputs": "a river"}).status_code == 200
        os.kill(engine, signal.SIGSTOP)
        stopped = time.monotonic()

        async def waiting_requests() -> list[tuple[int, float, str]]:
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                async def one(i: int):
                    answer = await client.post("/embed", json={"inputs": f"river {i}"})
                    return answer.status_code, time.monotonic() - stopped, answer.json()["error"]

                return await asyncio.gather(*(one(i) for i in range(8)))

        for status, took, error in asyncio.run(waiting_requests()):
            assert status == 503 and "deadline" in error, error
            assert QUEUE_S + GRACE_S - 0.1 < took < QUEUE_S + GRACE_S + 0.6, took
        while time.monotonic() - stopped < STALL_S + 0.6:
            time.sleep(0.1)
        for path in ("/live", "/health"):
            answer = httpx.get(url + path)
            assert answer.status_code == 503 and "sent no heartbeat" in answer.json()["error"], answer.text
        refused = httpx.post(url + "/embed", json={"inputs": "a river"})  # at once: no point in waiting
        assert refused.status_code == 503 and "sent no heartbeat" in refused.json()["error"]

        os.kill(engine, signal.SIGCONT)
        resumed = time.monotonic()
        while httpx.get(url + "/live").status_code != 200:
            assert time.monotonic() - resumed < 2, "/live did not come back"
            time.sleep(0.05)
        assert httpx.get(url + "/health").status_code == 200
        assert httpx.post(url + "/embed", json={"inputs": "a river"}).status_code == 200
    finally:
        os.kill(engine, signal.SIGCONT)  # a stopped process ignores SIGTERM and would outlive the test
        process.kill()
        process.wait()


class HangingEngine(Engine):
    """A device that hangs inside run() until released (a stuck compute thread of --workers 0)."""

    release = threading.Event()
    entered = threading.Event()

    def run(self, batch):
        self.entered.set()
        self.release.wait(30)
        return super().run(batch)


@pytest.mark.anyio
async def test_a_hung_compute_thread_is_noticed_in_one_process(tiny_checkpoint):
    HangingEngine.release.clear()
    HangingEngine.entered.clear()
    async with serving(tiny_checkpoint, engine_factory=HangingEngine, queue_timeout_s=0.5, deadline_grace_s=0.2,
                       stall_timeout_s=1.0, max_batch_size=1, concurrent_batches=1, warmup=False) as client:
        try:
            started = time.monotonic()
            waiting = [asyncio.ensure_future(client.post("/encode", json={"inputs": f"river {i}"})) for i in range(2)]
            assert await asyncio.to_thread(HangingEngine.entered.wait, 10)
            assert (await client.get("/live")).status_code == 200  # busy is not stuck
            for answer in await asyncio.gather(*waiting):
                assert answer.status_code == 503 and "finished no batch" in answer.json()["error"], answer.text
            assert time.monotonic() - started < 1.0 + 2.0  # the stall noticed, not the 30 s hang
            for path in ("/live", "/health"):
                answer = await client.get(path)
                assert answer.status_code == 503 and "finished no batch" in answer.json()["error"], answer.text
            assert (await client.post("/encode", json={"inputs": "a river"})).status_code == 503
        finally:
            HangingEngine.release.set()
        deadline = time.monotonic() + 5
        while (await client.get("/live")).status_code != 200:
            assert time.monotonic() < deadline, "/live did not come back"
            await asyncio.sleep(0.05)
        assert (await client.post("/encode", json={"inputs": "a river"})).status_code == 200


@pytest.mark.anyio
async def test_the_engine_drops_a_request_at_its_deadline_while_its_device_hangs(tiny_checkpoint):
    """One batch on the hung device, the next prepared, and a request queued behind them: the engine itself answers
    it at its deadline. (The preparer slept without a timeout over the then-empty queue, and the entry's deadline,
    later than a stale earlier one, did not wake it: the request waited for as long as the device hung.)"""
    HangingEngine.release.clear()
    HangingEngine.entered.clear()
    async with serving(tiny_checkpoint, engine_factory=HangingEngine, queue_timeout_s=0.3, deadline_grace_s=10,
                       stall_timeout_s=30, max_batch_size=1, concurrent_batches=1, warmup=False) as client:
        try:
            blockers = [asyncio.ensure_future(client.post("/encode", json={"inputs": "first"})) for _ in range(2)]
            assert await asyncio.to_thread(HangingEngine.entered.wait, 10)
            await asyncio.sleep(0.1)  # the second is prepared by now, the queue empty
            started = time.monotonic()
            late = await asyncio.wait_for(client.post("/encode", json={"inputs": "waits too long"}), 5)
            assert late.status_code == 503 and "waited in the queue past its deadline" in late.json()["error"]
            assert time.monotonic() - started < 0.3 + 1.2  # its deadline, not the hang
        finally:
            HangingEngine.release.set()
        assert [b.status_code for b in await asyncio.gather(*blockers)] == [200, 200]
