"""`--workers N`: the engine process and N front ends, as real processes on loopback. They answer as one
process does, share one admission limit and one set of metrics, and survive or report the three faults:
a front end killed, the engine killed, SIGTERM."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from devkit.paths import REPO_ROOT
from devkit.server import free_port, start_service
from service.frontend.admission import SharedRequestCount, create_slots
from service.settings import Settings

WORKERS = 2


def children(pid: int) -> dict[str, list[int]]:
    """The supervisor's children by module: {"service.engine.server": [pid], "service.frontend.worker": [...]}."""
    found: dict[str, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            command = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat[1]) == pid and stat[0] != "Z" and b"-m" in command:
            found.setdefault(command[command.index(b"-m") + 1].decode(), []).append(int(entry))
    return found


@pytest.fixture
def workers(tiny_checkpoint):
    process, url = start_service(tiny_checkpoint, "--workers", str(WORKERS), "--drain-seconds", "0")
    yield process, url
    if process.poll() is None:
        process.kill()
        process.wait()


async def hammer(url: str, count: int, on_progress=None, inputs: int = 4, completed: list | None = None) -> list:
    """`count` /embed requests, 16 at a time, each on a fresh connection (so that every front end gets some);
    each outcome is a status or the name of the transport error, in request order (and appended to `completed`
    in the order they finished)."""
    limit = asyncio.Semaphore(16)
    done = 0
    completed = [] if completed is None else completed

    async def one(i: int):
        nonlocal done
        async with limit, httpx.AsyncClient(base_url=url, timeout=60) as client:
            try:
                response = await client.post("/embed", json={"inputs": [f"river {i} flows {k}" for k in range(inputs)]})
                outcome = response.status_code
            except httpx.TransportError as exc:
                outcome = type(exc).__name__
        done += 1
        completed.append(outcome)
        if on_progress is not None:
            await on_progress(done)
        return outcome

    return await asyncio.gather(*(one(i) for i in range(count)))


def test_front_ends_answer_as_one_process_does(tiny_checkpoint, workers):
    """Every family of routes through the front ends and the engine process equals the one-process server."""
    process, url = workers
    assert sorted(children(process.pid)) == ["service.engine.server", "service.frontend.worker"]
    assert len(children(process.pid)["service.frontend.worker"]) == WORKERS
    single, single_url = start_service(tiny_checkpoint, "--workers", "0")
    try:
        requests = [("/encode", {"inputs": ["a crane is flying", ["one", "two"]], "pooling": "none"}),
                    ("/embed", {"inputs": ["a crane is flying", "the river"]}),
                    ("/v1/embeddings", {"input": ["a crane is flying"], "model": "x"}),
                    ("/fill-mask", {"inputs": "the [MASK] flows [MASK] .", "top_k": 3}),
                    ("/nsp", {"inputs": [["it rains .", "the river rises ."]]}),
                    ("/embed_sparse", {"inputs": "a river"}),
                    ("/nsp", {"inputs": "not a pair"})]  # an error travels the same way
        with httpx.Client(timeout=30) as client:
            for path, body in requests:
                ours, theirs = client.post(url + path, json=body), client.post(single_url + path, json=body)
                assert ours.status_code == theirs.status_code, (path, ours.text)
                _assert_same(ours.json(), theirs.json(), path)
            info = client.get(url + "/info").json()
            assert info["ready"] and info["tokenization_workers"] == WORKERS and info["device"] == "cpu"
    finally:
        single.kill()
        single.wait()


def _assert_same(ours, theirs, where):
    if isinstance(ours, dict):
        assert ours.keys() == theirs.keys(), where
        for key in ours:
            _assert_same(ours[key], theirs[key], f"{where}.{key}")
    elif isinstance(ours, list) and ours and isinstance(ours[0], float):
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5, err_msg=where)
    elif isinstance(ours, list):
        assert len(ours) == len(theirs), where
        for a, b in zip(ours, theirs):
            _assert_same(a, b, where)
    elif isinstance(ours, float):
        assert abs(ours - theirs) <= 1e-5, where
    else:
        assert ours == theirs, where


def test_metrics_count_every_front_end(workers):
    _, url = workers
    outcomes = asyncio.run(hammer(url, 40))
    assert outcomes == [200] * 40
    text = httpx.get(url + "/metrics").text  # answered by one front end, counting both
    answered = sum(float(v) for v in re.findall(
        r'^bert_requests_total\{model="[^"]+",route="/embed",status="200"\} (\S+)$', text, re.MULTILINE))
    assert answered == 40
    assert float(re.search(r'^bert_items_computed_total\{model="[^"]+"\} (\S+)$', text, re.MULTILINE).group(1)) >= 160


def test_answers_leave_at_once_on_a_kept_alive_connection(workers):
    """The front ends serve the supervisor's socket as the TCP socket it is. Given to uvicorn as `fd=`, it was taken
    for a Unix socket, TCP_NODELAY stayed off, and each answer (written in two parts) waited for the client's
    delayed ACK: 44 ms per request on any machine, which capped 64 clients at 1,450 requests/s on an H100 host."""
    _, url = workers
    with httpx.Client(base_url=url) as client:  # one kept-alive connection
        client.get("/live")
        times = []
        for _ in range(20):
            started = time.perf_counter()
            assert client.get("/live").status_code == 200
            times.append(time.perf_counter() - started)
    assert np.median(times) < 0.02, [round(t * 1000, 1) for t in times]


def test_the_admission_limit_is_one_over_all_front_ends(tmp_path):
    path = tmp_path / "in-flight"
    create_slots(path, 3)
    first, second = SharedRequestCount(path, 0), SharedRequestCount(path, 2)
    first.add(1)
    second.add(2)
    assert first.total() == second.total() == 3
    second.add(-1)
    assert first.total() == 2
    restarted = SharedRequestCount(path, 2)  # a front end killed with requests in flight leaks none
    assert restarted.total() == 1
    with pytest.raises(ValueError, match="slot 3"):
        SharedRequestCount(path, 3)


def test_a_killed_front_end_fails_only_its_own_requests_and_comes_back(workers):
    process, url = workers
    victim = children(process.pid)["service.frontend.worker"][0]

    async def kill_midway(done: int):
        if done == 30:
            os.kill(victim, signal.SIGKILL)

    outcomes = asyncio.run(hammer(url, 200, kill_midway))
    failed = [o for o in outcomes if o != 200]
    assert set(failed) <= {"RemoteProtocolError", "ReadError", "ConnectError"}, failed  # connections of the victim
    assert len(failed) <= 16, failed  # at most the requests in flight when it died
    deadline = time.monotonic() + 60
    while len(children(process.pid).get("service.frontend.worker", [])) < WORKERS or victim in \
            children(process.pid)["service.frontend.worker"]:
        assert time.monotonic() < deadline, "the front end was not restarted"
        time.sleep(0.2)
    # The new one takes no connections until it has loaded its tokenizer and met the engine: none of these
    # requests, sent while it starts, hears "still loading".
    assert asyncio.run(hammer(url, 600)) == [200] * 600
    assert process.poll() is None
    assert "starting it again" in process.log_path.read_text()


def test_a_killed_engine_fails_requests_at_once_and_liveness(workers):
    process, url = workers
    engine = children(process.pid)["service.engine.server"][0]
    seen = {}

    async def kill_midway(done: int):
        if done == 20:
            os.kill(engine, signal.SIGKILL)
            seen["killed_at"] = time.monotonic()

    in_time = []
    outcomes = asyncio.run(hammer(url, 120, kill_midway, inputs=32, completed=in_time))
    took = time.monotonic() - seen["killed_at"]
    assert took < 10, took  # nobody waited out the 30 s queue deadline on a dead engine
    assert in_time[:20] == [200] * 20, in_time  # answered before the kill
    assert set(in_time[20:]) <= {200, 503, "ConnectError", "RemoteProtocolError", "ReadError"}, in_time
    assert process.wait(timeout=60) == 1  # the orchestrator starts the server afresh
    log = process.log_path.read_text()
    assert "the engine process ended" in log and "Traceback" not in log


def test_liveness_fails_while_the_engine_is_gone(tiny_checkpoint):
    """Between the engine's death and the supervisor stopping the front ends (drain_seconds), /live is 503."""
    process, url = start_service(tiny_checkpoint, "--workers", "1", "--drain-seconds", "5")
    try:
        os.kill(children(process.pid)["service.engine.server"][0], signal.SIGKILL)
        deadline = time.monotonic() + 3
        while True:
            live = httpx.get(url + "/live")
            if live.status_code == 503 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert live.status_code == 503 and "engine process stopped" in live.json()["error"]
        refused = httpx.post(url + "/embed", json={"inputs": "a river"})
        assert refused.status_code == 503
    finally:
        process.kill()
        process.wait()


def test_sigterm_drains_every_process_with_nothing_lost(workers):
    process, url = workers

    async def term_midway(done: int):
        if done == 40:
            process.send_signal(signal.SIGTERM)

    outcomes = asyncio.run(hammer(url, 300, term_midway))
    assert process.wait(timeout=90) == 0
    log = process.log_path.read_text()
    assert "Traceback" not in log
    # Every request a front end accepted was answered in full (each logs its own count) ...
    counts = [tuple(map(int, m)) for m in re.findall(r"answered (\d+) of (\d+) accepted", log)]
    assert len(counts) == WORKERS and all(answered == accepted for answered, accepted in counts), counts
    # ... and the others were refused: by a draining front end (503), a closed socket, or reset in the listen
    # backlog after the last front end stopped accepting (the app never saw those: the counts above).
    assert outcomes.count(200) >= 40
    assert set(outcomes) <= {200, 503, "ConnectError", "ReadError", "RemoteProtocolError"}, outcomes
    statuses = sum(1 for o in outcomes if isinstance(o, int))
    assert sum(accepted for _, accepted in counts) >= statuses  # every status came from a counted request
    assert not children(process.pid)


def test_a_model_that_cannot_load_stops_the_server_with_its_reason(tmp_path, tiny_checkpoint):
    result = subprocess.run([sys.executable, "-m", "service", "--checkpoint", str(tiny_checkpoint), "--workers", "2",
                             "--max-batch-tokens", "64", "--port", str(free_port())], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "--max-batch-tokens (64) is below the model's maximum input length" in result.stderr
    assert "Traceback" not in result.stderr


def test_workers_setting(monkeypatch):
    from service import supervisor

    assert supervisor.auto_workers("cpu") == 0  # a CPU host: one process
    monkeypatch.setattr(supervisor, "usable_cores", lambda: 16)
    monkeypatch.setattr("model.device.pick_device", lambda name: __import__("torch").device("cuda:0"))
    assert supervisor.auto_workers("cuda") == 7  # one per two cores beyond the engine's
    monkeypatch.setattr(supervisor, "usable_cores", lambda: 4)
    assert supervisor.auto_workers("cuda") == 2
    assert Settings(workers="3").workers == 3
    assert Settings().workers == "auto"
    with pytest.raises(ValueError, match="workers must be auto"):
        Settings(workers=65)
