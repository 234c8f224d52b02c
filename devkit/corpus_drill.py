"""The corpus job in the images, against a real Docker engine (part of `make test-docker`; alone:
`python -m devkit.docker_check --corpus-only`). Each run embeds the same few hundred WikiText sentences with the
bundled model and must give the vectors the job gives run from this checkout:

1. `docker run IMAGE corpus embed` on a mounted folder, under the Kubernetes chart's pod security (read-only root,
   no capabilities, uid 10001): the same ids as here, the vectors within float tolerance (the image's torch is its
   own build).
2. The Ray image's `corpus embed --ray`: a local Ray inside one container; the same shards as 1.
3. `--output s3://...` from the image to an S3-compatible server on the host (moto): the same shards as 1, byte for
   byte, each with its commit record.
4. The compose profile `corpus`: a Ray cluster of two containers (head and worker) sharing one folder, the job
   started on the head with `--ray-address auto`: the same shards as 1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from devkit.cold_start import POD_SECURITY
from devkit.paths import REPO_ROOT
from devkit.server import free_port

IMAGE, RAY_IMAGE = "bert-serve:0.1.0-cpu", "bert-serve:0.1.0-cpu-ray"
CPU_COMPOSE = ["docker", "compose", "-f", "docker-compose.yml", "-f", "docker-compose.cpu.yml", "--profile", "corpus"]
SENTENCES = 400
OPTIONS = ["--id-column", "id", "--rows-per-shard", "100", "--truncate"]
BUCKET = "corpus-drill"
TOLERANCE = 1e-4  # between torch builds (this checkout's venv and the image)
FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_DEFAULT_REGION": "us-east-1"}  # moto takes any


def write_corpus(path: Path) -> Path:
    source = REPO_ROOT / "tests" / "data" / "wikitext-2" / "valid.tokens"
    lines = [line.strip() for line in source.read_text(encoding="utf-8").splitlines()]
    texts = [line[:400] for line in lines if line and not line.startswith("=")][:SENTENCES]
    path.write_text("".join(json.dumps({"id": f"w{i}", "text": t}) + "\n" for i, t in enumerate(texts)),
                    encoding="utf-8")
    return path


def timed(command: list[str], **kwargs) -> tuple[subprocess.CompletedProcess, float]:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, **kwargs)
    return done, round(time.perf_counter() - started, 1)


def shards_of(output: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted((output / "shards").glob("part-*.parquet"))}


def compared(found: Path, reference: Path) -> dict:
    """The same ids in the same shards, the vectors' largest difference, and whether the shards are byte-equal."""
    def read(output: Path):
        tables = [pq.read_table(output / "shards" / name) for name in shards_of(output)]
        ids = [i for table in tables for i in table.column("id").to_pylist()]
        vectors = np.asarray([v for table in tables for v in table.column("embedding").to_pylist()], np.float32)
        return ids, vectors

    if not (found / "manifest.json").is_file():
        return {"ok": False, "why": f"no manifest in {found}"}
    (ids, vectors), (wanted_ids, wanted) = read(found), read(reference)
    same_ids = ids == wanted_ids and len(ids) == SENTENCES
    largest = float(np.abs(vectors - wanted).max()) if same_ids else None
    complete = json.loads((found / "manifest.json").read_text())["complete"]
    return {"ok": bool(same_ids and complete and largest <= TOLERANCE), "rows": len(ids),
            "largest_difference": largest, "shards_byte_equal": shards_of(found) == shards_of(reference)}


def in_the_image(work: Path) -> dict:
    done, seconds = timed(["docker", "run", "--rm", *POD_SECURITY, "-v", f"{work}:/data", IMAGE, "corpus", "embed",
                           "/data/corpus.jsonl", "--output", "/data/alone", *OPTIONS])
    return {"exit": done.returncode, "seconds": seconds, "summary": done.stdout.strip(),
            "error": done.stderr.strip().splitlines()[-1:] if done.returncode else []}


def on_ray_in_the_image(work: Path) -> dict:
    done, seconds = timed(["docker", "run", "--rm", "--shm-size", "512m", "--user", "10001:10001",
                           "-v", f"{work}:/data", RAY_IMAGE, "corpus", "embed", "/data/corpus.jsonl",
                           "--output", "/data/ray", *OPTIONS, "--ray"])
    return {"exit": done.returncode, "seconds": seconds, "summary": done.stdout.strip(),
            "error": done.stderr.strip().splitlines()[-3:] if done.returncode else []}


def to_an_object_store(work: Path) -> dict:
    """The image writes to moto's S3 server on this host (the container on the host's network)."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
        s3.create_bucket(Bucket=BUCKET)
        variables = [f"--env={name}={value}" for name, value in {**FAKE_CREDENTIALS,
                                                                 "AWS_ENDPOINT_URL": endpoint}.items()]
        done, seconds = timed(["docker", "run", "--rm", *POD_SECURITY, "--network", "host", *variables,
                               "-v", f"{work}:/data", IMAGE, "corpus", "embed", "/data/corpus.jsonl",
                               "--output", f"s3://{BUCKET}/vectors", *OPTIONS])
        objects = [item["Key"] for item in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
        into = work / "s3"
        for key in objects:
            path = into / key.removeprefix("vectors/")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    finally:
        server.stop()
    commits = sorted(k for k in objects if k.startswith("vectors/done/"))
    return {"exit": done.returncode, "seconds": seconds, "objects": len(objects), "commit_records": len(commits),
            "error": done.stderr.strip().splitlines()[-1:] if done.returncode else []}


def on_a_compose_cluster(work: Path) -> dict:
    """`docker compose --profile corpus up` (head and worker), the job on the head, then `down`."""
    env = {**os.environ, "CORPUS_DATA": str(work)}
    compose = subprocess.run([*CPU_COMPOSE, "up", "-d", "--no-build"], cwd=REPO_ROOT, env=env, capture_output=True,
                             text=True)
    if compose.returncode != 0:
        return {"exit": compose.returncode, "error": compose.stderr.strip().splitlines()[-3:]}
    try:
        nodes, deadline = 0, time.monotonic() + 180
        while nodes < 2 and time.monotonic() < deadline:
            probe = subprocess.run([*CPU_COMPOSE, "exec", "-T", "ray-head", "python", "-c",
                                    "import ray; ray.init(address='auto', log_to_driver=False); "
                                    "print(sum(n['Alive'] for n in ray.nodes()))"],
                                   cwd=REPO_ROOT, env=env, capture_output=True, text=True)
            found = re.findall(r"^(\d+)$", probe.stdout, re.MULTILINE)
            nodes = int(found[-1]) if found else 0
            time.sleep(0 if nodes >= 2 else 3)
        done, seconds = timed([*CPU_COMPOSE, "exec", "-T", "ray-head", "bert", "corpus", "embed", "/data/corpus.jsonl",
                               "--output", "/data/cluster", *OPTIONS, "--ray-address", "auto"], env=env)
        actors = re.findall(r"(\d+) embedding actor", done.stderr)
        return {"exit": done.returncode, "seconds": seconds, "nodes": nodes, "summary": done.stdout.strip(),
                "actors": int(actors[-1]) if actors else None,
                "error": done.stderr.strip().splitlines()[-3:] if done.returncode else []}
    finally:
        subprocess.run([*CPU_COMPOSE, "down"], cwd=REPO_ROOT, env=env, capture_output=True)


def image_sizes() -> dict:
    sizes = {}
    for image in (IMAGE, RAY_IMAGE):
        done = subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}}", image], capture_output=True,
                              text=True)
        sizes[image] = round(int(done.stdout.strip()) / 1e9, 2) if done.returncode == 0 else None
    return sizes


def run(cluster: bool = True) -> dict:
    work = Path(tempfile.mkdtemp(prefix="corpus-drill-"))
    os.chmod(work, 0o777)  # the images run as uid 10001
    try:
        write_corpus(work / "corpus.jsonl")
        here, seconds = timed([sys.executable, "-m", "corpus", "embed", str(work / "corpus.jsonl"), "--output",
                               str(work / "here"), *OPTIONS])
        if here.returncode != 0:
            raise SystemExit(f"the job failed here: {here.stderr}")
        report = {"sizes_gb": image_sizes(), "here_seconds": seconds}
        report["alone"] = {**in_the_image(work), **compared(work / "alone", work / "here")}
        report["ray_in_one_container"] = {**on_ray_in_the_image(work), **compared(work / "ray", work / "alone")}
        report["s3"] = {**to_an_object_store(work), **compared(work / "s3", work / "alone")}
        report["s3"]["ok"] = report["s3"]["ok"] and report["s3"]["shards_byte_equal"] and \
            report["s3"]["commit_records"] == SENTENCES // 100
        if cluster:
            report["compose_ray_cluster"] = {**on_a_compose_cluster(work), **compared(work / "cluster", work / "alone")}
            report["compose_ray_cluster"]["ok"] = report["compose_ray_cluster"]["ok"] and \
                report["compose_ray_cluster"].get("nodes") == 2
        report["ok"] = all(part["ok"] and part["exit"] == 0 for part in report.values() if isinstance(part, dict)
                           and "exit" in part)
        return report
    finally:
        shutil.rmtree(work, ignore_errors=True)
