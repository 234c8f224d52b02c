"""The chart's jobs (distributed training, the corpus job) and its autoscaler, rendered as tests/helm_chart.py renders
the chart: what the pods run and mount, how they retry, and that the autoscaler reads series the service exports."""

from __future__ import annotations

import yaml

from service.metrics import Metrics
from tests.helm_chart import ADAPTER, HUB_ID, api_container, env_of, find, rendered

__all__ = ["rendered"]  # a fixture, used by name


def test_distributed_training_is_an_indexed_torchrun_job(rendered):
    docs = rendered["gpu"][1]
    job = find(docs, "Job", "train-dist")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 2
    pod = spec["template"]["spec"]
    headless = find(docs, "Service", "train-dist")
    assert headless["spec"]["clusterIP"] == "None" and pod["subdomain"] == headless["metadata"]["name"]
    args = pod["containers"][0]["args"]
    assert args[0] == "torchrun" and "--nnodes=2" in args and args[args.index("-m") + 1] == "trainer"
    endpoint = next(a for a in args if a.startswith("--rdzv-endpoint="))
    assert endpoint == f"--rdzv-endpoint={job['metadata']['name']}-0.{headless['metadata']['name']}:29500"
    mounts = {m["mountPath"]: m.get("subPath") for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["/checkpoints"] == "checkpoints" and mounts["/cache"] == "cache"
    single = find(docs, "Job", "-train")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert single[0] == "train" and "--resume" in single


def corpus_pod(docs: list[dict]) -> dict:
    return find(docs, "Job", "-corpus")["spec"]["template"]["spec"]


def test_the_corpus_job_on_an_object_store_needs_no_volume_and_reads_its_credentials_from_a_file(rendered):
    docs = rendered["cpu-corpus-s3"][1]
    pod = corpus_pod(docs)
    container = pod["containers"][0]
    assert container["args"] == ["corpus", "embed", "s3://docs/in/", "--output", "s3://docs/vectors",
                                 "--id-column", "doc_id", "--dtype", "int8"]
    assert container["image"] == api_container(docs)["image"]  # the image that serves runs the job
    assert {v["name"] for v in pod["volumes"]} == {"tmp", "cache", "aws-credentials"}  # no claim
    env = env_of(container)
    assert env["AWS_ENDPOINT_URL"] == "http://minio.storage:9000"
    assert env["AWS_SHARED_CREDENTIALS_FILE"] == "/run/secrets/aws/credentials"
    assert not any(name.startswith("AWS_") and "KEY" in name for name in env)  # the keys are in the file only
    secret = next(v for v in pod["volumes"] if v["name"] == "aws-credentials")["secret"]
    assert secret == {"secretName": "s3", "items": [{"key": "credentials", "path": "credentials"}]}
    assert {"name": "aws-credentials", "mountPath": "/run/secrets/aws", "readOnly": True} in container["volumeMounts"]
    policy = find(docs, "NetworkPolicy", "-corpus")["spec"]
    assert policy["podSelector"]["matchLabels"] == find(docs, "Job", "-corpus")["spec"]["template"]["metadata"][
        "labels"] and policy["policyTypes"] == ["Ingress"] and "ingress" not in policy  # no connection in


def test_the_corpus_job_on_a_claim_mounts_it_at_data_and_takes_the_gpus(rendered):
    pod = corpus_pod(rendered["gpu-corpus-pvc"][1])
    container = pod["containers"][0]
    assert container["args"] == ["corpus", "embed", "/data/docs.jsonl", "--output", "/data/vectors",
                                 "--checkpoint", HUB_ID]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "corpus-data"}} in pod["volumes"]
    assert {"name": "data", "mountPath": "/data"} in container["volumeMounts"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1 and pod["tolerations"]


def test_the_corpus_job_retries_what_a_retry_can_fix_and_no_api_selector_counts_its_pod(rendered):
    docs = rendered["cpu-corpus-s3"][1]
    job = find(docs, "Job", "-corpus")["spec"]
    assert job["template"]["spec"]["restartPolicy"] == "Never" and job["backoffLimit"] >= 1
    fail_at_once, ignored = job["podFailurePolicy"]["rules"]
    # exit 2 is corpus/cli.py's "cannot start" (an option, the checkpoint): a retry would be refused the same way
    assert fail_at_once == {"action": "FailJob", "onExitCodes": {"containerName": "corpus", "operator": "In",
                                                                  "values": [2]}}
    assert ignored["action"] == "Ignore" and ignored["onPodConditions"][0]["type"] == "DisruptionTarget"
    labels = job["template"]["metadata"]["labels"]
    selectors = [find(docs, "Service", "serve")["spec"]["selector"],
                 find(docs, "Deployment")["spec"]["selector"]["matchLabels"],
                 find(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"]]
    for selector in selectors:  # a Job's pod among the API's endpoints would be sent requests it cannot answer
        assert not all(labels.get(key) == value for key, value in selector.items()), selector


def test_autoscaler_reads_what_the_adapter_serves_from_what_the_service_exports(rendered):
    hpa = find(rendered["cpu"][1], "HorizontalPodAutoscaler")
    wanted = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]}
    rules = yaml.safe_load(ADAPTER.read_text())["rules"]["custom"]
    served = {rule["name"]["as"] for rule in rules}
    assert wanted == served == {"bert_queue_depth", "bert_queue_time_seconds"}
    metrics = Metrics()
    for model in ("embedder", "reranker"):  # a served model's series exist once the model does
        metrics.for_model(model)
    exported = metrics.render()
    if isinstance(exported, bytes):
        exported = exported.decode()
    for rule in rules:
        series = rule["seriesQuery"].split("{")[0]
        assert f"\n{series} " in exported or f"\n{series}{{" in exported or exported.startswith(series), series
        for name in ("bert_queue_time_seconds_sum", "bert_queue_time_seconds_count"):
            if name in rule["metricsQuery"]:
                assert name in exported
        # one series per model in a pod: the query must add them up to one value per pod
        assert rule["metricsQuery"].startswith("sum("), rule["metricsQuery"]
        assert f'\n{series}{{model="reranker"}} ' in exported, series
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 60
