"""What can be checked of the deployment without a Docker engine: the compose file's services, the
Dockerfile's essentials, the entrypoint, and that the README's settings table matches the code."""

from __future__ import annotations

import re
import subprocess
import sys

import yaml

from service.settings import settings_table
from devkit.paths import REPO_ROOT

COMPOSE = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
DOCKERFILE = (REPO_ROOT / "Dockerfile").read_text()


def gpu_reservation(service: dict) -> list:
    return service["deploy"]["resources"]["reservations"]["devices"]


def test_api_service_serves_on_the_gpu_with_health_and_volumes():
    api = COMPOSE["services"]["api"]
    assert "8000:8000" in api["ports"]
    assert "/health" in " ".join(api["healthcheck"]["test"])
    assert api["restart"] in ("unless-stopped", "always")
    assert gpu_reservation(api) == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert {"checkpoints:/checkpoints", "cache:/cache"} <= set(api["volumes"])
    assert set(COMPOSE["volumes"]) == {"checkpoints", "cache"}
    # One environment variable points the API at a trained checkpoint; the default is the bundled model.
    assert api["environment"]["BERT_CHECKPOINT"] == "${BERT_CHECKPOINT:-/app/checkpoints/mini-wikitext2}"
    assert (REPO_ROOT / "checkpoints" / "mini-wikitext2").is_dir()


def test_trainer_is_behind_a_profile_and_writes_into_the_volume():
    trainer = COMPOSE["services"]["trainer"]
    assert trainer["profiles"] == ["train"]
    assert trainer["command"][0] == "train" and "--resume" in trainer["command"]
    output = trainer["command"][trainer["command"].index("--output") + 1]
    assert output.startswith("/checkpoints/") and "checkpoints:/checkpoints" in trainer["volumes"]
    assert gpu_reservation(trainer)


def test_scale_profile_has_replicas_behind_a_load_balancer():
    replica, lb = COMPOSE["services"]["api-replica"], COMPOSE["services"]["lb"]
    assert replica["profiles"] == lb["profiles"] == ["scale"]
    assert replica["deploy"]["replicas"] >= 2 and gpu_reservation(replica)
    assert lb["depends_on"]["api-replica"]["condition"] == "service_healthy"
    nginx = (REPO_ROOT / "docker" / "nginx.conf").read_text()
    assert "server api-replica:8000" in nginx and "proxy_next_upstream" in nginx


def test_dockerfile_essentials():
    lines = [line.strip() for line in DOCKERFILE.splitlines() if line.strip() and not line.startswith("#")]
    base = next(line for line in lines if line.startswith("FROM "))
    assert re.fullmatch(r"FROM python:3\.11\.\d+-slim-bookworm", base)  # pinned, not :latest
    install = next(i for i, line in enumerate(lines) if "pip install" in line)
    first_source_copy = next(i for i, line in enumerate(lines) if line.startswith("COPY service/"))
    assert install < first_source_copy  # dependencies in a layer of their own, before the source
    assert "python -m pip install -r requirements/serve.txt" in lines[install]
    assert "$(PIP) install -r requirements/serve.txt" in (REPO_ROOT / "Makefile").read_text()  # same step as CI
    user = [line for line in lines if line.startswith("USER ")]
    assert user and user[-1] != "USER root"
    assert "EXPOSE 8000" in lines
    assert any(line.startswith("HEALTHCHECK") for line in lines) and "/health" in DOCKERFILE
    assert 'ENTRYPOINT ["bert"]' in lines and 'CMD ["serve"]' in lines
    assert "COPY checkpoints/ checkpoints/" in lines  # the bundled model only; no secrets or other weights
    assert "api_key" not in DOCKERFILE.lower()


def test_entrypoint_runs_the_service_or_the_trainer():
    entrypoint = REPO_ROOT / "docker" / "entrypoint.sh"
    env = {"PATH": f"{sys.executable.rsplit('/', 1)[0]}:/usr/bin:/bin"}
    for command, expected in (("serve", "python -m service"), ("train", "python -m trainer")):
        result = subprocess.run(["sh", str(entrypoint), command, "--help"], cwd=REPO_ROOT, env=env,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert expected in result.stdout


def test_readme_settings_table_matches_the_code():
    assert settings_table() in (REPO_ROOT / "README.md").read_text()
