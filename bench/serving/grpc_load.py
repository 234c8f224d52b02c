"""The gRPC load generator: `streams` EmbedStream calls (tei.v1), one sentence a message, each keeping `depth`
messages unanswered (1: a closed loop, like an HTTP client that waits for each answer), in this process or spread
over several, as `bench.serving.load` does for HTTP (each child starts when all are ready; results merged).

Each stream has its own channel and connection (no subchannel shared), so that with several front ends the kernel
spreads the streams over them as it spreads HTTP clients' connections. Messages are serialized once, answers
counted and not parsed (the first of each stream is, to check its width): the client must cost little next to the
server it measures. This module imports no torch.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from bench.serving.load import READY_TIMEOUT_S, start_together, wait_for_start, result_path, run_loop

PATH = "/tei.v1.Embed/EmbedStream"


def _message(text: str) -> bytes:
    from service.frontend.tei_grpc import tei_pb2

    return tei_pb2.EmbedRequest(inputs=text).SerializeToString()


async def drive(target: str, texts: list[str], streams: int, depth: int, duration: float, first: int = 0,
                stride: int | None = None) -> tuple[list[float], int, float, int]:
    """(latencies, sentences answered, seconds, the answers' vector width)."""
    from service.frontend.tei_grpc import tei_pb2

    messages = [_message(t) for t in texts]
    stride = stride or streams
    latencies: list[float] = []
    answered = 0
    width = 0
    stop_at = time.perf_counter() + duration

    async def one(offset: int) -> None:
        nonlocal answered, width
        options = [("grpc.use_local_subchannel_pool", 1)]
        async with grpc.aio.insecure_channel(target, options=options) as channel:
            call = channel.stream_stream(PATH)()
            sent: list[float] = []  # send times of the messages not yet answered, oldest first
            i = offset
            while time.perf_counter() < stop_at:
                while len(sent) < depth:
                    await call.write(messages[i % len(messages)])
                    sent.append(time.perf_counter())
                    i += stride
                answer = await call.read()
                if answer is grpc.aio.EOF:
                    raise RuntimeError(f"{target}{PATH}: the stream ended early ({await call.code()})")
                latencies.append(time.perf_counter() - sent.pop(0))
                answered += 1
                if not width:
                    width = len(tei_pb2.EmbedResponse.FromString(answer).embeddings)
            await call.done_writing()
            while await call.read() is not grpc.aio.EOF:  # the answers still owed
                answered += 1
            code = await call.code()
            if code != grpc.StatusCode.OK:
                raise RuntimeError(f"{target}{PATH}: {code} {await call.details()}")

    started = time.perf_counter()
    await asyncio.gather(*(one(first + k) for k in range(streams)))
    return latencies, answered, time.perf_counter() - started, width


def drive_processes(target: str, texts: list[str], streams: int, depth: int, duration: float,
                    processes: int = 2, cpu_s: list[float] | None = None) -> tuple[list[float], int, float, int]:
    """As `drive`, with the streams split over `processes` child processes; seconds is the longest child's. `cpu_s`,
    when given, gets the children's own CPU seconds over the load (their start-up not counted) appended."""
    processes = max(1, min(processes, streams))
    with tempfile.TemporaryDirectory(prefix="bench-grpc-load-") as scratch:
        job = Path(scratch) / "job.json"
        job.write_text(json.dumps({"target": target, "texts": texts, "streams": streams, "depth": depth,
                                   "duration": duration}))
        children = [subprocess.Popen([sys.executable, "-m", "bench.serving.grpc_load", str(job), str(k),
                                      str(processes)]) for k in range(processes)]
        start_together(job, children)
        for child in children:
            child.wait(timeout=duration + READY_TIMEOUT_S + 60)
        if any(child.returncode for child in children):
            raise RuntimeError(f"a gRPC load process failed (exit codes {[c.returncode for c in children]})")
        parts = [json.loads(result_path(job, k).read_text()) for k in range(processes)]
    if cpu_s is not None:
        cpu_s.append(sum(p["cpu_s"] for p in parts))
    return ([x for p in parts for x in p["latencies"]], sum(p["answered"] for p in parts),
            max(p["seconds"] for p in parts), max(p["width"] for p in parts))


def _child(job_path: str, index: int, processes: int) -> None:
    job = json.loads(Path(job_path).read_text())
    mine = len(range(index, job["streams"], processes))
    wait_for_start(Path(job_path), index)
    started = time.process_time()  # every thread of this process (grpc's own too), from the start of the load
    latencies, answered, seconds, width = run_loop(drive(job["target"], job["texts"], mine, job["depth"],
                                                         job["duration"], first=index, stride=job["streams"]))
    result_path(Path(job_path), index).write_text(json.dumps({"latencies": latencies, "answered": answered,
                                                             "seconds": seconds, "width": width,
                                                             "cpu_s": time.process_time() - started}))


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
