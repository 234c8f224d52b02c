"""What can be checked of the deployment without a Docker engine: the compose files' services (with
`docker compose config` where the compose plugin is installed, else the YAML), the Dockerfile's essentials,
the locks, the load balancer's retry rules, the entrypoint, and that docs/configuration.md's settings table matches the
code. `make test-docker` (devkit/docker_check.py) runs all of it against a real engine."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest
import yaml

from devkit.paths import REPO_ROOT
from service.settings import DEFAULT_CHECKPOINT, settings_table

COMPOSE = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
DOCKERFILE = (REPO_ROOT / "Dockerfile").read_text()
HAS_COMPOSE = shutil.which("docker") is not None and subprocess.run(
    ["docker", "compose", "version"], capture_output=True).returncode == 0


def gpu_reservation(service: dict) -> list:
    return service["deploy"]["resources"]["reservations"]["devices"]


def compose_config(*args: str) -> dict:
    """The merged configuration as compose itself computes it (no engine needed)."""
    done = subprocess.run(["docker", "compose", *args, "config", "--format", "json"], cwd=REPO_ROOT,
                          capture_output=True, text=True, check=True)
    import json

    return json.loads(done.stdout)


def test_api_service_serves_on_the_gpu_with_health_and_volumes():
    api = COMPOSE["services"]["api"]
    assert "${BERT_PORT:-8000}:${BERT_PORT:-8000}" in api["ports"]
    assert "${BERT_GRPC_PORT:-50051}:${BERT_GRPC_PORT:-50051}" in api["ports"]  # the gRPC API, published too
    assert api["environment"]["BERT_GRPC_PORT"] == "${BERT_GRPC_PORT:-50051}"
    assert api["healthcheck"]["test"] == ["CMD", "bert", "health"]  # follows BERT_PORT inside the container
    assert api["restart"] in ("unless-stopped", "always")
    assert gpu_reservation(api) == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert {"checkpoints:/checkpoints", "cache:/cache"} <= set(api["volumes"])
    assert set(COMPOSE["volumes"]) == {"checkpoints", "cache"}
    # One environment variable points the API at a trained checkpoint; the default is the bundled model.
    assert api["environment"]["BERT_CHECKPOINT"] == f"${{BERT_CHECKPOINT:-/app/checkpoints/{DEFAULT_CHECKPOINT.name}}}"
    assert DEFAULT_CHECKPOINT.parent == REPO_ROOT / "checkpoints" and DEFAULT_CHECKPOINT.is_dir()  # copied into the image
    # A plain `docker compose up` starts the single API (and nothing else): .env enables its profile.
    assert api["profiles"] == ["serve"] and "COMPOSE_PROFILES=serve" in (REPO_ROOT / ".env").read_text()


@pytest.mark.skipif(not HAS_COMPOSE, reason="the docker compose plugin is not installed")
def test_compose_config_gpu_by_default_cpu_with_the_override():
    gpu = compose_config()
    assert set(gpu["services"]) == {"api"}
    assert gpu["services"]["api"]["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    cpu = compose_config("-f", "docker-compose.yml", "-f", "docker-compose.cpu.yml")
    assert "deploy" not in cpu["services"]["api"] and cpu["services"]["api"]["image"].endswith("-cpu")
    assert cpu["services"]["api"]["build"]["args"]["VARIANT"] == "cpu"
    scale = compose_config("-f", "docker-compose.yml", "-f", "docker-compose.cpu.yml", "--profile", "scale")
    assert set(scale["services"]) == {"api-replica", "lb"}  # the scale profile does not also start `api`
    assert not scale["services"]["api-replica"]["deploy"].get("resources")  # no GPU reservation left
    train = compose_config("-f", "docker-compose.yml", "-f", "docker-compose.cpu.yml", "--profile", "train")
    assert set(train["services"]) == {"trainer"} and "deploy" not in train["services"]["trainer"]
    corpus = compose_config("-f", "docker-compose.yml", "-f", "docker-compose.cpu.yml", "--profile", "corpus")
    assert set(corpus["services"]) == {"ray-head", "ray-worker"}
    for node in corpus["services"].values():
        assert "deploy" not in node and node["image"] == "bert-serve:0.1.0-cpu-ray"
        assert node["build"]["args"] == {"VARIANT": "cpu", "RAY": "1"}


def test_cpu_override_drops_every_gpu_reservation():
    override = (REPO_ROOT / "docker-compose.cpu.yml").read_text()
    assert override.count("!reset") == 5 and "VARIANT: cpu" in override
    assert set(yaml.safe_load(re.sub(r"!reset ", "", override))["services"]) == {"api", "trainer", "api-replica",
                                                                                 "ray-head", "ray-worker"}


def test_corpus_profile_is_a_ray_cluster_of_the_ray_image_sharing_one_folder():
    head, worker = COMPOSE["services"]["ray-head"], COMPOSE["services"]["ray-worker"]
    assert head["profiles"] == worker["profiles"] == ["corpus"]
    assert head["image"] == worker["image"] == "bert-serve:0.1.0-ray" and head["build"]["args"]["RAY"] == "1"
    assert head["command"][:3] == ["ray", "start", "--head"] and "--block" in head["command"]
    port = next(a for a in head["command"] if a.startswith("--port=")).split("=")[1]
    assert worker["command"][:2] == ["ray", "start"] and f"--address=ray-head:{port}" in worker["command"]
    data = "${CORPUS_DATA:-./corpus-data}:/data"
    assert data in head["volumes"] and data in worker["volumes"]  # every node sees the job's input and output
    assert "AWS_ACCESS_KEY_ID" in head["environment"] and "AWS_ENDPOINT_URL" in worker["environment"]
    assert gpu_reservation(head) and gpu_reservation(worker)


def test_trainer_is_behind_a_profile_and_writes_into_the_volume():
    trainer = COMPOSE["services"]["trainer"]
    assert trainer["profiles"] == ["train"]
    assert trainer["command"][0] == "train" and "--resume" in trainer["command"]
    output = trainer["command"][trainer["command"].index("--output") + 1]
    assert output.startswith("/checkpoints/") and "checkpoints:/checkpoints" in trainer["volumes"]
    assert gpu_reservation(trainer)
    assert re.fullmatch(r"on-failure:\d+", trainer["restart"])  # bounded: a permanent error does not loop forever


def test_scale_profile_has_replicas_behind_a_retrying_load_balancer():
    replica, lb = COMPOSE["services"]["api-replica"], COMPOSE["services"]["lb"]
    assert replica["profiles"] == lb["profiles"] == ["scale"]
    assert replica["deploy"]["replicas"] >= 2 and gpu_reservation(replica)
    assert lb["depends_on"]["api-replica"]["condition"] == "service_healthy"
    nginx = (REPO_ROOT / "docker" / "nginx.conf").read_text()
    retry = re.search(r"^\s*proxy_next_upstream (.*);", nginx, re.MULTILINE).group(1).split()
    assert {"error", "http_503", "non_idempotent"} <= set(retry)  # POSTs to a draining or dead replica go elsewhere
    assert "include /etc/nginx/bert/replicas.conf;" in nginx and "least_conn;" in nginx
    lb_script = (REPO_ROOT / "docker" / "lb.sh").read_text()
    assert "max_fails=1" in lb_script and "nginx -s reload" in lb_script  # replicas added later are picked up
    # no idle client connections by default: a reload then cannot close one under a request in flight
    directives = [line.split("#")[0].strip() for line in nginx.splitlines()]
    assert "include /etc/nginx/bert/client-keepalive.conf;" in directives
    assert not any(d.startswith("keepalive_timeout") for d in directives)
    assert lb["environment"]["LB_CLIENT_KEEPALIVE"] == "${LB_CLIENT_KEEPALIVE:-0}"
    assert 'KEEPALIVE=${LB_CLIENT_KEEPALIVE:-0}' in lb_script


def test_dockerfile_essentials_and_locks():
    lines = [line.strip() for line in DOCKERFILE.splitlines() if line.strip() and not line.startswith("#")]
    stages = [line for line in lines if line.startswith("FROM ")]
    assert all(re.fullmatch(r"FROM python:3\.11\.\d+-slim-bookworm( AS \w+)?", line) for line in stages)  # pinned
    # the C kernels are built in a stage with a compiler, by kernels/build.py, and the image looks for them there
    assert stages[0].endswith(" AS kernels") and "python -S -m kernels.build" in DOCKERFILE
    assert "COPY kernels/ kernels/" in lines  # the package that loads them
    assert "COPY --from=kernels /opt/kernels/ /opt/kernels/" in lines and "BERT_KERNEL_DIR=/opt/kernels \\" in lines
    assert "ARG VARIANT=cuda" in lines
    install = next(i for i, line in enumerate(lines) if "pip install" in line)
    first_source_copy = next(i for i, line in enumerate(lines) if line.startswith("COPY service/"))
    assert install < first_source_copy  # dependencies in a layer of their own, before the source
    assert "pip install --no-deps -r requirements/image-cuda.txt" in DOCKERFILE  # exactly the lock, nothing resolved
    assert "-r requirements/serve.txt" in DOCKERFILE and "$(PIP) install -r requirements/serve.txt" in (
        REPO_ROOT / "Makefile").read_text()  # the CPU image and `make serve` install the same pins
    user = [line for line in lines if line.startswith("USER ")]
    assert user and user[-1] != "USER root"
    assert "EXPOSE 8000" in lines
    assert 'HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 CMD ["bert", "health"]' in lines
    assert 'ENTRYPOINT ["bert"]' in lines and 'CMD ["serve"]' in lines
    assert "COPY checkpoints/ checkpoints/" in lines  # the bundled model only; no secrets or other weights
    assert "COPY corpus/ corpus/" in lines  # `bert corpus embed`, and a Ray node's code
    # RAY=1 adds requirements/ray.txt's own pins (its `-r serve.txt` line dropped: the variant's lock is in already)
    assert "ARG RAY=0" in lines and "sed '/^-r /d' requirements/ray.txt" in DOCKERFILE
    assert "requirements/ray.txt" in next(line for line in lines if line.startswith("COPY requirements/"))
    assert "api_key" not in DOCKERFILE.lower()
    cuda_lock = (REPO_ROOT / "requirements" / "image-cuda.txt").read_text()
    pinned = [line for line in cuda_lock.splitlines() if line and not line.startswith("#")]
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[^=\s]+", line) for line in pinned)  # every package, exactly
    assert any(line.startswith("nvidia-cudnn") for line in pinned) and any(line.startswith("triton==") for line in pinned)
    serve = {line.split("==")[0] for line in (REPO_ROOT / "requirements" / "serve.txt").read_text().splitlines()
             if "==" in line}
    assert serve <= {line.split("==")[0] for line in pinned}  # the CUDA image holds everything serve.txt pins


def test_entrypoint_runs_the_service_the_trainer_or_the_corpus_job():
    entrypoint = REPO_ROOT / "docker" / "entrypoint.sh"
    env = {"PATH": f"{sys.executable.rsplit('/', 1)[0]}:/usr/bin:/bin"}
    for command, expected in (("serve", "python -m service"), ("train", "python -m trainer"),
                              ("corpus", "python -m corpus")):
        result = subprocess.run(["sh", str(entrypoint), command, "--help"], cwd=REPO_ROOT, env=env,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert expected in result.stdout


def test_entrypoint_health_follows_bert_port(tiny_checkpoint):
    from devkit.server import free_port, start_service

    entrypoint = REPO_ROOT / "docker" / "entrypoint.sh"
    process, url = start_service(tiny_checkpoint)
    try:
        env = {"PATH": f"{sys.executable.rsplit('/', 1)[0]}:/usr/bin:/bin", "BERT_PORT": url.rsplit(":", 1)[1]}
        assert subprocess.run(["sh", str(entrypoint), "health"], env=env, timeout=30).returncode == 0
        env["BERT_PORT"] = str(free_port())  # nothing listens there
        assert subprocess.run(["sh", str(entrypoint), "health"], env=env, capture_output=True, timeout=30).returncode == 1
    finally:
        process.kill()
        process.wait()


def test_the_documented_settings_table_matches_the_code():
    assert settings_table() in (REPO_ROOT / "docs" / "configuration.md").read_text()
def test_hub_models_go_to_one_cache_volume_with_the_token_from_the_environment():
    for name in ("api", "api-replica"):
        env = COMPOSE["services"][name]["environment"]
        assert env["HF_HOME"] == "/cache/huggingface" and "cache:/cache" in COMPOSE["services"][name]["volumes"]
        assert env["HF_TOKEN"] == "${HF_TOKEN:-}" and env["HF_HUB_OFFLINE"] == "${HF_HUB_OFFLINE:-}"
    assert "BERT_CHECKPOINT=BAAI/bge-small-en-v1.5 docker compose up" in (REPO_ROOT / "docker-compose.yml").read_text()
    # the image's default too (the trainer's --init-from, `docker run`), on the volume its user owns
    assert "HF_HOME=/cache/huggingface" in DOCKERFILE and "chown bert:bert /checkpoints /cache" in DOCKERFILE
    assert "HF_HUB_DISABLE_TELEMETRY=1" in DOCKERFILE

