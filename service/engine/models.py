"""Every model of the server on its one device: each with its engine and its batcher, all fed by one set of runners
that shares the device between them fairly (service.engine.device_runners).

`load_models` starts them in the order given (the first is the default), after checking that all of them fit the
device (service.engine.memory_check): a server serves every model it was given, or none. The engine process
(`service.engine.server`) and the one-process server (`service.engine.link.LocalLink`) both start here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

from model.checkpoint_files import load_config
from model.device import pick_device
from service.engine.batcher import Batcher
from service.engine.device_runners import DeviceRunners
from service.engine.interpreter_lag import InterpreterLag
from service.engine.loader import AUTO_BATCH_SIZE_CPU, StartedEngine, StartupError, start_engine
from service.engine.memory_check import check_fits, free_memory, model_need
from service.engine.streams import express_stream
from service.messages import ModelFacts
from service.metrics import Metrics
from service.model_specs import ModelSpec

log = logging.getLogger("service")


@dataclass
class ServedEngine:
    """One model in the engine: what it is, its started engine, its batcher, and what the HTTP side learns of it."""

    spec: ModelSpec
    started: StartedEngine
    batcher: Batcher
    facts: ModelFacts


class EngineModels:
    """The engine's models by name, the default first."""

    def __init__(self, served: list[ServedEngine], device: DeviceRunners, lag: InterpreterLag | None = None):
        self.served = {s.spec.name: s for s in served}
        self.default = served[0].spec.name
        self.device = device
        self.lag = lag

    def batcher(self, name: str) -> Batcher | None:
        """The batcher of the model `name` ("" = the default), None if no model has that name."""
        found = self.served.get(name or self.default)
        return found.batcher if found is not None else None

    @property
    def facts(self) -> list[ModelFacts]:
        return [s.facts for s in self.served.values()]

    @property
    def workers_alive(self) -> bool:
        return all(s.batcher.workers_alive for s in self.served.values())

    def stalled_for(self) -> float:
        """The longest any model has had work without finishing a batch (the engine's heartbeat)."""
        return max(s.batcher.stalled_for() for s in self.served.values())

    def stop(self, timeout: float = 60.0) -> None:
        """Compute everything queued for every model, then stop the preparers and the runners."""
        for served in self.served.values():
            served.batcher.stop(timeout)
        self.device.join(timeout)
        if self.lag is not None:
            self.lag.stop()


def load_models(settings, metrics: Metrics, directories: dict[str, Path] | None = None,
                engine_factory=None) -> EngineModels:
    """Start every model of `settings` (service.settings.Settings) from `directories` (name -> resolved checkpoint
    directory; by default each --checkpoint as it is). Raises StartupError naming the model that cannot start."""
    specs = settings.models()
    directories = directories or {spec.name: Path(spec.checkpoint) for spec in specs}
    check_memory(settings, specs, directories)
    served, device = [], None
    for spec in specs:
        options = settings.engine_options(replace(spec, checkpoint=str(directories[spec.name])))
        try:
            started = start_engine(options, metrics.for_model(spec.name), engine_factory)
        except Exception as exc:  # noqa: BLE001 - one line naming the model; no half-ready server
            raise StartupError(f"model {spec.name}: {exc}" if len(specs) > 1 else str(exc)) from None
        if device is None:  # every model runs on the same device and threads: the first start-up planned them
            express = express_runners(settings, started.runners, started.engine.overlaps, len(specs))
            device = DeviceRunners(started.runners, settings.compute_niceness, express,
                                   express_stream(started.engine.device))
        policy = started.batch_policy(settings.max_wait_ms / 1000, spec.max_queue_items, settings.max_padding_fraction,
                                      settings.compute_niceness)
        batcher = Batcher(started.engine, policy, metrics, device=device, name=spec.name, weight=spec.weight)
        facts = replace(started.facts(), name=spec.name)
        served.append(ServedEngine(spec, started, batcher, facts))
    for one in served:
        one.batcher.start()
    device.start()
    lag = InterpreterLag(metrics.interpreter_lag.observe)
    lag.start()
    if len(served) > 1:
        log.info("serving %d models on one device: %s (default %s)", len(served),
                 ", ".join(f"{s.spec.name} ({s.facts.dtype}, weight {s.spec.weight:g})" for s in served),
                 served[0].spec.name)
    return EngineModels(served, device, lag)


def express_runners(settings, runners: int, overlaps: bool, models: int) -> int:
    """How many express runners a device of `runners` gets (service.engine.device_runners): with several models, one
    per runner on a CPU (the woken request split over them; --express-lane); on a GPU, whose batches overlap, one on
    a stream of its own (--gpu-express-lane)."""
    if models < 2:
        return 0
    if overlaps:
        return 1 if settings.gpu_express_lane else 0
    return runners if settings.express_lane else 0


def check_memory(settings, specs: list[ModelSpec], directories: dict[str, Path]) -> None:
    """Refuse to start (StartupError, with the figures) when the models would not fit the device together."""
    try:
        device = pick_device(settings.device)
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    on_gpu = device.type == "cuda"
    budget = settings.max_batch_tokens if on_gpu else min(settings.max_batch_tokens, 64 * AUTO_BATCH_SIZE_CPU)
    # a GPU's express runner queues on a stream of its own (one runner; a GPU's batches overlap)
    streams = 1 + (express_runners(settings, 1, True, len(specs)) if on_gpu else 0)
    needs = []
    for spec in specs:
        directory = directories[spec.name]
        try:
            config = load_config(directory)
        except Exception as exc:  # noqa: BLE001 - the start-up says it with the model's name
            raise StartupError(f"model {spec.name}: {exc}" if len(specs) > 1 else str(exc)) from None
        dtype = spec.dtype if spec.dtype != "auto" else ("bfloat16" if on_gpu else "float32")
        needs.append(model_need(spec.name, directory, dtype, config, budget, on_gpu, streams))
    free, described = free_memory(device)
    problem = check_fits(needs, free, described)
    if problem is not None:
        raise StartupError(problem)
