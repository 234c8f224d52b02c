"""Starting a server as a child process on loopback, waiting until /health answers 200, and stopping it.
Used by the benchmarks and by the tests that need a real server."""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from devkit.paths import REPO_ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(command: list[str], url: str, timeout_s: float = 120, env: dict[str, str] | None = None,
          cwd: Path = REPO_ROOT) -> subprocess.Popen:
    """Run `command` (with `env`, if given; in `cwd`, another checkout for a before-and-after) and wait for
    `url`/health. Its output goes to a file (`process.log_path`): an unread pipe fills up and then blocks the server
    mid-run."""
    log = tempfile.NamedTemporaryFile("w+", prefix="server-", suffix=".log", delete=False)
    process = subprocess.Popen(command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
    process.log_path = Path(log.name)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{command} exited: {process.log_path.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"{command} did not become healthy within {timeout_s:.0f} s")


def stop(process: subprocess.Popen, timeout_s: float = 60) -> None:
    """SIGTERM, so that the server drains and exits on its own; SIGKILL if it has not within `timeout_s`."""
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextmanager
def serving(command: list[str], url: str, timeout_s: float = 120):
    """`start(command, url, timeout_s)` for the `with` block (the process is its value), stopped when it ends."""
    process = start(command, url, timeout_s)
    try:
        yield process
    finally:
        stop(process)


def start_service(checkpoint, *flags: str, timeout_s: float = 120) -> tuple[subprocess.Popen, str]:
    """`python -m service` on a free loopback port with extra `flags`; returns the process and its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "service", "--checkpoint", str(checkpoint), "--port", str(port), *flags]
    return start(command, url, timeout_s), url
