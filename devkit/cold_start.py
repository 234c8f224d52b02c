"""Cold start of the CPU image, as a Kubernetes pod would start: `docker run` with the chart's pod security
(read-only root filesystem, scratch volumes for /tmp and /cache, no capabilities, no privilege escalation,
the image's unprivileged user), then the time until the process answers /live (imports done: what the
startup probe waits for) and until /health answers 200 (model loaded and warmed: readiness, when the pod
joins the Service). The server's own log line says how long loading took inside the process.

    python -m devkit.cold_start --runs 3     # after make test-docker has built bert-serve:0.1.0-cpu
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time

import httpx

IMAGE = "bert-serve:0.1.0-cpu"
POD_SECURITY = ["--read-only", "--tmpfs", "/tmp", "--tmpfs", "/cache", "--cap-drop", "ALL",
                "--security-opt", "no-new-privileges", "--user", "10001:10001"]


def first_ok(url: str, started: float, timeout_s: float) -> float:
    while time.perf_counter() - started < timeout_s:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return time.perf_counter() - started
        except httpx.TransportError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"{url} not 200 within {timeout_s:.0f} s")


def one_start(dtype: str, port: int = 8011, timeout_s: float = 120) -> dict:
    name = f"bert-cold-start-{dtype}"
    subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    started = time.perf_counter()
    subprocess.run(["docker", "run", "-d", "--name", name, *POD_SECURITY, "-p", f"{port}:8000", "-e",
                    f"BERT_DTYPE={dtype}", IMAGE], check=True, capture_output=True)
    try:
        live = first_ok(f"http://127.0.0.1:{port}/live", started, timeout_s)
        ready = first_ok(f"http://127.0.0.1:{port}/health", started, timeout_s)
        logs = subprocess.run(["docker", "logs", name], capture_output=True, text=True)
        loaded = re.search(r"ready in ([0-9.]+) s", logs.stdout + logs.stderr)
        return {"live_s": round(live, 2), "healthy_s": round(ready, 2),
                "server_load_s": float(loaded.group(1)) if loaded else None}
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


def measure(runs: int) -> dict:
    out = {}
    for dtype in ("float32", "int8"):
        starts = [one_start(dtype) for _ in range(runs)]
        out[dtype] = {"runs": starts, **{f"median_{k}": statistics.median(s[k] for s in starts)
                                         for k in ("live_s", "healthy_s", "server_load_s")}}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    print(json.dumps(measure(parser.parse_args(argv).runs), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
