"""Reranking one query against 64 passages, one client, each system timed from the request to the scores in hand:

- the service's /v1/rerank on the PyLate-built ColBERT (MaxSim on the server) in float32, in the default precision
  (`--dtype auto`: bfloat16 where the CPU has it natively and the answers stay at float32's fidelity) and in int8,
  and on the cross-encoder in float32 and int8;
- PyLate in process, its default CPU path: the query and the passages encoded, then rank.rerank;
- Infinity's ColBERT path: it serves a colbert-ai checkpoint (architecture HF_ColBERT) as token states, without the
  markers, the [MASK] expansion or the projection; the query and the passages go in one /embeddings call, and the
  client projects and normalises them and computes MaxSim (the same encoder work, not the same vectors: a PyLate
  checkpoint it does not load at all, `infinity_refusal` says why);
- Infinity's cross-encoder /rerank on the cross-encoder.
Every server is up for the whole run, and each round times every system in turn, so that a busy neighbour on a
shared machine weighs on all alike.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
from safetensors.torch import load_file

from devkit import colbert_reference
from devkit.server import free_port, start, start_service


@dataclass
class Timing:
    system: str
    seconds: list[float] = field(default_factory=list)

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.seconds, q)) * 1000


def _timed(call, repeats: int) -> list[float]:
    call()  # a warm-up per round: connections and caches
    found = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        found.append(time.perf_counter() - started)
    return found


def _maxsim(query: np.ndarray, documents: list[np.ndarray]) -> np.ndarray:
    return np.array([float((query @ d.T).max(axis=1).sum()) for d in documents])


def service_rerank(client: httpx.Client, query: str, documents: list[str]):
    def call():
        answer = client.post("/v1/rerank", json={"model": "m", "query": query, "documents": documents})
        assert answer.status_code == 200, answer.text
    return call


def infinity_colbert(client: httpx.Client, model: str, projection: np.ndarray, query: str, documents: list[str]):
    def call():
        answer = client.post("/embeddings", json={"model": model, "input": [query, *documents]})
        assert answer.status_code == 200, answer.text
        states = [np.asarray(row["embedding"], dtype=np.float32) for row in answer.json()["data"]]
        vectors = [s @ projection.T for s in states]
        vectors = [v / np.linalg.norm(v, axis=1, keepdims=True) for v in vectors]
        _maxsim(vectors[0], vectors[1:])
    return call


def infinity_rerank(client: httpx.Client, model: str, query: str, documents: list[str]):
    def call():
        answer = client.post("/rerank", json={"model": model, "query": query, "documents": documents})
        assert answer.status_code == 200, answer.text
    return call


def infinity_command(infinity: str, checkpoint: Path, port: int) -> list[str]:
    return [infinity, "v2", "--model-id", str(checkpoint), "--host", "127.0.0.1", "--port", str(port), "--engine",
            "torch", "--device", "cpu", "--dtype", "float32"]


def infinity_refusal(infinity: str, checkpoint: Path) -> str:
    """What Infinity says when asked to serve a PyLate checkpoint (its last error line), or that it served it."""
    port = free_port()
    try:
        done = subprocess.run(infinity_command(infinity, checkpoint, port), capture_output=True, text=True,
                              timeout=240)
    except subprocess.TimeoutExpired:
        return "it started (no refusal within 240 s)"
    errors = [line for line in (done.stdout + done.stderr).splitlines() if "Error" in line]
    return errors[-1].strip() if errors else f"it exited with status {done.returncode}"


def measure(models, query: str, documents: list[str], infinity: str | None, rounds: int, repeats: int
            ) -> tuple[list[Timing], str | None]:
    processes, clients = [], []

    def serve(process, url) -> httpx.Client:
        processes.append(process)
        clients.append(httpx.Client(base_url=url, timeout=600))
        return clients[-1]

    try:
        systems = {}
        for dtype in ("float32", "auto", "int8"):  # auto: the default, the fastest faithful precision of this host
            client = serve(*start_service(models.pylate, "--dtype", dtype, timeout_s=600))
            served = client.get("/info").json()["model_dtype"] if dtype == "auto" else dtype
            label = f"{dtype} ({served} here, the default)" if dtype == "auto" else dtype
            systems[f"service /v1/rerank, ColBERT {label} (MaxSim on the server)"] = service_rerank(
                client, query, documents)
        systems |= {f"service /v1/rerank, cross-encoder {dtype}": service_rerank(
            serve(*start_service(models.cross_encoder, "--dtype", dtype, timeout_s=600)), query, documents)
            for dtype in ("float32", "int8")}
        refusal = None
        if infinity:
            for name, checkpoint, make in (("Infinity ColBERT /embeddings + MaxSim in the client", models.colbert_ai,
                                            infinity_colbert), ("Infinity /rerank, cross-encoder",
                                                                models.cross_encoder, infinity_rerank)):
                port = free_port()
                url = f"http://127.0.0.1:{port}"
                client = serve(start(infinity_command(infinity, checkpoint, port), url, timeout_s=600), url)
                if make is infinity_colbert:
                    projection = load_file(str(checkpoint / "model.safetensors"))["linear.weight"].numpy()
                    systems[name] = make(client, str(checkpoint), projection, query, documents)
                else:
                    systems[name] = make(client, str(checkpoint), query, documents)
            refusal = infinity_refusal(infinity, models.pylate)
        pylate = Timing("PyLate in process (encode + rank.rerank, its default CPU path)")
        timings = {name: Timing(name) for name in systems}
        for _ in range(rounds):
            for name, call in systems.items():
                timings[name].seconds += _timed(call, repeats)
            answer = colbert_reference.run([{"command": "time_rerank", "checkpoint": str(models.pylate),
                                             "query": query, "documents": documents, "repeats": repeats}])
            pylate.seconds += answer["results"][0]["seconds"]
        return [*timings.values(), pylate], refusal
    finally:
        for client in clients:
            client.close()
        for process in processes:
            process.terminate()
            process.wait(timeout=60)
