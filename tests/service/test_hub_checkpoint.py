"""The service given a Hub id (through the local stand-in, tests/hub_stand_in.py): the same vectors as the same model's
directory, /info naming the id and commit, /health showing the download, and a bad id refused before the port."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys

import httpx
import pytest

from devkit.paths import REPO_ROOT
from service.app import create_app
from service.settings import Settings
from tests.hub_stand_in import CROSS_ENCODER_ID, MINILM_ID, hub, minilm_dir, stand_in  # noqa: F401 - fixtures
from tests.service.conftest import serving

pytestmark = pytest.mark.anyio
TEXTS = ["A man is eating food.", "The quick brown fox jumps over the lazy dog.", "Hub ids resolve to a snapshot."]


async def test_vectors_served_from_a_hub_id_equal_those_of_its_directory(hub):
    answers = {}
    for source in (MINILM_ID, minilm_dir()):
        async with serving(source, warmup=False) as client:
            embed = await client.post("/embed", json={"inputs": TEXTS})
            openai = await client.post("/v1/embeddings", json={"input": TEXTS, "model": "m"})
            info = (await client.get("/info")).json()
            assert embed.status_code == openai.status_code == 200
            answers[str(source)] = (embed.json(), [row["embedding"] for row in openai.json()["data"]], info)
    from_hub, from_directory = answers[MINILM_ID], answers[str(minilm_dir())]
    assert from_hub[0] == from_directory[0] and from_hub[1] == from_directory[1]  # the same numbers, exactly
    info = from_hub[2]
    assert info["model_id"] == info["model"] == MINILM_ID
    assert info["model_sha"] == hub.repos[MINILM_ID].revisions["main"]
    assert from_directory[2]["model_sha"] is None and from_directory[2]["model_id"] == minilm_dir().name


async def test_health_shows_the_download_while_loading(hub):
    hub.delay_s = 0.05  # the weights take about a second to arrive
    app = create_app(Settings(checkpoint=CROSS_ENCODER_ID, warmup=False))
    seen = set()
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            while not app.state.loading.done():
                health = await client.get("/health")
                if health.status_code == 503:
                    seen.add(health.json()["error"])
                await asyncio.sleep(0.02)
            assert app.state.runtime.lifecycle.failure is None
            assert (await client.get("/health")).status_code == 200
            info = (await client.get("/info")).json()
    assert info["model_id"] == CROSS_ENCODER_ID and info["model_sha"] == hub.repos[CROSS_ENCODER_ID].revisions["main"]
    shown = [message for message in seen if "downloading" in message]
    assert shown, seen
    assert any(f"the model is still loading (downloading {CROSS_ENCODER_ID}: " in m and " files, " in m and " MB" in m
               for m in shown), shown


def test_a_bad_hub_id_exits_2_before_the_port_is_bound(hub):
    with socket.socket() as held:  # had the server tried to bind this port it would fail another way
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        for spec, expected in (("test-org/no-such-model", "no such model on the Hugging Face Hub"),
                               (f"{CROSS_ENCODER_ID}@nope", "no revision 'nope'"),
                               ("/no/such/dir", "not a directory, and not a Hugging Face Hub id")):
            done = subprocess.run([sys.executable, "-m", "service", "--checkpoint", spec, "--port", str(port)],
                                  cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 2, done.stderr[-2000:]
            errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
            assert len(errors) == 1 and spec in errors[0] and expected in errors[0], done.stderr[-2000:]
            assert "Traceback" not in done.stderr and "Uvicorn running" not in done.stderr
