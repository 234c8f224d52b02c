"""One command that proves the GPU path the day a GPU appears: `python -m bench.gpu` (or `make bench-gpu`).

On a CUDA machine, from a fresh clone, with no network, in under 10 minutes:
1. the GPU-marked tests (tests/gpu: the service's engine against transformers in float32, bfloat16 and float16
   for every head, packed == padded, batched == single) on the GPU;
2. the service against the in-process limit on the GPU (bench.serving: the same ratio as on CPU);
3. the trainer's tokens/s and MFU (model FLOPs over the peak this GPU measured on a large bf16 matmul), with
   torch.compile, and DistributedDataParallel over NCCL when there are two GPUs;
then one JSON and one Markdown summary in --out.

It uses the torch it finds (2.1 or newer: SDPA and torch.compile; 2.13 is what the project pins). Such a machine
usually lacks FastAPI and uvicorn: `make gpu-wheels` downloads them (and the rest of what the service needs
beyond torch, numpy, transformers, tokenizers, safetensors and httpx) into .whl/gpu beforehand; this script
installs them from there into .venv-gpu (a venv that sees the machine's own torch) and re-runs itself in it.

`--dry-run` runs every step on the CPU with small sizes, so that the path is exercised by the test suite.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from devkit.paths import REPO_ROOT, WIKITEXT_DIR

WHEELS = REPO_ROOT / ".whl" / "gpu"
GPU_VENV = REPO_ROOT / ".venv-gpu"
SERVICE_MODULES = ("fastapi", "uvicorn", "pydantic_settings", "orjson", "prometheus_client", "fastapi_offline")
MIN_TORCH = (2, 1)


def ensure_service_packages(args) -> None:
    """Re-run inside .venv-gpu with the downloaded wheels when the service's packages are missing."""
    missing = [m for m in SERVICE_MODULES if importlib.util.find_spec(m) is None]
    if not missing:
        return
    if not WHEELS.is_dir():
        sys.exit(f"error: the service needs {missing}; run `make gpu-wheels` on a machine with a network first "
                 f"(it fills {WHEELS.relative_to(REPO_ROOT)})")
    if Path(sys.prefix) == GPU_VENV:
        sys.exit(f"error: {missing} still missing in {GPU_VENV}: are the wheels in {WHEELS} complete?")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(GPU_VENV)], check=True)
    python = GPU_VENV / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--find-links", str(WHEELS),
                    *sorted(p.name for p in WHEELS.glob("*.whl"))], check=True, cwd=WHEELS)
    os.execv(str(python), [str(python), "-m", "bench.gpu", *sys.argv[1:]])


def environment(device: str) -> dict:
    import torch

    facts = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
             "device": device, "host": platform.node()}
    for name in ("transformers", "tokenizers", "safetensors", "httpx", "fastapi", "uvicorn"):
        spec = importlib.util.find_spec(name)
        facts[name] = __import__(name).__version__ if spec else None
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        facts.update(gpu=props.name, gpus=torch.cuda.device_count(), memory_gib=round(props.total_memory / 2**30, 1),
                     capability=f"{props.major}.{props.minor}", bf16=torch.cuda.is_bf16_supported())
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    if version < MIN_TORCH:
        sys.exit(f"error: torch {torch.__version__} is older than {'.'.join(map(str, MIN_TORCH))} (SDPA, compile)")
    return facts


def gpu_tests(device: str, work: Path) -> dict:
    report = work / "gpu-tests.xml"
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "tests/gpu",
                             f"--junitxml={report}"], cwd=REPO_ROOT, capture_output=True, text=True,
                            env={**os.environ, "BERT_TEST_DEVICE": device})
    suite = ElementTree.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    failed = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None or c.find("error") is not None]
    return {**counts, "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
            "failed_tests": failed, "seconds": round(time.perf_counter() - started, 1), "exit_code": result.returncode,
            "output_tail": result.stdout[-1500:] if result.returncode else ""}


def serving(work: Path, dry_run: bool) -> dict:
    rows_file = work / "serving.json"
    command = [sys.executable, "-m", "bench.serving",  # the bundled model (bench.serving's default)
               "--concurrency", *(["4"] if dry_run else ["16", "64"]), "--inputs-per-request", "8",
               "--duration", "1" if dry_run else "15", "--sentences", "64" if dry_run else "2000",
               "--systems", "service", "--json", str(rows_file), *(["--batch-sizes", "1", "16"] if dry_run else [])]
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    if result.returncode:
        return {"error": result.stderr[-1500:]}
    rows = json.loads(rows_file.read_text())
    limit = rows[0]
    return {"limit_sequences_per_s": limit["sequences_per_s"], "limit_batch": limit["mean_batch"],
            "service": [{"concurrency": r["concurrency"], "sequences_per_s": r["sequences_per_s"],
                         "p50_ms": r["p50_ms"], "p99_ms": r["p99_ms"], "vs_limit": r["vs_limit"]} for r in rows[1:]]}


def matmul_peak_tflops(device: str, dry_run: bool) -> float:
    """The best bf16 (CPU: float32) matmul rate this device reaches: the denominator of MFU."""
    import torch

    size = 1024 if dry_run else 8192
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(3 if dry_run else 10):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        started = time.perf_counter()
        a @ b
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best / 1e12


def training(device: str, work: Path, dry_run: bool, peak: float) -> dict:
    from model.config import BertConfig
    from model.flops import model_flops_per_token

    steps, batch, preset, vocab = (4, 8, "tiny", 600) if dry_run else (300, 128, "mini", 8192)
    corpus, held_out = WIKITEXT_DIR / "wiki.valid.tokens", WIKITEXT_DIR / "wiki.test.tokens"
    if dry_run:  # the first articles only: the same steps in seconds
        corpus, held_out = work / "train.tokens", work / "eval.tokens"
        for source, target in ((WIKITEXT_DIR / "wiki.valid.tokens", corpus), (WIKITEXT_DIR / "wiki.test.tokens", held_out)):
            target.write_text("".join(source.read_text(encoding="utf-8").splitlines(keepends=True)[:300]))
    runs = {"single": ["--device", device] + ([] if dry_run else ["--compile"])}
    import torch

    if device.startswith("cuda") and torch.cuda.device_count() >= 2:
        runs["ddp-nccl-2"] = ["--device", "cuda"]
    results = {}
    for name, flags in runs.items():
        output = work / f"train-{name}"
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"] if name.startswith("ddp") \
            else [sys.executable]
        command = [*launcher, "-m", "trainer", "--corpus", str(corpus), "--eval-corpus", str(held_out),
                   "--output", str(output), "--preset", preset, "--max-seq-len", "64" if dry_run else "128",
                   "--vocab-size", str(vocab), "--batch-size", str(batch), "--max-steps", str(steps), "--eval-every",
                   str(steps), "--eval-examples", "64", "--log-every", "2", "--no-progress", "--cache-dir",
                   str(work / "cache"), *flags]
        result = subprocess.run(command, cwd=REPO_ROOT if launcher[0] == sys.executable else None,
                                capture_output=True, text=True)
        if result.returncode:
            results[name] = {"error": result.stderr[-1500:]}
            continue
        rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
        speeds = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r][len(rows) // 4 or 1:]  # past compile/warm-up
        tokens_per_s = sum(speeds) / max(len(speeds), 1)
        config = BertConfig.preset(preset, vocab_size=vocab)
        model_tflops = tokens_per_s * 3 * model_flops_per_token(config, 64 if dry_run else 128, 0.15) / 1e12
        results[name] = {"tokens_per_s": round(tokens_per_s, 1), "model_tflops": round(model_tflops, 3),
                         "mfu_vs_measured_peak": round(model_tflops / peak, 4), "steps": steps, "batch": batch,
                         "preset": preset, "flags": flags}
    return results


def markdown(summary: dict) -> str:
    env, tests = summary["environment"], summary["gpu_tests"]
    lines = [f"# GPU path check ({'dry run on CPU' if summary['dry_run'] else env.get('gpu', env['device'])})", "",
             f"`{summary['command']}`, {summary['date']}, {summary['seconds']:.0f} s in all.", "",
             "| what | value |", "| --- | --- |"]
    lines += [f"| {key} | {value} |" for key, value in env.items()]
    lines += [f"| GPU-marked tests | {tests['passed']} passed, {tests['failures'] + tests['errors']} failed, "
              f"{tests['skipped']} skipped ({tests['seconds']} s) |"]
    serve = summary["serving"]
    if "error" in serve:
        lines.append(f"| serving | failed: {serve['error'][-200:]!r} |")
    else:
        lines.append(f"| in-process limit | {serve['limit_sequences_per_s']:.1f} seq/s (batch {serve['limit_batch']}) |")
        lines += [f"| service, concurrency {r['concurrency']} | {r['sequences_per_s']:.1f} seq/s = {r['vs_limit']:.2f}x "
                  f"the limit, p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms |" for r in serve["service"]]
    lines.append(f"| measured matmul peak | {summary['matmul_peak_tflops']:.1f} TFLOP/s |")
    for name, run in summary["training"].items():
        lines.append(f"| training ({name}) | " + (f"failed: {run['error'][-200:]!r}" if "error" in run else
                     f"{run['tokens_per_s']:,.0f} tokens/s, {run['model_tflops']:.2f} TFLOP/s, MFU "
                     f"{run['mfu_vs_measured_peak']:.1%} of the measured peak ({run['preset']}, batch {run['batch']})")
                     + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="every step on the CPU, small sizes (for the tests)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "runs" / "gpu")
    args = parser.parse_args(argv)
    ensure_service_packages(args)
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("error: no CUDA device; use --dry-run to exercise the same steps on the CPU", file=sys.stderr)
        return 2
    device = "cpu" if args.dry_run else "cuda"
    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as scratch:
        work = Path(scratch)
        summary = {"dry_run": args.dry_run, "command": " ".join(["python -m bench.gpu", *sys.argv[1:]]),
                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "environment": environment(device)}
        steps = {"gpu_tests": lambda: gpu_tests(device, work), "serving": lambda: serving(work, args.dry_run),
                 "matmul_peak_tflops": lambda: matmul_peak_tflops(device, args.dry_run),
                 "training": lambda: training(device, work, args.dry_run, summary["matmul_peak_tflops"])}
        summary["step_seconds"] = {}
        for name, step in steps.items():
            step_started = time.perf_counter()
            summary[name] = step()
            summary["step_seconds"][name] = round(time.perf_counter() - step_started, 1)
    summary["seconds"] = time.perf_counter() - started
    (args.out / "gpu-summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (args.out / "gpu-summary.md").write_text(markdown(summary))
    print(markdown(summary))
    tests = summary["gpu_tests"]
    broken = tests["failures"] + tests["errors"] or "error" in summary["serving"] or \
        any("error" in run for run in summary["training"].values())
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
