"""The process arrangement of `--workers N` (N >= 1): one engine process and N HTTP front ends.

    supervisor (this)  binds the port, starts the others, restarts a front end that dies, orders shutdown
    ├── engine         python -m service.engine.server: device, model, the one batcher
    └── front end × N  python -m service.frontend.worker: HTTP, validation, tokenization, JSON

The front ends accept on the one listening socket the supervisor made (the kernel spreads connections
over them), talk to the engine over a ZeroMQ socket in a private directory, count requests in flight
in one shared file (one admission limit) and write metrics where every /metrics reads all of them.

- A front end that dies (`kill -9`) fails only its own requests in flight; it is started again in its
  slot within a second, while the others keep serving.
- The engine dying is not repaired here: the front ends fail its requests in flight at once and answer
  /live with 503, and the supervisor stops them and exits 1, so that the orchestrator (Docker's restart
  policy, Kubernetes) starts the server afresh with a clean device.
- SIGTERM or SIGINT: the front ends drain (see `drain_seconds`) and exit; then the engine computes what
  is still queued and exits; then the supervisor exits 0. Nothing accepted is lost.
- Killed with SIGKILL, the supervisor leaves its directory behind; the next start on the host removes it
  (`service.workdir`).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

from prometheus_client import multiprocess

from model.cpu_cores import usable_cores
from model.hub import ResolvedCheckpoint
from service.frontend.admission import create_slots
from service.launch import launch_record
from service.metrics import MULTIPROCESS_DIR
from service.settings import Settings
from service.workdir import create_work_directory, remove_abandoned

log = logging.getLogger("service")
RESTART_DELAY_S = 0.5
CRASH_LOOP = (5, 60.0)  # this many front-end deaths within this many seconds: stop instead of restarting


def auto_workers(device: str) -> int:
    """`--workers auto`: 0 on a CPU (the model needs every core); on a GPU one front end per two cores beyond
    the engine's, 2 to 8."""
    from model.device import pick_device  # torch: only when the rule needs it

    if pick_device(device).type == "cpu":
        return 0
    return max(2, min(8, (usable_cores() - 2) // 2))


class Supervisor:
    def __init__(self, settings: Settings, workers: int, sources: dict[str, ResolvedCheckpoint]):
        # The children load the directories resolved here (a Hub id is fetched once, before the port is bound).
        self.settings = settings.model_copy(update={"workers": workers})
        self.sources = {name: sources_json(source) for name, source in sources.items()}
        self.workers = workers
        remove_abandoned()  # what supervisors killed with SIGKILL left behind
        self.directory = create_work_directory()
        self.in_flight = self.directory / "in-flight"
        self.metrics_dir = self.directory / "metrics"
        self.front_ends: dict[int, subprocess.Popen] = {}
        self.deaths: list[float] = []
        self.stopping = False

    def run(self) -> int:
        listener = socket.create_server((self.settings.host, self.settings.port), backlog=2048)
        listener.set_inheritable(True)
        # The front ends each listen on the gRPC port (SO_REUSEPORT: the kernel spreads connections over them, as
        # over the HTTP socket); this bound socket, never listening, holds the port for them across restarts.
        grpc_port = _reserve_port(self.settings.host, self.settings.grpc_port) if self.settings.grpc_port else None
        self.metrics_dir.mkdir()
        self.env = {**os.environ, MULTIPROCESS_DIR: str(self.metrics_dir)}
        create_slots(self.in_flight, self.workers, len(self.sources))
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._stop)
        try:
            self.engine = self._spawn("service.engine.server", directory=str(self.directory), sources=self.sources)
            for slot in range(self.workers):
                self.front_ends[slot] = self._front_end(slot, listener.fileno())
            log.info("serving on http://%s:%d with %d front ends and one engine process (pid %d)",
                     self.settings.host, self.settings.port, self.workers, self.engine.pid)
            code = self._watch(listener.fileno())
        finally:
            listener.close()  # no more restarts; once the front ends close theirs, connections are refused
            if grpc_port is not None:
                grpc_port.close()
            self._shut_down()
            shutil.rmtree(self.directory, ignore_errors=True)
        return code

    def _spawn(self, module: str, pass_fds: tuple[int, ...] = (), **fields) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE, env=self.env,
                                   pass_fds=pass_fds)
        process.stdin.write(launch_record(self.settings, **fields))
        process.stdin.close()
        return process

    def _front_end(self, slot: int, fd: int) -> subprocess.Popen:
        return self._spawn("service.frontend.worker", pass_fds=(fd,), directory=str(self.directory), slot=slot, fd=fd,
                           engine_pid=self.engine.pid, in_flight=str(self.in_flight), sources=self.sources)

    def _stop(self, sig, frame) -> None:
        if not self.stopping:
            log.info("%s: draining the front ends, then the engine", signal.Signals(sig).name)
        self.stopping = True

    def _watch(self, fd: int) -> int:
        """Until told to stop or the engine ends: restart front ends that die. Returns the exit code."""
        while not self.stopping:
            time.sleep(0.05)
            if self.engine.poll() is not None:
                log.error("the engine process ended (exit code %s); stopping the server", self.engine.returncode)
                multiprocess.mark_process_dead(self.engine.pid, str(self.metrics_dir))
                return 1
            for slot, process in self.front_ends.items():
                if process.poll() is None or self.stopping:
                    continue
                multiprocess.mark_process_dead(process.pid, str(self.metrics_dir))
                now = time.monotonic()
                self.deaths = [t for t in self.deaths if now - t < CRASH_LOOP[1]] + [now]
                if len(self.deaths) >= CRASH_LOOP[0]:
                    log.error("front ends died %d times in %.0f s; stopping the server", *CRASH_LOOP)
                    return 1
                log.warning("front end %d (pid %d) ended with %s; starting it again", slot, process.pid,
                            process.returncode)
                time.sleep(RESTART_DELAY_S)
                self.front_ends[slot] = self._front_end(slot, fd)
        return 0

    def _shut_down(self) -> None:
        """Front ends first (they finish their requests, which need the engine), then the engine."""
        grace = self.settings.drain_seconds + max(30, self.settings.queue_timeout_s + 5) + 5
        for process in self.front_ends.values():
            _signal(process, signal.SIGTERM)
        for process in self.front_ends.values():
            _wait(process, grace)
        if getattr(self, "engine", None) is not None:
            _signal(self.engine, signal.SIGTERM)
            _wait(self.engine, grace)


def _reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to `port` with SO_REUSEPORT and not listening: it takes no connections, keeps the port from
    programs that do not share it on purpose (SO_REUSEPORT, the same user), and fails here, before anything starts,
    if the port is taken."""
    reserved = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        reserved.bind((host, port))
    except OSError as exc:
        reserved.close()
        raise OSError(exc.errno, f"cannot serve gRPC on {host}:{port}: {exc.strerror}") from None
    return reserved
def sources_json(source: ResolvedCheckpoint) -> dict:
    """A resolved checkpoint as the launch record carries it to the children (service.launch.sources_from)."""
    return {"path": str(source.path), "hub_id": source.hub_id, "revision": source.revision, "commit": source.commit}


def _signal(process: subprocess.Popen, sig: int) -> None:
    if process.poll() is None:
        process.send_signal(sig)


def _wait(process: subprocess.Popen, seconds: float) -> None:
    try:
        process.wait(seconds)
    except subprocess.TimeoutExpired:
        log.error("pid %d did not stop within %.0f s; killing it", process.pid, seconds)
        process.kill()
        process.wait()
