"""The Kubernetes chart as the tests render it (tests/test_helm_chart.py, tests/test_helm_chart_jobs.py): the real
`helm`, the renders that together reach every template branch, and what the tests read off them.

The tools come from requirements/deploy-tools.txt (`make test` installs them into .venv-deploy); without them the
tests that import this module skip, unless BERT_REQUIRE_DEPLOY_TOOLS=1 (as `make test` sets) makes their absence a
failure."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from devkit.paths import REPO_ROOT

CHART = REPO_ROOT / "deploy" / "helm" / "bert-serve"
ADAPTER = REPO_ROOT / "deploy" / "helm" / "prometheus-adapter-values.yaml"
K8S_VERSIONS = ("1.29.0", "1.37.0")  # Chart.yaml's kubeVersion floor, and the newest schemas the validator has
DIGEST = "sha256:" + "0123456789abcdef" * 4
# What checkov still reports on a chart rendered without an image digest, and why that is accepted: the
# image is built from this repository and has no registry digest until it is pushed; image.digest pins it
# (and with it, checkov's pull-policy check passes too, as the digest render below shows).
JUSTIFIED_WITHOUT_DIGEST = {"CKV_K8S_43", "CKV_K8S_15"}


def tool(name: str) -> str | None:
    folder = os.environ.get("BERT_DEPLOY_BIN")
    found = shutil.which(name, path=folder) if folder else None
    return found or shutil.which(name)


HELM, VALIDATE, CHECKOV = tool("helm"), tool("kubernetes-validate"), tool("checkov")
if not (HELM and VALIDATE and CHECKOV):
    missing = [n for n, t in (("helm", HELM), ("kubernetes-validate", VALIDATE), ("checkov", CHECKOV)) if not t]
    if os.environ.get("BERT_REQUIRE_DEPLOY_TOOLS") == "1":
        raise RuntimeError(f"BERT_REQUIRE_DEPLOY_TOOLS=1 but {', '.join(missing)} not found (make test installs "
                           "them into .venv-deploy from requirements/deploy-tools.txt)")
    pytest.skip(f"{', '.join(missing)} not installed (requirements/deploy-tools.txt)", allow_module_level=True)

HUB_ID = "BAAI/bge-small-en-v1.5"
TRAINING = ["--set", "training.job.enabled=true", "--set", "training.distributed.enabled=true"]
RENDERS = {  # name: values files and --set flags; together they reach every template branch
    "cpu": ["-f", f"{CHART}/values-cpu.yaml"],
    "gpu": ["-f", f"{CHART}/values-gpu.yaml", *TRAINING],
    "cpu-pvc-key": ["-f", f"{CHART}/values-cpu.yaml", "--set", "model.source=pvc", "--set", "model.pvc.create=true",
                    "--set", "apiKey.create=true", "--set", "apiKey.value=a-long-secret", *TRAINING],
    "cpu-init": ["-f", f"{CHART}/values-cpu.yaml", "--set", "model.source=init", "--set", "model.init.image=models:1",
                 "--set-json", 'model.init.command=["cp", "-r", "/model/.", "/models/"]',
                 "--set", "autoscaling.enabled=false", "--set", "apiKey.existingSecret=bert-key"],
    "cpu-hub": ["-f", f"{CHART}/values-cpu.yaml", "--set", "model.source=hub", "--set", f"model.hub.id={HUB_ID}",
                "--set", "model.hub.revision=v1.0", "--set", "model.hub.tokenSecret=hf-token"],
    "gpu-hub-offline": ["-f", f"{CHART}/values-gpu.yaml", "--set", "model.source=hub", "--set", f"model.hub.id={HUB_ID}",
                        "--set", "model.hub.cache.claimName=hf-cache", "--set", "model.hub.offline=true"],
    "cpu-hub-models": ["-f", f"{CHART}/values-cpu.yaml", "--set", "model.source=hub", "--set", f"model.hub.id={HUB_ID}",
                       "--set", "model.hub.revision=v1.0", "--set", "model.name=embed", "--set-json",
                       'models=[{"name": "rerank", "checkpoint": "BAAI/bge-reranker-base@main", "dtype": "float32", '
                       '"weight": 2}, {"name": "mlm", "checkpoint": "/app/checkpoints/minilm-wikipedia", '
                       '"rootTask": "fill-mask"}]'],
    "cpu-corpus-s3": ["-f", f"{CHART}/values-cpu.yaml", "--set", "corpus.enabled=true",
                      "--set", "corpus.input=s3://docs/in/", "--set", "corpus.output=s3://docs/vectors",
                      "--set", "corpus.s3.endpoint=http://minio.storage:9000", "--set", "corpus.s3.credentialsSecret=s3",
                      "--set-json", 'corpus.args=["--id-column", "doc_id", "--dtype", "int8"]'],
    "gpu-corpus-pvc": ["-f", f"{CHART}/values-gpu.yaml", "--set", "corpus.enabled=true",
                       "--set", "corpus.input=/data/docs.jsonl", "--set", "corpus.output=/data/vectors",
                       "--set", "corpus.storage.claimName=corpus-data", "--set", f"corpus.checkpoint={HUB_ID}"],
}


def helm_template(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([HELM, "template", "bert", str(CHART), "--namespace", "bert", *args],
                          capture_output=True, text=True)


def render(*args: str) -> list[dict]:
    done = helm_template(*args)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@functools.cache
def _render_all() -> dict[str, tuple[Path, list[dict]]]:
    folder = Path(tempfile.mkdtemp(prefix="helm-rendered-"))
    out = {}
    for name, args in RENDERS.items():
        done = helm_template(*args)
        assert done.returncode == 0, f"{name}: {done.stderr}"
        path = folder / f"{name}.yaml"
        path.write_text(done.stdout)
        out[name] = (path, [doc for doc in yaml.safe_load_all(done.stdout) if doc])
    return out


@pytest.fixture(scope="module")
def rendered() -> dict[str, tuple[Path, list[dict]]]:
    """Every render of RENDERS, made once a session: name -> (its file, its objects)."""
    return _render_all()


def find(docs: list[dict], kind: str, suffix: str = "") -> dict:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    assert len(matches) == 1, (kind, suffix, [d["metadata"]["name"] for d in matches])
    return matches[0]


def api_container(docs: list[dict]) -> dict:
    return find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container["env"]}
