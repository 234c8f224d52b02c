"""The real thing: `python -m service` under uvicorn on loopback, including shutdown under load."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys

import httpx
import pytest

from devkit.paths import REPO_ROOT
from devkit.server import free_port, start, start_service
from service.settings import DEFAULT_CHECKPOINT, Settings


@pytest.fixture
def server(tiny_checkpoint):
    process, url = start_service(tiny_checkpoint)
    yield process, url
    if process.poll() is None:
        process.kill()
        process.wait()


def test_every_route_over_real_http(server):
    _, url = server
    with httpx.Client(base_url=url, timeout=30) as client:
        assert client.post("/encode", json={"inputs": "a crane is flying"}).json()["dim"] == 64
        assert client.post("/fill-mask", json={"inputs": "the [MASK] ."}).status_code == 200
        assert client.post("/nsp", json={"inputs": ["a", "b"]}).status_code == 200
        assert client.get("/info").json()["ready"] is True
        assert "bert_requests_total" in client.get("/metrics").text
        bad = client.post("/nsp", json={"inputs": "a"})
        assert bad.status_code == 422 and bad.json()["error_type"] == "validation"


def test_sigterm_under_load_answers_every_accepted_request(server):
    process, url = server

    async def load():
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            done = 0

            async def one(i: int):
                nonlocal done
                try:
                    status = (await client.post("/encode", json={"inputs": [f"sentence {i} about rivers"] * 8})).status_code
                except httpx.TransportError:
                    # Refused, or a keep-alive connection closed by the server just as this request was
                    # written: the app never saw it (checked against the server's own count below).
                    return "not accepted"
                done += 1
                return status

            tasks = [asyncio.ensure_future(one(i)) for i in range(300)]
            while done < 20:
                await asyncio.sleep(0.01)
            process.send_signal(signal.SIGTERM)
            return await asyncio.gather(*tasks)

    outcomes = asyncio.run(load())
    process.wait(timeout=60)
    output = process.log_path.read_text()
    assert process.returncode == 0, output
    assert "Traceback" not in output
    answered = [o for o in outcomes if o != "not accepted"]
    # Every accepted request got an answer: 200, or 503 for those that arrived while draining.
    assert set(answered) <= {200, 503}, outcomes
    assert answered.count(200) >= 20
    accepted, replied = map(int, re.search(r"answered (\d+) of (\d+) accepted", output).groups()[::-1])
    assert replied == accepted, (replied, accepted)  # nothing the server accepted went unanswered
    assert accepted >= len(answered) + 1  # ours, plus the fixture's readiness probes


def test_bad_checkpoint_exits_with_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    result = subprocess.run([sys.executable, "-m", "service", "--checkpoint", str(tmp_path), "--port",
                             str(free_port())], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "no model.safetensors" in result.stderr and "Traceback" not in result.stderr


def test_every_setting_set_to_the_empty_string_means_unset(tmp_path):
    """Compose passes `${BERT_API_KEY:-}` as an empty string: every BERT_* variable empty must serve with the
    defaults (no key, the bundled model), not fail validation."""
    env = {**os.environ, **{f"BERT_{name.upper()}": "" for name in Settings.model_fields}}
    port = free_port()
    process = start([sys.executable, "-m", "service", "--port", str(port)], f"http://127.0.0.1:{port}", env=env)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            assert client.post("/fill-mask", json={"inputs": "the [MASK] ."}).status_code == 200  # no key asked
            assert client.get("/info").json()["model"] == DEFAULT_CHECKPOINT.name
    finally:
        process.kill()
        process.wait()
