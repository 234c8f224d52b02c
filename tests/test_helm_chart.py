"""The Kubernetes chart, verified without a cluster (none can run here): rendered by the real `helm`, every
object validated against the Kubernetes API schemas of the oldest and newest versions the chart supports
(kubernetes-validate, strict: unknown fields fail), scanned by checkov, and the values that matter checked
against the service itself (probe paths and port, shutdown sizing, GPUs only where asked). Contradicting
values must fail at render time with a message naming the value.
The jobs the chart runs and the autoscaler: tests/test_helm_chart_jobs.py; the renders: tests/helm_chart.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from devkit.paths import REPO_ROOT
from service.settings import Settings
from tests.helm_chart import (CHART, CHECKOV, DIGEST, HELM, HUB_ID, JUSTIFIED_WITHOUT_DIGEST, K8S_VERSIONS, RENDERS,
                              VALIDATE, api_container, env_of, find, helm_template, render, rendered)

__all__ = ["rendered"]  # a fixture, used by name


def test_helm_lint_passes():
    for args in RENDERS.values():
        done = subprocess.run([HELM, "lint", str(CHART), "--strict", *args], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


def test_every_object_validates_against_the_kubernetes_schemas(rendered):
    for version in K8S_VERSIONS:
        for name, (path, docs) in rendered.items():
            done = subprocess.run([VALIDATE, "--strict", "-k", version, str(path)], capture_output=True, text=True)
            assert done.returncode == 0, f"{name} against {version}: {done.stdout}{done.stderr}"
            passed = done.stdout.count(" passed for resource ")
            # every object but the ServiceMonitor (a Prometheus Operator CRD: checked by hand below)
            assert passed == len([d for d in docs if d["kind"] != "ServiceMonitor"]), done.stdout


def test_kinds_each_render_creates(rendered):
    kinds = {name: sorted(d["kind"] for d in docs) for name, (_, docs) in rendered.items()}
    assert kinds["cpu"] == sorted(["Deployment", "Service", "ServiceAccount", "PodDisruptionBudget",
                                   "HorizontalPodAutoscaler", "ServiceMonitor", "NetworkPolicy"])
    assert kinds["gpu"].count("Job") == 2 and kinds["gpu"].count("NetworkPolicy") == 2
    assert "Secret" in kinds["cpu-pvc-key"] and kinds["cpu-pvc-key"].count("PersistentVolumeClaim") == 2
    assert "HorizontalPodAutoscaler" not in kinds["cpu-init"] and "Secret" not in kinds["cpu-init"]
    assert kinds["cpu-corpus-s3"] == sorted(kinds["cpu"] + ["Job", "NetworkPolicy"])  # the job and its policy


def test_probes_and_port_match_the_service(rendered):
    from service.app import create_app

    paths = set(create_app(Settings()).openapi()["paths"])
    for _, docs in rendered.values():
        container = api_container(docs)
        port, grpc_port = container["ports"]
        assert port["name"] == "http" and str(port["containerPort"]) == env_of(container)["BERT_PORT"]
        assert grpc_port["name"] == "grpc" and str(grpc_port["containerPort"]) == env_of(container)["BERT_GRPC_PORT"]
        assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
        assert container["livenessProbe"]["httpGet"] == {"path": "/live", "port": "http"}
        assert container["startupProbe"]["httpGet"]["path"] == "/live"
        assert {"/health", "/live", "/metrics"} <= paths
        service = find(docs, "Service", "serve")
        assert service["spec"]["ports"][0]["targetPort"] == "http"
        monitor = [d for d in docs if d["kind"] == "ServiceMonitor"]
        if monitor:
            endpoint = monitor[0]["spec"]["endpoints"][0]
            assert endpoint["port"] == service["spec"]["ports"][0]["name"] and endpoint["path"] == "/metrics"
            assert monitor[0]["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
        # every BERT_* variable the chart sets is a setting the service knows (HF_* ones are huggingface_hub's)
        known = {f"BERT_{name.upper()}" for name in Settings.model_fields}
        assert set(env_of(container)) <= known | {"HF_HOME", "HF_HUB_OFFLINE"}, set(env_of(container)) - known


def test_grace_period_covers_prestop_drain_and_queue_deadline(rendered):
    for name, (_, docs) in rendered.items():
        pod = find(docs, "Deployment")["spec"]["template"]["spec"]
        container = pod["containers"][0]
        env = env_of(container)
        pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
        needed = pre_stop + float(env["BERT_DRAIN_SECONDS"]) + float(env["BERT_QUEUE_TIMEOUT_S"])
        assert pod["terminationGracePeriodSeconds"] >= needed, name
        assert pre_stop > 0  # endpoints are removed before the server refuses work
    strategy = find(rendered["cpu"][1], "Deployment")["spec"]["strategy"]["rollingUpdate"]
    assert strategy == {"maxSurge": 1, "maxUnavailable": 0}


def test_gpus_only_on_the_gpu_variant(rendered):
    for name, (_, docs) in rendered.items():
        text = yaml.safe_dump_all(docs)
        if name.startswith("gpu"):
            assert api_container(docs)["resources"]["limits"]["nvidia.com/gpu"] == 1
            assert api_container(docs)["image"].endswith(":0.1.0")  # the CUDA image
            for job in (d for d in docs if d["kind"] == "Job"):
                assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] >= 1
        else:
            assert "nvidia.com/gpu" not in text.replace("key: nvidia.com/gpu", ""), name
            assert api_container(docs)["image"].endswith(":0.1.0-cpu")
            assert env_of(api_container(docs))["BERT_DTYPE"] == "int8"


def test_pods_are_locked_down(rendered):
    for name, (_, docs) in rendered.items():
        for workload in (d for d in docs if d["kind"] in ("Deployment", "Job")):
            pod = workload["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == 10001
            assert pod["automountServiceAccountToken"] is False
            for container in pod["containers"] + pod.get("initContainers", []):
                security = container["securityContext"]
                assert security == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}, (name, container["name"])
                assert container["resources"]["limits"]["memory"], (name, container["name"])


def test_model_sources_and_api_key(rendered):
    pvc = api_container(rendered["cpu-pvc-key"][1])
    assert env_of(pvc)["BERT_CHECKPOINT"] == "/models/my-model"
    assert env_of(pvc)["BERT_API_KEY_FILE"] == "/run/secrets/bert/api-key" and "BERT_API_KEY" not in env_of(pvc)
    init_pod = find(rendered["cpu-init"][1], "Deployment")["spec"]["template"]["spec"]
    assert init_pod["initContainers"][0]["command"] == ["cp", "-r", "/model/.", "/models/"]
    assert {"name": "models", "emptyDir": {"sizeLimit": "2Gi"}} in init_pod["volumes"]
    assert "BERT_CHECKPOINT" not in env_of(api_container(rendered["cpu"][1]))  # bundled: the image's default


def test_the_grpc_port_is_served_opened_and_can_be_probed(rendered, tmp_path):
    """server.grpc: the container's second port, BERT_GRPC_PORT, the Service's grpc port and the NetworkPolicy's;
    probes.grpcReadiness asks the gRPC health service instead of /health; off, none of it is there."""
    docs = rendered["cpu"][1]
    service_ports = {p["name"]: p for p in find(docs, "Service")["spec"]["ports"]}
    assert service_ports["grpc"]["targetPort"] == "grpc" and service_ports["grpc"]["appProtocol"] == "grpc"
    assert {"port": "grpc", "protocol": "TCP"} in find(docs, "NetworkPolicy")["spec"]["ingress"][0]["ports"]
    assert Settings(grpc_port=int(env_of(api_container(docs))["BERT_GRPC_PORT"])).grpc_port == 50051
    probed = render("--set", "probes.grpcReadiness=true")
    container = api_container(probed)
    assert container["readinessProbe"]["grpc"] == {"port": 50051, "service": ""}
    assert "httpGet" not in container["readinessProbe"] and container["livenessProbe"]["httpGet"]["path"] == "/live"
    path = tmp_path / "probed.yaml"
    path.write_text(yaml.safe_dump_all(probed))
    for version in K8S_VERSIONS:
        done = subprocess.run([VALIDATE, "--strict", "-k", version, str(path)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    off = render("--set", "server.grpc.enabled=false")
    container = api_container(off)
    assert [p["name"] for p in container["ports"]] == ["http"] and "BERT_GRPC_PORT" not in env_of(container)
    assert [p["name"] for p in find(off, "Service")["spec"]["ports"]] == ["http"]
    assert find(off, "NetworkPolicy")["spec"]["ingress"][0]["ports"] == [{"port": "http", "protocol": "TCP"}]


def test_model_from_the_hub_is_fetched_by_an_init_container_and_served_offline(rendered):
    pod = find(rendered["cpu-hub"][1], "Deployment")["spec"]["template"]["spec"]
    fetch, api = pod["initContainers"][0], pod["containers"][0]
    assert fetch["image"] == api["image"] and fetch["args"] == ["python", "-m", "model.hub", f"{HUB_ID}@v1.0"]
    # the token reaches the init container only, as a file (huggingface_hub reads HF_TOKEN_PATH)
    assert env_of(fetch) == {"HF_HOME": "/cache/huggingface", "HF_TOKEN_PATH": "/run/secrets/hf/token"}
    assert {"name": "hf-token", "mountPath": "/run/secrets/hf", "readOnly": True} in fetch["volumeMounts"]
    assert not any(m["name"] == "hf-token" for m in api["volumeMounts"])
    env = env_of(api)
    assert env["BERT_CHECKPOINT"] == f"{HUB_ID}@v1.0" and env["HF_HUB_OFFLINE"] == "1"
    assert env["HF_HOME"] == "/cache/huggingface" and "HF_TOKEN" not in env and "HF_TOKEN_PATH" not in env
    assert {"name": "hf-cache", "mountPath": "/cache/huggingface", "readOnly": True} in api["volumeMounts"]
    assert {"name": "hf-cache", "emptyDir": {"sizeLimit": "2Gi"}} in pod["volumes"]
    secret = next(v for v in pod["volumes"] if v["name"] == "hf-token")["secret"]
    assert secret["secretName"] == "hf-token" and secret["items"] == [{"key": "token", "path": "token"}]
    # fetching needs egress; the API pods of the other sources open no connection
    policy = find(rendered["cpu-hub"][1], "NetworkPolicy")["spec"]
    assert policy["policyTypes"] == ["Ingress"] and "egress" not in policy
    # offline: a pre-filled shared claim, checked by the init container, and no egress at all
    docs = rendered["gpu-hub-offline"][1]
    pod = find(docs, "Deployment")["spec"]["template"]["spec"]
    assert env_of(pod["initContainers"][0])["HF_HUB_OFFLINE"] == "1"
    assert pod["initContainers"][0]["args"][-1] == HUB_ID and env_of(pod["containers"][0])["BERT_CHECKPOINT"] == HUB_ID
    assert {"name": "hf-cache", "persistentVolumeClaim": {"claimName": "hf-cache"}} in pod["volumes"]
    assert find(docs, "NetworkPolicy")["spec"]["egress"] == []


def test_several_models_reach_the_server_as_its_settings_and_their_hub_ids_the_init_container(rendered):
    from service.settings import Settings

    pod = find(rendered["cpu-hub-models"][1], "Deployment")["spec"]["template"]["spec"]
    assert pod["initContainers"][0]["args"] == ["python", "-m", "model.hub", f"{HUB_ID}@v1.0",
                                                "BAAI/bge-reranker-base@main"]  # the path needs no fetching
    env = env_of(pod["containers"][0])
    # what the service makes of the pod's environment: three models, the first the default, each with its own
    settings = Settings(checkpoint=env["BERT_CHECKPOINT"], model_setting=env["BERT_MODEL_SETTING"])
    models = {spec.name: spec for spec in settings.models()}
    assert list(models) == ["embed", "rerank", "mlm"]
    assert models["embed"].checkpoint == f"{HUB_ID}@v1.0" and models["mlm"].root_task == "fill-mask"
    assert models["rerank"].dtype == "float32" and models["rerank"].weight == 2.0 and models["embed"].weight == 1.0
    # one model, unnamed: the variable is the plain path or id, as before
    assert env_of(api_container(rendered["cpu-hub"][1]))["BERT_CHECKPOINT"] == f"{HUB_ID}@v1.0"
    assert "BERT_MODEL_SETTING" not in env_of(api_container(rendered["cpu"][1]))


@pytest.mark.parametrize("args, names", [
    (["--set", "probes.grpcReadiness=true", "--set", "server.grpc.enabled=false"], "probes.grpcReadiness"),
    (["--set", "server.grpc.port=8000"], "server.grpc.port"),
    (["-f", f"{CHART}/values-cpu.yaml", "--set", "gpu.count=1"], "gpu.count"),
    (["--set", "variant=gpu", "--set", "gpu.count=0"], "gpu.count"),
    (["--set", "shutdown.terminationGracePeriodSeconds=20"], "shutdown.terminationGracePeriodSeconds"),
    (["--set", "server.drainSeconds=30", "--set", "shutdown.terminationGracePeriodSeconds=60"],
     "shutdown.terminationGracePeriodSeconds"),
    (["--set", "model.source=pvc"], "model.pvc.claimName"),
    (["--set", "model.source=init"], "model.init.image"),
    (["--set", "model.source=s3"], "model.source"),
    (["--set", "model.source=hub"], "model.hub.id"),
    (["--set", "model.source=hub", "--set", "model.hub.id=BAAI/bge-small-en-v1.5@main"], "model.hub.id"),
    (["--set", "model.source=hub", "--set", "model.hub.id=BAAI/bge-small-en-v1.5", "--set", "model.hub.offline=true"],
     "model.hub.offline"),
    (["--set", "model.source="], "model.source"),
    (["--set-json", 'models=[{"name": "a b", "checkpoint": "/m"}]'], "models[0].name"),
    (["--set", "model.name=x", "--set-json", 'models=[{"name": "x", "checkpoint": "/m"}]'], "models[0].name"),
    (["--set-json", 'models=[{"name": "x"}]'], "models[0].checkpoint"),
    (["--set-json", 'models=[{"name": "x", "checkpoint": "BAAI/bge-reranker-base"}]'], "models[0].checkpoint"),
    (["--set-json", 'models=[{"name": "x", "checkpoint": "/m", "precision": "int8"}]'], "models[0].precision"),
    (["--set", "variant=tpu"], "variant"),
    (["--set", "apiKey.create=true"], "apiKey.value"),
    (["--set", "apiKey.value=short", "--set", "apiKey.create=true"], "apiKey.value"),
    (["--set", "autoscaling.minReplicas=1"], "podDisruptionBudget.enabled"),
    (["--set", "autoscaling.maxReplicas=1"], "autoscaling.maxReplicas"),
    (["--set", "image.digest=latest"], "image.digest"),
    (["--set", "training.distributed.enabled=true", "--set", "training.distributed.nodes=1"],
     "training.distributed.nodes"),
    (["--set", "corpus.enabled=true", "--set", "corpus.output=s3://b/out"], "corpus.input"),
    (["--set", "corpus.enabled=true", "--set", "corpus.input=s3://b/in/"], "corpus.output"),
    (["--set", "corpus.enabled=true", "--set", "corpus.input=docs.jsonl", "--set", "corpus.output=s3://b/out"],
     "corpus.input"),
    (["--set", "corpus.enabled=true", "--set", "corpus.input=s3://b/in/", "--set", "corpus.output=/data/out"],
     "corpus.storage.claimName"),
])
def test_contradicting_values_fail_at_render_time_naming_the_value(args, names):
    done = helm_template(*args)
    assert done.returncode != 0
    message = next(line for line in done.stderr.splitlines() if line.startswith("Error:"))
    assert "execution error" in message and f"): {names}:" in message, message


def test_checkov_finds_nothing_unjustified(tmp_path):
    def failed_checks(folder: Path) -> set[str]:
        done = subprocess.run([CHECKOV, "-d", str(folder), "--framework", "kubernetes", "--skip-download",
                               "--output", "json", "--quiet"], capture_output=True, text=True)
        reports = json.loads(done.stdout) if done.stdout.strip().startswith(("{", "[")) else {}
        reports = reports if isinstance(reports, list) else [reports]
        return {c["check_id"] for r in reports for c in r.get("results", {}).get("failed_checks", [])}

    pinned, default = tmp_path / "pinned", tmp_path / "default"
    pinned.mkdir(), default.mkdir()
    for name, args in RENDERS.items():
        pins = ["--set", f"image.digest={DIGEST}"] + (["--set", f"model.init.image=models:1@{DIGEST}"]
                                                      if "model.source=init" in args else [])
        (pinned / f"{name}.yaml").write_text(helm_template(*args, *pins).stdout)
        (default / f"{name}.yaml").write_text(helm_template(*args).stdout)
    assert failed_checks(pinned) == set()
    assert failed_checks(default) == JUSTIFIED_WITHOUT_DIGEST


def test_checkov_passes_the_dockerfile():
    done = subprocess.run([CHECKOV, "-f", str(REPO_ROOT / "Dockerfile"), "--framework", "dockerfile",
                           "--skip-download", "--output", "json", "--quiet"], capture_output=True, text=True)
    report = json.loads(done.stdout)
    assert report["summary"]["failed"] == 0 and report["summary"]["passed"] > 50, report["summary"]
