"""The supervisor's `bert-serve-*` directory: one left by a supervisor killed with SIGKILL is removed by the next
start; a live server's, another user's or one without an owner file is not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from devkit.server import free_port, start
from service.workdir import OWNER_FILE, PREFIX, create_work_directory, process_identity, remove_abandoned
from tests.service.test_processes import children


def test_only_directories_of_supervisors_that_are_gone_are_removed(tmp_path):
    ours = create_work_directory(tmp_path)  # this process: alive
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"{PREFIX}dead"
    dead.mkdir()
    (dead / OWNER_FILE).write_text(f"{gone.pid} 12345")
    reused = tmp_path / f"{PREFIX}reused"  # this pid again, but a process started at another time
    reused.mkdir()
    (reused / OWNER_FILE).write_text(f"{os.getpid()} 1")
    unknown = tmp_path / f"{PREFIX}unknown"  # no owner file: being created, or not ours to judge
    unknown.mkdir()
    other = tmp_path / "other-thing"
    other.mkdir()
    (other / OWNER_FILE).write_text(f"{gone.pid} 12345")

    assert sorted(remove_abandoned(tmp_path)) == sorted([dead, reused])
    assert ours.is_dir() and unknown.is_dir() and other.is_dir() and not dead.exists() and not reused.exists()
    assert (ours / OWNER_FILE).read_text() == process_identity(os.getpid())


def test_the_next_start_removes_what_a_killed_supervisor_left(tmp_path, tiny_checkpoint):
    env = {**os.environ, "TMPDIR": str(tmp_path)}

    def serve() -> subprocess.Popen:
        port = free_port()
        return start([sys.executable, "-m", "service", "--checkpoint", str(tiny_checkpoint), "--workers", "1",
                      "--port", str(port)], f"http://127.0.0.1:{port}", env=env)

    first = serve()
    left = list(tmp_path.glob(PREFIX + "*"))
    assert len(left) == 1
    orphans = [pid for pids in children(first.pid).values() for pid in pids]
    first.send_signal(signal.SIGKILL)
    first.wait()
    deadline = time.monotonic() + 30
    while any(process_identity(pid) for pid in orphans):  # they follow their supervisor (PR_SET_PDEATHSIG)
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert left[0].is_dir()  # nothing could remove it

    second = serve()
    try:
        now = list(tmp_path.glob(PREFIX + "*"))
        assert len(now) == 1 and now != left and not left[0].exists()
        assert "left by a server that is gone" in second.log_path.read_text()
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=60) == 0
    assert not list(tmp_path.glob(PREFIX + "*"))  # a clean stop removes its own
