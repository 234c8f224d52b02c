"""The engine's own pipeline against a device that costs the host nothing: how much of a GPU's rate the engine's
Python lets through, measured on any CPU.

On a GPU a small model's batch is one graph replay, and everything around it is the engine process's host work, on
one interpreter (service/engine/interpreter_lag.py): reading each request off the wire (a front end's Submit,
encoded before the clock starts, decoded as the engine's reader decodes it), the batcher taking its inputs, the
preparer choosing and collating batches, the runner launching them and building their results, the tickets, the
replies encoded for the front ends. Here the real `Batcher`, runner and collation (the checkpoint's own engine) run
over a stand-in device: a launch costs `--launch-us` of host Python (a graph replay's calls) and makes `--launch-calls`
calls (the quiet model's `--quiet-launch-calls`) that give the interpreter up while they run, as a CUDA call does, then
the device computes for `--batch-ms` plus `--sentence-us` per input while the host goes on, and waiting for it holds no
interpreter (the defaults are the bundled model on an H200: 0.81 ms for 128 sentences, 1.31 ms for 256, in-process,
BENCHMARKS.md), and a finished batch's results are one pooled vector per input. Closed-loop clients send requests of
`--per-request` inputs and send again `--outside-ms` after each answer (the front end, the hop between processes, HTTP
and the client, which this leaves out). The figure is the sentences/s against the device's own rate at batches of
`--batch-size`; the engine's metrics say where the rest went, and the process's CPU time a sentence what the host
spent on each. With `--quiet-rate R`, a second model on the same
device and runner gets one client sending 16 inputs R times a second whatever the answers (a reranker beside a
flooded embedder, bench.serving.several_models' load): its round trips' p50 and p99 say how long a quiet model's
request waits behind the flood in the engine, and its queue, batch and wait on the device behind other batches say
where. With `--express-lane` its batches go on an express runner's stream, as
with --gpu-express-lane (service/engine/streams.py), which the stand-in device runs beside the default stream's
without slowing either (a GPU's two streams share its multiprocessors, so there the flood's batch takes a little
longer); without, on the runner and the flood's stream, as a GPU serves several models by default.

    python -m bench.serving.engine_pipeline [--checkpoint DIR] [--clients 64] [--outside-ms 3] [--rounds 3]
                                            [--quiet-rate 20] [--express-lane] [--switch-interval-ms 5]
                                            [--launch-calls 4] [--quiet-launch-calls 4]
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import os
import platform
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from bench.serving.throughput import mean_ms, percentile_ms, sentences
from devkit.paths import checkpoint_argument
from service.engine.batcher import Batcher, BatchPolicy, DeviceRunners
from service.engine.interpreter_lag import InterpreterLag
from service.engine.loader import build_engine
from service.engine.precision import choose
from service.engine.tickets import Ticket
from service.memory import freeze_loaded_objects
from service.messages import Done, Submit, decode, encode
from service.metrics import Metrics
from service.settings import DEFAULT_CHECKPOINT, Settings

CALL_FLOATS = 32768  # a launch call's tensor: adding to it takes ~4 µs of one core, a CUDA kernel launch's host time
COMPUTE_NICENESS = Settings.model_fields["compute_niceness"].default  # the engine's runners', as served
from service.tasks import EncodeItem, PooledVector


@dataclass
class DeviceModel:
    """What the stand-in device costs: host Python per launch; device time per batch and per input."""

    launch_us: float = 150.0
    batch_ms: float = 0.31
    sentence_us: float = 3.9
    # Calls into torch that give the interpreter up while they run, as each CUDA call of a launch does (a thread
    # waiting for the interpreter may take it, and the launch then waits for that thread to let go): a graphed
    # embedding batch makes 4 (the inputs' copy, the replay, the pooled vectors' copy down, an event: the graph pools
    # them itself), and so does a reranker's batch, the quiet model's (the graph computes its classifier's logits
    # too). Each costs ~4 µs of host time here (CALL_FLOATS).
    launch_calls: int = 4
    quiet_launch_calls: int = 4

    def seconds(self, inputs: int) -> float:
        return self.batch_ms / 1e3 + self.sentence_us / 1e6 * inputs


class StandInDevice:
    """The stand-in GPU's streams, shared by every model's engine: when each one's last batch ends (the default
    stream, and the express runner's, which the thread that entered `express_stream` launches on)."""

    def __init__(self, model: DeviceModel):
        self.model = model
        self.free_at = {False: 0.0, True: 0.0}
        self.on_express = threading.local()
        self.lock = threading.Lock()
        self.busy_s = 0.0

    def queue(self, now: float, inputs: int) -> tuple[float, float]:
        """A batch of `inputs` launched `now` on the calling thread's stream: (when it ends, how long it waits for
        the batches before it there)."""
        stream, seconds = getattr(self.on_express, "stream", False), self.model.seconds(inputs)
        with self.lock:
            starts = max(now, self.free_at[stream])
            self.free_at[stream] = starts + seconds
            self.busy_s += seconds
        return starts + seconds, starts - now

    @contextlib.contextmanager
    def express_stream(self):
        """DeviceRunners' express_stream: the entering thread's launches go on the second stream."""
        self.on_express.stream = True
        try:
            yield
        finally:
            self.on_express.stream = False


class StandInGpu:
    """A model's engine whose launch returns while its device computes: the checkpoint's own collation, a launch that
    spends `launch_us` of Python and queues the batch on its stream (it starts when the stream's last batch ends),
    a finish that sleeps until it has ended (no interpreter held, as a CUDA event's wait holds none; no thread has to
    take the interpreter to say that the device is done), results of one pooled vector per input."""

    overlaps = True
    pads_attention = False  # as on a GPU in bfloat16: batches are not priced

    def __init__(self, engine, device: StandInDevice, width: int, launch_calls: int):
        self.engine = engine
        self.device = device
        self.launch_calls = launch_calls
        self.vectors = np.random.default_rng(0).standard_normal((4096, width)).astype(np.float32)  # the batch's output
        self.call_buffer = torch.zeros(CALL_FLOATS)
        self.batches = 0
        self.waited_s = 0.0  # on the device, behind other batches on the same stream

    def collate(self, items):
        return self.engine.collate(items)

    def flops(self, *args):
        return self.engine.flops(*args)

    def launch(self, batch):
        end = time.perf_counter() + self.device.model.launch_us / 1e6
        while time.perf_counter() < end:  # Python held, as a replay's calls hold it
            pass
        for _ in range(self.launch_calls):
            self.call_buffer.add_(1)  # the interpreter given up for the call, as torch gives it up for a CUDA call
        ends, waited = self.device.queue(end, batch.size)
        self.batches += 1
        self.waited_s += waited
        return ends, batch.size

    def finish(self, work):
        ends, inputs = work
        if (left := ends - time.perf_counter()) > 0:
            time.sleep(left)
        return list(map(PooledVector, self.vectors[:inputs]))  # as the encode head's collector reads an embedding batch

    def run(self, batch):
        return self.finish(self.launch(batch))

    def release_cached_memory(self) -> None:
        return

    @staticmethod
    def is_out_of_memory(exc: BaseException) -> bool:
        return False


@dataclass
class Round:
    sentences_per_s: float
    vs_device: float  # over the device's own rate at batches of --batch-size
    device_busy: float  # the share of the time the stand-in device computed
    round_trip_p50_ms: float  # a request's, handed to the batcher to its reply encoded
    queue_ms: float  # an input's mean wait before its batch (bert_queue_time_seconds)
    batch_ms: float  # a batch's mean launch to results (bert_inference_seconds)
    mean_batch: float
    interpreter_lag_ms: float  # the probe's mean wait for the interpreter (service/engine/interpreter_lag.py)
    # The process's CPU time (every thread: the engine's host work, the clients' little) over the sentences answered:
    # what the rate is bound by where the interpreter is.
    host_us: float
    quiet_p50_ms: float = float("nan")  # with --quiet-rate: the second model's requests' round trips
    quiet_p99_ms: float = float("nan")
    # ... and where they went, means: queued (to its batch's launch), its batches (launch to results), and of that
    # the wait on the device behind other batches on the same stream
    quiet_queue_ms: float = float("nan")
    quiet_batch_ms: float = float("nan")
    quiet_behind_ms: float = float("nan")


class Clients:
    """Closed-loop clients as the engine sees them: each request read off the wire (a front end's encoded Submit,
    decoded as the engine process's reader decodes it) and its inputs handed to the batcher; its reply encoded as
    the engine process sends it; the same client's next request `outside_s` later."""

    QUIET = -1  # the client number of the second model's paced requests

    def __init__(self, batcher: Batcher, items: list, clients: int, per_request: int, outside_s: float,
                 quiet: tuple[Batcher, float] | None = None):
        self.batcher, self.per_request, self.outside_s = batcher, per_request, outside_s
        # what front ends send: every request's Submit, encoded before the clock starts
        self.frames = _frames(items, per_request)
        # With `quiet` (its batcher, requests a second): one client of a second model on the same device, sending
        # 16 inputs a request at a steady rate whatever the answers (a reranker beside a flooded embedder, as in
        # bench.serving.several_models), read off the wire by the same thread as the flood's.
        self.quiet_batcher, self.quiet_period = (quiet[0], 1 / quiet[1]) if quiet else (None, 0.0)
        self.quiet_frames = _frames(items, 16) if quiet else []
        self.quiet_round_trips: list[float] = []
        self.lock = threading.Condition()
        self.due: list[tuple[float, int]] = []  # (when, client): the next requests to send
        self.sent_at: dict[int, float] = {}
        self.round_trips: list[float] = []
        self.answered = 0  # inputs
        self.number = 0
        for client in range(clients):
            self.due.append((0.0, client))
        if quiet:
            self.due.append((0.0, self.QUIET))

    def deliver(self, tickets: list[Ticket]) -> None:  # the batcher's Sink, on the runner's thread
        for ticket in tickets:
            encode(Done(ticket.tag[1], ticket.results))
        now = time.perf_counter()
        with self.lock:
            for ticket in tickets:
                client = ticket.tag[0]
                if client == self.QUIET:
                    self.quiet_round_trips.append(now - self.sent_at.pop(ticket.tag))
                    continue
                self.round_trips.append(now - self.sent_at.pop(ticket.tag))
                self.answered += ticket.size
                heapq.heappush(self.due, (now + self.outside_s, client))
            self.lock.notify()

    def send_until(self, end: float) -> None:
        while time.perf_counter() < end:
            with self.lock:
                now = time.perf_counter()
                ready = []
                while self.due and self.due[0][0] <= now:
                    ready.append(heapq.heappop(self.due)[1])
                if not ready:
                    self.lock.wait(min(0.01, max(1e-4, self.due[0][0] - now)) if self.due else 0.01)
                    continue
            for client in ready:
                self.number += 1
                tag = (client, self.number)
                self.sent_at[tag] = sent = time.perf_counter()
                batcher, frames = (self.quiet_batcher, self.quiet_frames) if client == self.QUIET else \
                    (self.batcher, self.frames)
                message = decode(frames[self.number % len(frames)])
                batcher.submit(message.items, Ticket(message.deadline, len(message.items), self, tag))
                if client == self.QUIET:
                    with self.lock:
                        heapq.heappush(self.due, (sent + self.quiet_period, client))  # its answer may be in


def _frames(items: list, per_request: int) -> list[bytes]:
    far = time.monotonic() + 3600
    return [encode(Submit(0, [items[(first + i) % len(items)] for i in range(per_request)], far))
            for first in range(0, len(items), per_request)]


def measure(checkpoint: Path, device: DeviceModel, clients: int, per_request: int, outside_ms: float, seconds: float,
            batch_size: int, quiet_rate: float = 0.0, express_lane: bool = False) -> Round:
    from model import load_checkpoint

    loaded = load_checkpoint(checkpoint)
    cpu = torch.device("cpu")
    gpu = StandInDevice(device)

    def stand_in(launch_calls: int) -> StandInGpu:  # a model's engine on the shared stand-in device
        return StandInGpu(build_engine(loaded, cpu, choose("float32", cpu)), gpu, loaded.model.config.hidden_size,
                          launch_calls)

    engine = stand_in(device.launch_calls)
    quiet_engine = stand_in(device.quiet_launch_calls) if quiet_rate else None
    texts = sentences(2000, None, None)
    items = [EncodeItem(list(e.ids), list(e.type_ids), "mean", True) for e in loaded.tokenizer.encode_batch(texts)]
    freeze_loaded_objects()  # as the engine process does once its models are loaded
    metrics = Metrics()
    policy = BatchPolicy(16384, batch_size, max_padding_fraction=0.10)
    # one device's runner at the engine's niceness, shared by the models as service.engine.models shares it, and with
    # --express-lane an express runner (as service.engine.models.express_runners gives a GPU with --gpu-express-lane)
    express = 1 if quiet_rate and express_lane else 0
    runners = DeviceRunners(1, COMPUTE_NICENESS, express, gpu.express_stream)
    batcher = Batcher(engine, policy, metrics, device=runners, name="flooded")
    quiet = Batcher(quiet_engine, policy, metrics, device=runners, name="quiet") if quiet_engine else None
    models = [batcher] + ([quiet] if quiet else [])
    lag = InterpreterLag(metrics.interpreter_lag.observe)
    for model in models:
        model.start()
    runners.start()
    lag.start()
    try:
        load = Clients(batcher, items, clients, per_request, outside_ms / 1000, (quiet, quiet_rate) if quiet else None)
        load.send_until(time.perf_counter() + min(2.0, seconds / 3))  # warm-up
        before, busy, answered = metrics.render().decode(), gpu.busy_s, load.answered
        if quiet_engine:  # its device waits from here on
            quiet_engine.batches, quiet_engine.waited_s = 0, 0.0
        load.round_trips.clear()
        load.quiet_round_trips.clear()
        started, cpu_started = time.perf_counter(), time.process_time()
        load.send_until(started + seconds)
        elapsed, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
        after, busy, answered = metrics.render().decode(), gpu.busy_s - busy, load.answered - answered
    finally:
        for model in models:
            model.stop(10)
        runners.join(10)
        lag.stop()

    def mean(name: str, model: str | None = "flooded") -> float:
        found = mean_ms(before, after, name, model)
        return found / 1000 if found is not None else float("nan")

    rate = answered / elapsed
    return Round(rate, rate / (batch_size / device.seconds(batch_size)), busy / elapsed,
                 _p50_p99_ms(load.round_trips)[0], 1000 * mean("bert_queue_time_seconds"),
                 1000 * mean("bert_inference_seconds"), mean("bert_batch_sequences"),
                 1000 * mean("bert_engine_interpreter_lag_seconds", None), 1e6 * cpu_s / max(1, answered),
                 *_p50_p99_ms(load.quiet_round_trips),
                 1000 * mean("bert_queue_time_seconds", "quiet"), 1000 * mean("bert_inference_seconds", "quiet"),
                 1000 * quiet_engine.waited_s / quiet_engine.batches if quiet_engine and quiet_engine.batches
                 else float("nan"))


def _p50_p99_ms(round_trips: list[float]) -> tuple[float, float]:
    found = percentile_ms(round_trips, 50), percentile_ms(round_trips, 99)
    return tuple(float("nan") if ms is None else ms for ms in found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.serving.engine_pipeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=checkpoint_argument, default=DEFAULT_CHECKPOINT)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--per-request", type=int, default=8)
    parser.add_argument("--outside-ms", type=float, default=3.0,
                        help="from an answer to the same client's next request (default 3)")
    parser.add_argument("--launch-us", type=float, default=DeviceModel.launch_us)
    parser.add_argument("--launch-calls", type=int, default=DeviceModel.launch_calls,
                        help="calls a launch makes that give the interpreter up (DeviceModel)")
    parser.add_argument("--quiet-launch-calls", type=int, default=DeviceModel.quiet_launch_calls,
                        help="the same for the quiet model's batches (DeviceModel)")
    parser.add_argument("--batch-ms", type=float, default=DeviceModel.batch_ms)
    parser.add_argument("--sentence-us", type=float, default=DeviceModel.sentence_us)
    parser.add_argument("--batch-size", type=int, default=256, help="the batcher's largest batch (a GPU's default)")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quiet-rate", type=float, default=0.0,
                        help="requests a second (16 inputs each) of a second model on the same device, beside the "
                             "flood: their round trips' p50 and p99 (default 0: none)")
    parser.add_argument("--express-lane", action="store_true",
                        help="the quiet model's batches go on an express runner's stream (--gpu-express-lane)")
    parser.add_argument("--switch-interval-ms", type=float, default=None,
                        help="the interpreter's switch interval (default: the engine process's)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    device = DeviceModel(args.launch_us, args.batch_ms, args.sentence_us, args.launch_calls, args.quiet_launch_calls)
    rounds = []
    for number in range(args.rounds):
        rounds.append(measure(args.checkpoint, device, args.clients, args.per_request, args.outside_ms, args.seconds,
                              args.batch_size, args.quiet_rate, args.express_lane))
        print(f"round {number + 1}: {rounds[-1]}", file=sys.stderr, flush=True)
    best = max(rounds, key=lambda r: r.sentences_per_s)
    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} cores; {args.clients} clients x "
          f"{args.per_request}, {args.outside_ms:g} ms outside the engine; switch interval "
          f"{sys.getswitchinterval() * 1000:g} ms; the stand-in device: {device}"
          + (f"; the quiet model's express lane {'on' if args.express_lane else 'off'}" if args.quiet_rate else "")
          + "\n")
    quiet = " quiet model p50 / p99 ms | its queue / batch / behind on the device ms |" if args.quiet_rate else ""
    print(f"| round | sentences/s | x the device's rate | device busy | round trip p50 ms | queue ms | batch ms | "
          f"mean batch | interpreter lag ms | host CPU µs a sentence |{quiet}\n"
          f"| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
          f"{' ---: | ---: |' if quiet else ''}")
    for number, r in enumerate(rounds, 1):
        print(f"| {number}{' (best)' if r is best else ''} | {r.sentences_per_s:,.0f} | {r.vs_device:.2f} | "
              f"{r.device_busy:.0%} | {r.round_trip_p50_ms:.2f} | {r.queue_ms:.2f} | {r.batch_ms:.2f} | "
              f"{r.mean_batch:.1f} | {r.interpreter_lag_ms:.2f} | {r.host_us:.2f} |"
              + (f" {r.quiet_p50_ms:.2f} / {r.quiet_p99_ms:.2f} | {r.quiet_queue_ms:.2f} / {r.quiet_batch_ms:.2f} / "
                 f"{r.quiet_behind_ms:.2f} |" if quiet else ""))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rounds], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
