"""What one HTTP front end costs beside the engine: its memory and its start, and whether it loaded torch.

    python -m bench.serving.frontend_footprint                          # this checkout
    python -m bench.serving.frontend_footprint --repo ../other-checkout # another one (e.g. an older commit)

Two measurements, each in fresh processes of the checkout measured:
- start: a process that does what a front end does before it can serve (import `service.frontend.worker`, read the
  checkpoint's text files, build the HTTP app), timed from the interpreter's start, with its peak resident memory
  (VmHWM) and whether torch is in `sys.modules` at the end; the median of `--repeats` runs;
- serving: `python -m service --workers N` on loopback, once healthy, each front-end process's resident memory
  (VmRSS) and whether torch's library is mapped into it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from devkit.paths import REPO_ROOT
from devkit.server import free_port, stop

# Run with the checkout measured as the current directory; prints one JSON object.
START_PROBE = """
import json, sys, time
from pathlib import Path
started = time.perf_counter()
import service.frontend.worker  # noqa: F401
from service.frontend import runtime as front_end_runtime
from service.frontend.app import create_http_app
from service.settings import Settings
runtime = front_end_runtime.Runtime(Settings(checkpoint=sys.argv[1]), link=None)
# the checkpoint's text files, read as the front end reads them (Runtime.start, through its own import)
runtime.default_model.checkpoint = front_end_runtime.load_checkpoint_files(sys.argv[1])
create_http_app(runtime)
seconds = time.perf_counter() - started
status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
print(json.dumps({"seconds": seconds, "peak_rss_mib": int(status["VmHWM"].split()[0]) / 1024,
                  "torch_imported": "torch" in sys.modules}))
"""

def start_cost(repo: Path, checkpoint: Path, repeats: int) -> dict:
    """The median of `repeats` fresh processes doing a front end's start (START_PROBE)."""
    runs = []
    for _ in range(repeats):
        wall = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", START_PROBE, str(checkpoint)], cwd=repo, capture_output=True,
                              text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"the start probe failed in {repo}: {done.stderr[-2000:]}")
        runs.append({**json.loads(done.stdout.strip().splitlines()[-1]), "process_s": time.perf_counter() - wall})
    return {"seconds_to_app": statistics.median(r["seconds"] for r in runs),
            "seconds_with_interpreter": statistics.median(r["process_s"] for r in runs),
            "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in runs),
            "torch_imported": any(r["torch_imported"] for r in runs), "repeats": repeats}


def front_end_pids(parent: int) -> list[int]:
    """The processes under `parent` started as `python -m service.frontend.worker`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            command = (proc / "cmdline").read_bytes().split(b"\0")
            status = (proc / "status").read_text()
        except OSError:
            continue
        ppid = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:"))
        if b"service.frontend.worker" in command and (ppid == parent or _is_descendant(ppid, parent)):
            found.append(int(proc.name))
    return sorted(found)


def _is_descendant(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
        pid = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:"))
    return False


def serving_cost(repo: Path, checkpoint: Path, workers: int) -> dict:
    """Each front end's resident memory once the service answers /health."""
    port = free_port()
    command = [sys.executable, "-m", "service", "--checkpoint", str(checkpoint), "--port", str(port),
               "--workers", str(workers)]
    process = subprocess.Popen(command, cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None:
                raise RuntimeError(f"{command} exited with {process.returncode}")
            time.sleep(0.2)
        time.sleep(1.0)  # every front end past its start, not only the one that answered
        rows = []
        for pid in front_end_pids(process.pid):
            status = Path(f"/proc/{pid}/status").read_text()
            rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
            maps = Path(f"/proc/{pid}/maps").read_text()
            rows.append({"rss_mib": rss / 1024, "torch_loaded": "libtorch" in maps})
        return {"workers": workers, "front_ends": rows}
    finally:
        stop(process, timeout_s=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.serving.frontend_footprint", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help="the checkout to measure (default: this one)")
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="default: the measured checkout's checkpoints/minilm-wikipedia")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2, help="front ends of the serving measurement (0: skip it)")
    args = parser.parse_args(argv)
    repo = args.repo.resolve()
    checkpoint = (args.checkpoint or repo / "checkpoints" / "minilm-wikipedia").resolve()
    result = {"start": start_cost(repo, checkpoint, args.repeats)}
    if args.workers:
        result["serving"] = serving_cost(repo, checkpoint, args.workers)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
