"""Where the server's CPU per request goes, each part measured alone on one thread of this process: the
HTTP front end (over an engine that answers at once), the tokenizer inside it, and the engine (batch
selection, collation, the forward pass of the nearly free model on pre-tokenized WikiText batches, and the
replies). On a GPU the forward is one CUDA graph replay, so the engine's other parts, per input, are what its
process can feed the device at most; batches of 256 are a GPU's (`--hidden 384` answers as wide as the bundled
model's).

`bench.serving.server_cpu` measures the sum under load, where 64 clients, the server's threads and the
load generator share the cores; that figure moves ±15% from run to run on a shared 2-core host. Alone,
each part repeats within a few percent, so this is the benchmark that can show a change of 10 µs; the sum
of its parts is what the server would cost with no contention at all.

    python -m bench.serving.request_cost [--hidden 384]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.serving.rows import parts_table
from bench.serving.server_cpu import nearly_free_checkpoint
from bench.serving.throughput import sentences
from model import load_checkpoint
from service.engine.batch_choice import choose_batch, pricing
from service.engine.batcher import BatchPolicy, Entry, Ticket
from service.engine.loader import build_engine
from service.engine.precision import choose
from service.frontend.app import create_http_app
from service.frontend.fast_routes import DirectEntry
from service.frontend.runtime import Runtime
from service.messages import Done, ModelFacts, encode
from service.metrics import Metrics
from service.settings import Settings
from service.tasks import EncodeItem, PooledVector


class AnswerAtOnce:
    """An `EngineLink` whose engine costs nothing: every input's pooled vector is ready at once (the same one, of
    ordinary floats: zeros would print shorter than a real embedding's). What is left is the front end's own work."""

    detail = ""

    def __init__(self, width: int):
        self.vector = np.random.default_rng(0).standard_normal(width).astype(np.float32) / np.sqrt(width)

    async def start(self, directories: dict[str, Path]) -> list[ModelFacts]:
        return [ModelFacts("cpu", "float32", True, True, 0, 1024, 64, name=name) for name in directories]

    async def loading(self) -> None:
        return

    def submit(self, items, deadline, model=""):
        result = asyncio.get_running_loop().create_future()
        result.set_result([PooledVector(self.vector) for _ in items])
        return Answered(result)

    def failure(self):
        return None

    def computing(self) -> bool:
        return True

    async def stop(self) -> None:
        return


class Answered:
    def __init__(self, result: asyncio.Future):
        self.result = result

    def cancel(self) -> None:
        return


PATHS = {  # how a request reaches the route
    "direct": "as uvicorn serves it (DirectEntry, then the fast routes)",
    "fast routes": "through FastAPI's outer layers to the fast routes",
    "FastAPI": "through FastAPI alone (its routing, dependencies and body parsing)",
}


async def front_end_us(checkpoint: Path, texts: list[str], per_request: int, requests: int,
                       rounds: int = 5, width: int = 32) -> dict[str, float]:
    """CPU µs per /embed request of `per_request` sentences, answered with vectors `width` wide, along each of
    PATHS, the HTTP bytes already parsed.
    The paths take turns, `rounds` times `requests` each; each keeps its best round (another tenant's work
    only ever adds time)."""
    settings = Settings(checkpoint=str(checkpoint))
    bodies = [json.dumps({"inputs": texts[i * per_request % len(texts):][:per_request]}).encode()
              for i in range(requests)]
    apps = {}
    for path in PATHS:
        metrics = Metrics()
        app = create_http_app(Runtime(settings, AnswerAtOnce(width), metrics), fast_routes=path != "FastAPI")
        apps[path] = (app, DirectEntry(app) if path == "direct" else app)
    best = dict.fromkeys(PATHS, float("inf"))
    async with contextlib.AsyncExitStack() as stack:
        for app, _ in apps.values():
            await stack.enter_async_context(app.router.lifespan_context(app))
            await app.state.loading
        for path, (_, served) in apps.items():
            for body in bodies[:50]:  # warm-up
                assert await _post(served, body) == 200, path
        for _ in range(rounds):
            for path, (_, served) in apps.items():
                started = time.process_time()
                for body in bodies:
                    await _post(served, body)
                best[path] = min(best[path], 1e6 * (time.process_time() - started) / requests)
    return best


class _Cycle:
    """One request as uvicorn's request object holds it: the body, then nothing until the client leaves (it
    stays), `disconnected` for the front end's watch (service.frontend.disconnects) and `more_body` False (the
    whole body is in, as it is for nearly every request by the time the app runs)."""

    def __init__(self, body: bytes):
        self.body = body
        self.disconnected = False
        self.more_body = False
        self.never = asyncio.Event()

    async def receive(self):
        if self.body is not None:
            body, self.body = self.body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self.never.wait()


async def _post(served, body: bytes) -> int:
    """One POST /embed through the ASGI app `served`; its status."""
    statuses = []

    async def send(message):
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/embed", "raw_path": b"/embed", "root_path": "", "query_string": b"",
             "headers": [(b"host", b"t"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80), "state": {}}
    await served(scope, _Cycle(body).receive, send)
    return statuses[0]


def tokenizer_us(checkpoint, texts: list[str], per_request: int, rounds: int = 3) -> float:
    """CPU µs to tokenize one request's sentences (best of `rounds` passes over the texts)."""
    groups = [texts[i:i + per_request] for i in range(0, len(texts), per_request)]
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for group in groups:
            checkpoint.tokenizer.encode_batch(group)
        best = min(best, 1e6 * (time.process_time() - started) / len(groups))
    return best


def engine_us_per_input(checkpoint, texts: list[str], batch: int, per_request: int = 8, priced: bool = True
                        ) -> tuple[float, float, float]:
    """(selection + collation, forward + results, replies) CPU µs per input, batches of `batch` similar-length
    inputs chosen from a queue of 512 as the preparer chooses them; replies: the results sent back as the engine
    process sends them (one Done message per request of `per_request` inputs, msgpack-encoded). On a GPU the
    forward is one graph replay and the rest is the engine process's host work per input."""
    cpu = torch.device("cpu")
    engine = build_engine(checkpoint, cpu, choose("float32", cpu))  # as the service builds it
    items = [EncodeItem(list(e.ids), list(e.type_ids), "mean", True)
             for e in checkpoint.tokenizer.encode_batch(texts)]
    policy = BatchPolicy(max_batch_tokens=1 << 20, max_batch_size=batch, max_padding_fraction=0.10)
    ticket = Ticket(float("inf"), 1, None)
    rng = random.Random(0)
    queue = [Entry(rng.choice(items), ticket, 0) for _ in range(512)]
    # As the batcher prices batches here; unpriced as where attention never pads (varlen: a GPU in bfloat16)
    flops = pricing(engine) if priced else None
    chosen = [choose_batch(queue, policy, flops) for _ in range(3)]
    for entries in chosen:
        engine.run(engine.collate([e.item for e in entries]))  # warm-up
    count, selecting, computing, replying = 0, 0.0, 0.0, 0.0
    for _ in range(20):
        started = time.process_time()
        entries = choose_batch(queue, policy, flops)
        prepared = engine.collate([e.item for e in entries])
        selected = time.process_time()
        results = engine.run(prepared)
        computed = time.process_time()
        for request, first in enumerate(range(0, len(results), per_request)):
            encode(Done(request, results[first : first + per_request]))
        selecting += selected - started
        computing += computed - selected
        replying += time.process_time() - computed
        count += len(entries)
    return 1e6 * selecting / count, 1e6 * computing / count, 1e6 * replying / count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=600, help="requests per path and round (5 rounds)")
    parser.add_argument("--hidden", type=int, default=32,
                        help="the nearly free encoder's width, what a pooled answer carries (384: the bundled model's)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # as the server runs it (service.frontend.runtime)
    work = Path(tempfile.mkdtemp(prefix="request-cost-"))
    try:
        directory = nearly_free_checkpoint(work / "nearly-free", args.hidden)
        checkpoint = load_checkpoint(directory)
        texts = sentences(2000, None, None)
        rows = {}
        for per_request in (1, 8):
            costs = asyncio.run(front_end_us(directory, texts, per_request, args.requests, width=args.hidden))
            for path, how in PATHS.items():
                rows[f"front end, {per_request} sentence(s) a request, {how}"] = costs[path]
            rows[f"  the tokenizer's part of it, {per_request} sentence(s)"] = tokenizer_us(checkpoint, texts,
                                                                                            per_request)
        for batch in (8, 32, 64, 256):
            selecting, computing, replying = engine_us_per_input(checkpoint, texts, batch)
            rows[f"engine per input, batches of {batch}: selection + collation"] = selecting
            rows[f"engine per input, batches of {batch}: forward + results"] = computing
            rows[f"engine per input, batches of {batch}: replies (8 inputs a message)"] = replying
        rows["engine per input, batches of 256 unpriced (as on a GPU in bfloat16): selection + collation"] = \
            engine_us_per_input(checkpoint, texts, 256, priced=False)[0]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} cores, one thread, CPU time "
          f"(time.process_time); the nearly free model (bench.serving.server_cpu), {args.hidden} wide\n")
    parts_table(rows, "CPU µs", 1, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
