"""Hostile-client drills of the gRPC API (tei.v1 on --grpc-port) against a real `--workers 2` server on loopback,
the gRPC side of RELIABILITY.md's stalled-body drills (tests/service/frontend/tei_grpc/test_hostile.py runs the same
with small counts and short settings):

- stalled streams: `--stalled` calls stop mid-message (headers, then 10 bytes of a 200-byte message, then nothing;
  half of them EmbedStream, half the unary Embed) while `--calls` complete Embed calls arrive, 16 at a time. What
  is measured: every complete call's status and latency, and when the server ended each stalled call (a stream
  after keep_alive_s, a unary call after body_timeout_s). A stalled call holds one of the library's concurrent
  calls (max_connections a front end) and no admission slot.
- oversized messages: a unary call and a stream's third message over max_body_bytes: RESOURCE_EXHAUSTED (the
  library refuses it before it is read), the stream's first two answered.
- many tiny messages: one EmbedStream of `--tiny` one-word messages sent as fast as the client can, while a probe
  client sends an Embed call every 0.2 s. What it exercises: the per-message path (parse, tokenize, queue, answer),
  the stream's window (grpc_stream_window messages in flight; the rest wait in HTTP/2 flow control), answers in
  order, and the server's memory: it says the RSS of the front end that served the stream before and after, the
  messages a second, and the probe calls' latency. A million messages take about ten minutes on 2 busy cores.
- bad bytes: every method of tei.v1 gets `--garbage` random byte strings and bit-flipped valid messages, as
  unary calls and on streams: no answer is INTERNAL or UNKNOWN, and the server answers the same afterwards. The
  server's own count decides (its metrics: every status it sent, every failure by kind): when the server ends a
  stream while the Python client library is still writing that stream's next message, the library reports
  INTERNAL ("Failed execute_batch ... SendMessageOperation") to its caller whatever status the server sent; the
  drill counts those apart, as "client write race".

    python -m devkit.grpc_drills                        # a few minutes with --tiny 100000
    python -m devkit.grpc_drills --tiny 1000000         # the million
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import threading
import time
from collections import Counter
from pathlib import Path

import grpc

from devkit.grpc_raw import RawCall
from devkit.server import free_port, start_service
from service.frontend.tei_grpc import tei_pb2 as pb
from service.frontend.tei_grpc.methods import RPCS
from service.settings import DEFAULT_CHECKPOINT

CLIENT_FAULTS = {"OK", "INVALID_ARGUMENT", "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED", "UNAUTHENTICATED"}


def embed(text: str) -> bytes:
    return pb.EmbedRequest(inputs=text).SerializeToString()


async def complete_calls(target: str, count: int) -> tuple[Counter, list[float]]:
    limit, codes, latencies = asyncio.Semaphore(16), Counter(), []
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.unary_unary("/tei.v1.Embed/Embed")

        async def one(i: int) -> None:
            async with limit:
                started = time.perf_counter()
                try:
                    await call(embed(f"a complete call about rivers {i}"), timeout=120)
                    codes["OK"] += 1
                except grpc.aio.AioRpcError as error:
                    codes[error.code().name] += 1
                latencies.append(time.perf_counter() - started)

        await asyncio.gather(*(one(i) for i in range(count)))
    return codes, latencies


def stalled_calls(target: str, stalled: int, calls: int, wait_s: float) -> dict:
    host, port = target.split(":")
    opened = []
    for i in range(stalled):
        path = "/tei.v1.Embed/EmbedStream" if i % 2 == 0 else "/tei.v1.Embed/Embed"
        raw = RawCall(host, int(port), path)
        raw.send_partial_message(declared=200, sent=10)
        opened.append((path, raw))
    stalled_at = time.monotonic()
    ended: dict[str, list[float]] = {"stream": [], "unary": []}
    never = []

    def watch(path: str, raw: RawCall) -> None:  # reads the connection throughout, as a client's HTTP/2 layer does
        if raw.wait_for_end(wait_s) is None:
            never.append(path)
        else:
            ended["stream" if path.endswith("Stream") else "unary"].append(time.monotonic() - stalled_at)
        raw.close()

    watchers = [threading.Thread(target=watch, args=pair, daemon=True) for pair in opened]
    for watcher in watchers:
        watcher.start()
    codes, latencies = asyncio.run(complete_calls(target, calls))
    answered_after = time.monotonic() - stalled_at
    for watcher in watchers:
        watcher.join(wait_s + 5)
    latencies.sort()
    return {"stalled": stalled, "complete_calls": dict(codes), "complete_p50_ms": 1000 * latencies[len(latencies) // 2],
            "complete_max_ms": 1000 * latencies[-1], "all_complete_answered_after_s": answered_after,
            "stalled_streams_ended_s": _span(ended["stream"]), "stalled_unary_ended_s": _span(ended["unary"]),
            "stalled_never_ended": len(never)}


def _span(values: list[float]) -> list[float] | None:
    return [round(min(values), 2), round(max(values), 2)] if values else None


def oversized(target: str, max_body_bytes: int) -> dict:
    big = embed("x" * (max_body_bytes + 10))
    with grpc.insecure_channel(target) as channel:
        try:
            channel.unary_unary("/tei.v1.Embed/Embed")(big, timeout=30)
            unary = "OK"
        except grpc.RpcError as error:
            unary = error.code().name
        answers, code = 0, "OK"
        try:
            for _ in channel.stream_stream("/tei.v1.Embed/EmbedStream")(iter([embed("one"), embed("two"), big]),
                                                                          timeout=30):
                answers += 1
        except grpc.RpcError as error:
            code = error.code().name
    return {"unary": unary, "stream": code, "stream_answers_before": answers}


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def tiny_messages(target: str, count: int, front_ends: list[int]) -> dict:
    probe_latencies: list[float] = []
    done = asyncio.Event()
    before = {pid: rss_kib(pid) for pid in front_ends}

    async def probe(channel) -> None:
        call = channel.unary_unary("/tei.v1.Embed/Embed")
        while not done.is_set():
            started = time.perf_counter()
            await call(embed("a probe while the stream runs"), timeout=60)
            probe_latencies.append(time.perf_counter() - started)
            await asyncio.sleep(0.2)

    async with grpc.aio.insecure_channel(target) as channel, grpc.aio.insecure_channel(target) as other:
        prober = asyncio.ensure_future(probe(other))
        message = embed("a")
        stream = channel.stream_stream("/tei.v1.Embed/EmbedStream")(iter([message] * count))
        started = time.perf_counter()
        answers, size = 0, None
        async for answer in stream:
            answers += 1
            size = size or len(answer)
        seconds = time.perf_counter() - started
        done.set()
        await prober
    after = {pid: rss_kib(pid) for pid in front_ends}
    grown = max(after[pid] - before[pid] for pid in front_ends)
    probe_latencies.sort()
    return {"messages": count, "answers": answers, "messages_per_s": round(answers / seconds),
            "seconds": round(seconds, 1), "front_end_rss_growth_mib": round(grown / 1024, 1),
            "probe_calls": len(probe_latencies),
            "probe_p50_ms": round(1000 * probe_latencies[len(probe_latencies) // 2], 1),
            "probe_max_ms": round(1000 * probe_latencies[-1], 1)}


def mutations(valid: bytes, rng: random.Random, count: int) -> list[bytes]:
    out = []
    for _ in range(count):
        if rng.random() < 0.5 or not valid:
            out.append(bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 64))))
        else:
            flipped = bytearray(valid)
            for _ in range(rng.randrange(1, 4)):
                flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
            out.append(bytes(flipped))
    return out


VALID = {
    "EmbedRequest": pb.EmbedRequest(inputs="a river", dimensions=8, prompt_name="q"),
    "EmbedSparseRequest": pb.EmbedSparseRequest(inputs="a river", truncate=True),
    "EmbedAllRequest": pb.EmbedAllRequest(inputs="a river", truncation_direction=1),
    "PredictRequest": pb.PredictRequest(inputs="a river", raw_scores=True),
    "PredictPairRequest": pb.PredictPairRequest(inputs=["a river", "flows"]),
    "RerankRequest": pb.RerankRequest(query="a", texts=["b", "c"], return_text=True),
    "RerankStreamRequest": pb.RerankStreamRequest(query="a", text="b"),
    "EncodeRequest": pb.EncodeRequest(inputs="a river", add_special_tokens=True),
    "DecodeRequest": pb.DecodeRequest(ids=[101, 102, 7]),
    "InfoRequest": pb.InfoRequest(),
}


async def garbage(target: str, per_method: int, seed: int = 0) -> dict:
    """Random and bit-flipped messages to every method: the codes seen, and any that a client should never cause."""
    rng = random.Random(seed)
    codes: Counter = Counter()
    async with grpc.aio.insecure_channel(target) as channel:
        for rpc in RPCS:
            bodies = mutations(VALID[rpc.request.__name__].SerializeToString(), rng, per_method)
            if rpc.kind == "unary":
                call = channel.unary_unary(rpc.path)
                for body in bodies:
                    try:
                        await call(body, timeout=60)
                        codes[(rpc.path, "OK")] += 1
                    except grpc.aio.AioRpcError as error:
                        codes[(rpc.path, error.code().name)] += 1
            else:
                call = channel.stream_stream(rpc.path) if rpc.kind == "stream" else channel.stream_unary(rpc.path)
                for start in range(0, len(bodies), 8):
                    try:
                        result = call(iter(bodies[start:start + 8]), timeout=60)
                        if rpc.kind == "stream":
                            async for _ in result:
                                pass
                        else:
                            await result
                        codes[(rpc.path, "OK")] += 1
                    except grpc.aio.AioRpcError as error:
                        race = error.code() == grpc.StatusCode.INTERNAL and "SendMessageOperation" in \
                            (error.debug_error_string() or "")
                        codes[(rpc.path, "client write race" if race else error.code().name)] += 1
    wrong = {f"{path} {code}": n for (path, code), n in codes.items()
             if code not in CLIENT_FAULTS and code != "client write race"}
    return {"calls": sum(codes.values()), "codes": dict(Counter(code for _, code in codes.elements())),
            "not_a_client_fault": wrong}


def server_faults(url: str) -> dict[str, float]:
    """From the server's metrics: what it answered gRPC calls with that is not a client's fault (statuses INTERNAL or
    UNKNOWN, failures of kind internal), by metric line."""
    import httpx

    found = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if "/tei.v1." not in line or line.startswith("#"):
            continue
        if ('status="INTERNAL"' in line or 'status="UNKNOWN"' in line or 'error_type="internal"' in line) \
                and float(line.rsplit(" ", 1)[1]) > 0:
            found[line.rsplit(" ", 1)[0]] = float(line.rsplit(" ", 1)[1])
    return found


def front_end_pids(root: int) -> list[int]:
    from bench.serving.process_cpu import front_ends, process_tree

    return sorted(front_ends(process_tree(root))) or [root]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stalled", type=int, default=512)
    parser.add_argument("--calls", type=int, default=256)
    parser.add_argument("--tiny", type=int, default=100_000)
    parser.add_argument("--garbage", type=int, default=40, help="bad messages per method")
    parser.add_argument("--workers", default="2")
    parser.add_argument("--flags", default="", help="more server flags, as one string")
    args = parser.parse_args(argv)
    grpc_port = free_port()
    process, url = start_service(DEFAULT_CHECKPOINT, "--workers", args.workers, "--grpc-port", str(grpc_port),
                                 *args.flags.split())
    target = f"127.0.0.1:{grpc_port}"
    try:
        import httpx

        limits = httpx.get(url + "/info").json()["limits"]
        wait_s = max(limits["keep_alive_s"], limits["body_timeout_s"]) + 10
        results = {"stalled calls": stalled_calls(target, args.stalled, args.calls, wait_s),
                   "oversized messages": oversized(target, limits["max_body_bytes"]),
                   "tiny messages": asyncio.run(tiny_messages(target, args.tiny, front_end_pids(process.pid))),
                   "bad bytes": asyncio.run(garbage(target, args.garbage))}
        results["bad bytes"]["server_faults"] = server_faults(url)
        with grpc.insecure_channel(target) as channel:
            after = channel.unary_unary("/tei.v1.Embed/Embed")(embed("still serving"), timeout=30)
        results["after"] = {"embed_bytes": len(after), "health": httpx.get(url + "/health").status_code}
    finally:
        process.terminate()
        process.wait(60)
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
