"""The express runner on an asynchronous device (a GPU, service.engine.device_runners and service.engine.streams):
a request that wakes an idle model while the runner keeps another model's batches on the device goes on a stream
of its own and is answered in its own batch's time, not after the flood's batch in flight and the one launched
behind it; and a model's batches never run on two streams at once (its CUDA graphs' outputs would be overwritten).

Checked with an engine whose device has one thread per stream: a batch launched on a stream starts once the
batches before it on that stream have ended, as on a GPU; the express runner's stream is the one it entered."""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from service.engine.batcher import Batcher, BatchPolicy
from service.engine.device_runners import DeviceRunners
from service.engine.tickets import Ticket
from service.metrics import Metrics
from tests.service.engine.stand_ins import StandInEngine
from tests.service.engine.test_device_runners import answered, stop

QUIET_S = 0.01  # device time of a quiet model's batch


class Item(list):
    """A list of ints with its model's name; its answer is its sum."""

    def __init__(self, model: str, values: list[int]):
        super().__init__(values)
        self.model = model


class Streams:
    """The device's streams, each one thread: "default", and the one an express runner enters."""

    def __init__(self):
        self.current = threading.local()
        self.devices: dict[str, ThreadPoolExecutor] = {}
        self.lock = threading.Lock()
        self.log: list[tuple[str, str, float, float]] = []  # (model, stream, started, ended) of each batch
        self.launches: list[tuple[str, float]] = []  # (model, when) of each launch

    @contextlib.contextmanager
    def express(self):  # DeviceRunners' express_stream
        self.current.name = "express"
        try:
            yield
        finally:
            self.current.name = "default"

    def queue(self, work) -> object:
        name = getattr(self.current, "name", "default")
        with self.lock:
            device = self.devices.setdefault(name, ThreadPoolExecutor(1, thread_name_prefix=f"stream-{name}"))
        return device.submit(work, name)


class StreamedEngine(StandInEngine):
    """A model's engine whose launch queues its batch on the calling thread's stream and returns at once."""

    overlaps = True

    def __init__(self, streams: Streams, device_s: float):
        self.streams, self.device_s = streams, device_s

    def launch(self, batch):
        with self.streams.lock:
            self.streams.launches.append((batch.items[0].model, time.monotonic()))

        def compute(stream: str) -> list[int]:
            started = time.monotonic()
            time.sleep(self.device_s)
            with self.streams.lock:
                self.streams.log.append((batch.items[0].model, stream, started, time.monotonic()))
            return [sum(item) for item in batch.items]
        return self.streams.queue(compute)

    def finish(self, work) -> list[int]:
        return work.result()

    def run(self, batch):
        return self.finish(self.launch(batch))


class Collected:
    def __init__(self):
        self.done: dict = {}

    def deliver(self, tickets):
        for ticket in tickets:
            self.done[ticket.tag] = (time.monotonic(), ticket.results)


def serving(flood_s: float, express: int):
    """A flooded model whose batches take `flood_s` on the device and a quiet one, on one runner (and `express`
    express runners): (streams, device, batchers, metrics)."""
    streams, metrics = Streams(), Metrics()
    device = DeviceRunners(1, express=express, express_stream=streams.express)
    policy = BatchPolicy(max_batch_tokens=64, max_batch_size=4, max_queue_items=100_000)
    batchers = {name: Batcher(StreamedEngine(streams, seconds), policy, metrics, device=device, name=name)
                for name, seconds in (("flooded", flood_s), ("quiet", QUIET_S))}
    for batcher in batchers.values():
        batcher.start()
    device.start()
    return streams, device, batchers, metrics


def ask(batcher: Batcher, sink: Collected, tag, items: list[list[int]]) -> None:
    batcher.submit([Item(batcher.name, values) for values in items],
                   Ticket(time.monotonic() + 60, len(items), sink, tag=tag))


def woken_while_flooded(express: int) -> tuple[float, Streams, Collected, str]:
    """A woken model's one-batch request while the flood's 0.3 s batches are on the device, one in flight and the
    next launched behind it: (how long it took, the streams, the answers, the metrics after)."""
    streams, device, batchers, metrics = serving(flood_s=0.3, express=express)
    sink = Collected()
    try:
        for n in range(6):
            ask(batchers["flooded"], sink, ("flood", n), [[n, 1]] * 4)
        time.sleep(0.05)  # the flood's first batch is on the device, its second queued behind it
        asked = time.monotonic()
        ask(batchers["quiet"], sink, "quiet", [[2, 3], [4, 5, 6]])
        answered(sink, "quiet")
        waited = sink.done["quiet"][0] - asked
        for n in range(6):
            answered(sink, ("flood", n))
    finally:
        stop(device, batchers)
    return waited, streams, sink, metrics.render().decode()


def test_a_woken_model_runs_on_its_own_stream_beside_the_flood():
    waited, streams, sink, metrics = woken_while_flooded(express=1)
    assert waited < 0.2, f"waited {waited:.3f} s"  # its own batch (0.01 s), not the flood's 0.25 s left and 0.3 s next
    assert sink.done["quiet"][1] == [5, 15]
    assert all(sink.done[("flood", n)][1] == [n + 1] * 4 for n in range(6))  # the flood lost nothing
    quiet = [(stream, started) for model, stream, started, _ in streams.log if model == "quiet"]
    assert [stream for stream, _ in quiet] == ["express"], streams.log
    flood = [(started, ended) for model, stream, started, ended in streams.log if model == "flooded"]
    assert all(stream == "default" for model, stream, _, _ in streams.log if model == "flooded")
    assert any(started < quiet[0][1] < ended for started, ended in flood)  # beside a flood batch, not after
    assert 'bert_express_batches_total{model="quiet"} 1.0' in metrics


def test_without_the_express_runner_the_woken_model_queues_behind_the_flood_on_one_stream():
    waited, streams, sink, _metrics = woken_while_flooded(express=0)  # the same case, no express: the test above can fail
    assert waited > 0.25, f"waited {waited:.3f} s"
    assert sink.done["quiet"][1] == [5, 15]
    assert {stream for _, stream, _, _ in streams.log} == {"default"}


def test_on_one_stream_a_woken_models_batch_is_read_before_the_next_launch():
    """Without the express runner, the woken model's batch runs after the flood's batch in flight; the runner then
    reads both, in that order, before it launches the flood's next: the woken request does not also wait for that
    launch (on a GPU, host time in which every CUDA call may hand the interpreter to another thread)."""
    waited, streams, sink, _metrics = woken_while_flooded(express=0)
    assert sink.done["quiet"][1] == [5, 15]
    quiet_launched = next(when for model, when in streams.launches if model == "quiet")
    next_flood_launch = min(when for model, when in streams.launches if model == "flooded" and when > quiet_launched)
    assert sink.done["quiet"][0] < next_flood_launch, streams.launches
    first_flood_answer = min(sink.done[("flood", n)][0] for n in range(6))
    assert first_flood_answer <= sink.done["quiet"][0]  # the batch before it was read first, as it ran first


def test_a_models_batches_never_run_on_two_streams_at_once():
    """A woken request of twelve batches: its first batch goes express (its waking tokens), the rest to the
    runner, which waits for that batch to end before launching the model's next on the default stream; then the
    model is woken again, and again. No two of its batches ever overlap, whatever their streams."""
    streams, device, batchers, _metrics = serving(flood_s=0.05, express=1)
    sink = Collected()
    try:
        for n in range(40):
            ask(batchers["flooded"], sink, ("flood", n), [[n, 1]] * 4)
        for round_ in range(3):
            time.sleep(0.08)
            ask(batchers["quiet"], sink, ("quiet", round_), [[round_, 1, 1, 1]] * 48)  # twelve batches of four
            answered(sink, ("quiet", round_))
        for n in range(40):
            answered(sink, ("flood", n))
    finally:
        stop(device, batchers)
    for round_ in range(3):
        assert sink.done[("quiet", round_)][1] == [round_ + 3] * 48
    assert all(sink.done[("flood", n)][1] == [n + 1] * 4 for n in range(40))
    quiet = sorted((started, ended, stream) for model, stream, started, ended in streams.log if model == "quiet")
    assert {stream for _, _, stream in quiet} == {"express", "default"}, quiet  # both streams served it
    for (_, ended, _), (started, _, _) in zip(quiet, quiet[1:]):
        assert started >= ended, quiet  # one batch of the model at a time


def test_the_express_runners_each_device_gets():
    """With several models: one per runner on a CPU (--express-lane, on by default); one on a GPU, only with
    --gpu-express-lane; none with one model."""
    from types import SimpleNamespace

    from service.engine.models import express_runners

    def runners(overlaps: bool, models: int = 3, **settings) -> int:
        return express_runners(SimpleNamespace(**{"express_lane": True, "gpu_express_lane": False, **settings}),
                               2, overlaps, models)

    assert runners(overlaps=False) == 2 and runners(overlaps=False, express_lane=False) == 0
    assert runners(overlaps=True) == 0 and runners(overlaps=True, gpu_express_lane=True) == 1
    assert runners(overlaps=False, models=1) == 0 and runners(overlaps=True, models=1, gpu_express_lane=True) == 0
