"""The deployment, run for real against a Docker engine (`make test-docker`; minutes and GBs, not in CI).

1. Builds the images (CPU; CUDA too with --cuda), says their sizes, and checks that `pip freeze` inside
   each equals its lock.
2. `docker compose -f docker-compose.yml -f docker-compose.cpu.yml up`: healthy, and /encode, /fill-mask,
   /nsp answer; then `docker stop` under load: exit 0, and the server answered every request it accepted.
   The same compose file with two models (BERT_CHECKPOINT naming both, BERT_MODEL_SETTING one's own root task):
   /v1/models lists both, the OpenAI `model` field and /models/NAME/... reach each, and /info says each one's
   settings; `--models-only` builds the CPU image and runs this part alone.
3. The scale profile with 3 replicas behind nginx: `--scale api-replica=4` and the new replica gets traffic;
   then the fault drills under load (devkit/fault_drills.py: graceful stop, kill -9, scale 3 -> 4 -> 3,
   balancer reloads; then with BERT_WORKERS=2 graceful stop, kill -9 of a front-end process and of the engine
   process inside a replica; each --drills times, every request counted): nothing may be lost, and each
   replica must do what docs/processes.md says (its facts' "ok").
4. Cold start of the CPU image with the Kubernetes chart's pod security, float32 and int8 (devkit/cold_start.py).
5. The corpus job in the CPU image and its Ray variant: alone, with --ray, to an S3-compatible server, and on the
   compose profile's two-container Ray cluster (devkit/corpus_drill.py); `--corpus-only` builds those two images
   and runs this part alone.
Right after the build: the CPU image's C kernels, loaded from where its build stage put them (the image has no
compiler), under the chart's pod security; `--image-only` stops there.

    python -m devkit.docker_check [--cuda] [--image-only | --corpus-only | --models-only] [--drills 3] [--build-arg NAME=VALUE ...]

Build arguments pass through to `docker build` (on machines whose package index is not PyPI:
PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS, PIP_TRUSTED_HOST, TORCH_CPU_INDEX).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time

import httpx

from devkit import cold_start, corpus_drill, fault_drills
from devkit.paths import REPO_ROOT
from kernels.build import KERNELS

CPU_COMPOSE = ["docker", "compose", "-f", "docker-compose.yml", "-f", "docker-compose.cpu.yml"]
IMAGES = {"cpu": "bert-serve:0.1.0-cpu", "cuda": "bert-serve:0.1.0", "cpu-ray": "bert-serve:0.1.0-cpu-ray"}


def sh(*command: str, check: bool = True, capture: bool = True) -> str:
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=capture, text=True)
    if check and done.returncode != 0:
        raise SystemExit(f"$ {' '.join(command)}\n{done.stdout}\n{done.stderr}")
    return done.stdout if capture else ""


def pins(lock_file: str) -> list[str]:
    return [line for line in (REPO_ROOT / lock_file).read_text().splitlines()
            if line and not line.startswith(("#", "-r "))]


def build(variant: str, build_args: list[str]) -> dict:
    """`variant` is cpu, cuda or cpu-ray (the CPU image built with RAY=1)."""
    base, ray = variant.removesuffix("-ray"), variant.endswith("-ray")
    args = [f"--build-arg=VARIANT={base}", f"--build-arg=RAY={int(ray)}"] + [f"--build-arg={a}" for a in build_args]
    started = time.perf_counter()
    sh("docker", "build", "--network", "host", *args, "-t", IMAGES[variant], ".", capture=False)
    size = int(sh("docker", "image", "inspect", "-f", "{{.Size}}", IMAGES[variant]).strip())
    frozen = sh("docker", "run", "--rm", "--entrypoint", "pip", IMAGES[variant], "freeze", "--all", "--exclude", "pip")
    lock = pins("requirements/serve.txt" if base == "cpu" else "requirements/image-cuda.txt")
    if base == "cpu":  # the CPU image installs the same torch release from PyTorch's CPU index
        lock = [re.sub(r"^torch==([^+]+)$", r"torch==\1+cpu", line) for line in lock]
    if ray:  # pip freeze names an extra's package without the extra
        lock += [re.sub(r"\[[^]]*\]", "", line) for line in pins("requirements/ray.txt")]
    installed = set(frozen.split())
    return {"image": IMAGES[variant], "size_gb": round(size / 1e9, 2), "build_s": round(time.perf_counter() - started),
            "packages": len(installed), "freeze_equals_lock": installed == set(lock),
            "missing_from_image": sorted(set(lock) - installed), "not_in_lock": sorted(installed - set(lock))}


def container_logs(container: str) -> str:
    done = subprocess.run(["docker", "logs", container], capture_output=True, text=True)
    return done.stdout + done.stderr


def wait_healthy(url: str, timeout_s: float = 180) -> float:
    started = time.perf_counter()
    while time.perf_counter() - started < timeout_s:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return time.perf_counter() - started
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} did not become healthy within {timeout_s:.0f} s")


def wait_docker_healthy(container: str, timeout_s: float = 120) -> str:
    """The compose healthcheck's verdict (`bert health` inside the container), once it has one."""
    deadline = time.perf_counter() + timeout_s
    status = ""
    while time.perf_counter() < deadline:
        status = sh("docker", "inspect", "-f", "{{.State.Health.Status}}", container).strip()
        if status != "starting":
            break
        time.sleep(1)
    return status


def check_routes(url: str) -> dict:
    with httpx.Client(base_url=url, timeout=30) as client:
        encode = client.post("/encode", json={"inputs": "a crane is flying", "pooling": "mean"})
        fill = client.post("/fill-mask", json={"inputs": "the capital of france is [MASK] ."})
        nsp = client.post("/nsp", json={"inputs": ["the storm moved north .", "it weakened over land ."]})
    return {"encode": encode.status_code, "fill_mask": fill.status_code, "nsp": nsp.status_code,
            "fill_mask_top": fill.json()["results"][0]["masks"][0]["predictions"][0]["token_str"]}


def compose_single() -> dict:
    url = "http://127.0.0.1:8000"
    sh(*CPU_COMPOSE, "up", "-d")
    try:
        result = {"healthy_after_s": round(wait_healthy(url), 1), "routes": check_routes(url)}
        container = sh(*CPU_COMPOSE, "ps", "-q", "api").strip()
        result["docker_health"] = wait_docker_healthy(container)
        outcomes, _, _ = asyncio.run(fault_drills.drive(lambda: sh("docker", "stop", container), seconds=12, url=url,
                                                        clients=16, event_at=4))
        logs = container_logs(container)
        answered = re.findall(r"answered (\d+) of (\d+) accepted", logs)
        exit_code = int(sh("docker", "inspect", "-f", "{{.State.ExitCode}}", container).strip())
        result["stop_under_load"] = {"exit_code": exit_code, "client_outcomes": dict(outcomes),
                                     "server_answered_of_accepted": answered[-1] if answered else None,
                                     "traceback_in_log": "Traceback" in logs}
        return result
    finally:
        sh(*CPU_COMPOSE, "down", "-v")


# Two models from what the image ships: the bundled model as the embedder (the default) and again as a fill-mask
# model in float32 (its own root task and precision), as a deployment of an embedder and a reranker would set them.
TWO_MODELS = {"BERT_CHECKPOINT": "embed=/app/checkpoints/minilm-wikipedia,mlm=/app/checkpoints/minilm-wikipedia",
              "BERT_MODEL_SETTING": "mlm:root_task=fill-mask,mlm:dtype=float32"}


def compose_two_models() -> dict:
    url = "http://127.0.0.1:8000"
    env = {**os.environ, **TWO_MODELS}
    subprocess.run([*CPU_COMPOSE, "up", "-d"], cwd=REPO_ROOT, env=env, check=True, capture_output=True)
    try:
        result = {"healthy_after_s": round(wait_healthy(url), 1)}
        with httpx.Client(base_url=url, timeout=60) as client:
            listed = client.get("/v1/models").json()
            by_field = client.post("/v1/embeddings", json={"model": "mlm", "input": "a crane is flying"})
            default = client.post("/v1/embeddings", json={"input": "a crane is flying"})
            prefixed = client.post("/models/mlm/encode", json={"inputs": "a crane is flying", "pooling": "mean"})
            root = client.post("/models/mlm", json={"inputs": "the capital of france is [MASK] ."})
            unknown = client.post("/v1/embeddings", json={"model": "nope", "input": "a crane"})
            info = client.get("/info").json()
        result.update({
            "models_listed": [m["id"] for m in listed["data"]],
            "embeddings_by_model_field": by_field.status_code, "embeddings_default": default.status_code,
            "prefixed_encode": prefixed.status_code, "prefixed_root_task": root.status_code,
            "root_task_answer_is_fill_mask": root.status_code == 200 and "token_str" in root.text,
            "unknown_model": unknown.status_code,
            "info_models": {m["name"]: {"dtype": m.get("dtype"), "root_task": m.get("root_task")}
                            for m in info.get("models", [])}})
        ok = (result["models_listed"] == ["embed", "mlm"]
              and {by_field.status_code, default.status_code, prefixed.status_code, root.status_code} == {200}
              and result["root_task_answer_is_fill_mask"] and unknown.status_code == 404
              and result["info_models"].get("mlm", {}).get("dtype") == "float32")
        result["ok"] = ok
        return result
    finally:
        subprocess.run([*CPU_COMPOSE, "down", "-v"], cwd=REPO_ROOT, env=env, capture_output=True)


def compose_scale() -> dict:
    url = "http://127.0.0.1:8080"
    scale = [*CPU_COMPOSE, "--profile", "scale"]
    sh(*scale, "up", "-d", "--scale", "api-replica=3")
    try:
        result = {"services": sh(*scale, "ps", "--format", "{{.Service}}").split()}
        result["healthy_after_s"] = round(wait_healthy(url), 1)
        replicas = sh(*scale, "ps", "-q", "api-replica").split()
        # A replica added later is seen by the load balancer and gets traffic.
        sh(*scale, "up", "-d", "--no-recreate", "--scale", "api-replica=4")
        time.sleep(12)
        added = sorted(set(sh(*scale, "ps", "-q", "api-replica").split()) - set(replicas))
        asyncio.run(fault_drills.drive(seconds=6, url=url, clients=8))
        served = [_requests_served(container) for container in added]
        result["scaled_to_4"] = {"new_replicas": len(added), "requests_served_by_new": served,
                                 "lb_log": [line for line in sh(*scale, "logs", "lb").splitlines() if "bert-lb:" in line]}
        return result
    finally:
        sh(*scale, "down", "-v")


# Run inside the image: what its int8 layers run, and where its C kernels came from.
KERNELS_PROBE = """
import json
from kernels import build, int8_path
path = int8_path.describe()
built = {str(d): sorted(p.name for p in d.glob("*.so")) for d in build.kernel_directories() if d.is_dir()}
print(json.dumps({"int8_path": path, "identity": int8_path.int8_path_identity(), "built": built}))
"""


def kernels_in_image(image: str) -> dict:
    """The image's kernels, with the chart's pod security: every one of kernels.build.KERNELS prebuilt in
    /opt/kernels, none built at start (there is no compiler to build them), and each int8 layer one C call where the
    CPU has the features."""
    found = json.loads(sh("docker", "run", "--rm", *cold_start.POD_SECURITY, "--entrypoint", "python", image, "-c",
                          KERNELS_PROBE).strip().splitlines()[-1])
    prebuilt = sorted(name.split("-")[0] for name in found["built"].pop("/opt/kernels", []))
    runs = found["int8_path"].startswith("each layer in one C call") or "this CPU lacks" in found["int8_path"]
    found["ok"] = prebuilt == sorted(source.removesuffix(".c") for source in KERNELS) and \
        not any(found["built"].values()) and runs
    return found


def _requests_served(container: str) -> int:
    """POST /encode requests a replica answered 200, from its own /metrics."""
    metrics = sh("docker", "exec", container, "python", "-c",
                 "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8000/metrics').read().decode())")
    match = re.search(r'^bert_requests_total\{route="/encode",status="200"\} ([0-9.e+]+)$', metrics, re.MULTILINE)
    return int(float(match.group(1))) if match else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cuda", action="store_true", help="also build the CUDA image (downloads ~5 GB)")
    parser.add_argument("--build-arg", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--drills", type=int, default=3, help="times each fault drill is repeated")
    parser.add_argument("--corpus-only", action="store_true",
                        help="build the CPU image and its Ray variant, and run the corpus drill only")
    parser.add_argument("--models-only", action="store_true",
                        help="build the CPU image and run compose with two models only")
    parser.add_argument("--image-only", action="store_true", help="build the images and check their kernels only")
    args = parser.parse_args(argv)
    if args.corpus_only:
        report = {"images": [build("cpu", args.build_arg), build("cpu-ray", args.build_arg)],
                  "corpus": corpus_drill.run()}
        print(json.dumps(report, indent=1))
        ok = all(i["freeze_equals_lock"] for i in report["images"]) and report["corpus"]["ok"]
        print("test-docker (corpus):", "passed" if ok else "FAILED")
        return 0 if ok else 1
    if args.models_only:
        report = {"images": [build("cpu", args.build_arg)], "compose_two_models": compose_two_models()}
        print(json.dumps(report, indent=1))
        ok = report["images"][0]["freeze_equals_lock"] and report["compose_two_models"]["ok"]
        print("test-docker (two models):", "passed" if ok else "FAILED")
        return 0 if ok else 1
    report = {"images": [build("cpu", args.build_arg), build("cpu-ray", args.build_arg)]
              + ([build("cuda", args.build_arg)] if args.cuda else [])}
    report["kernels_cpu"] = kernels_in_image(IMAGES["cpu"])
    if args.image_only:
        print(json.dumps(report, indent=1))
        ok = all(i["freeze_equals_lock"] for i in report["images"]) and report["kernels_cpu"]["ok"]
        print("test-docker (images):", "passed" if ok else "FAILED")
        return 0 if ok else 1
    report["compose_cpu"] = compose_single()
    report["compose_two_models_cpu"] = compose_two_models()
    report["compose_scale_cpu"] = compose_scale()
    drills = fault_drills.run_drills(args.drills)
    report["fault_drills"] = [vars(d) for d in drills]
    report["cold_start"] = cold_start.measure(runs=3)
    report["corpus"] = corpus_drill.run()
    print(json.dumps(report, indent=1))
    print(fault_drills.table(drills))
    images_ok = all(i["freeze_equals_lock"] for i in report["images"])
    single = report["compose_cpu"]
    stop = single["stop_under_load"]
    answered = stop["server_answered_of_accepted"]
    ok = (images_ok and report["kernels_cpu"]["ok"]
          and set(single["routes"].values()) - {single["routes"]["fill_mask_top"]} == {200}
          and single["docker_health"] == "healthy" and stop["exit_code"] == 0 and answered and answered[0] == answered[1]
          and fault_drills.passed(drills)
          and all(n > 0 for n in report["compose_scale_cpu"]["scaled_to_4"]["requests_served_by_new"])
          and report["compose_two_models_cpu"]["ok"]
          and "api" not in report["compose_scale_cpu"]["services"] and report["corpus"]["ok"])
    print("test-docker:", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
