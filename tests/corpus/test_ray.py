"""The job on Ray Data, on a local cluster of two Ray nodes: the same shards as the job on one machine (names, ids,
vectors within float tolerance), and an embedding actor killed mid-job (SIGKILL) with the job still finishing with
every row exactly once."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import replace

import numpy as np
import pytest

from corpus.settings import JobSettings
from tests.corpus.job_helpers import manifest, read_output, sentences, write_jsonl

ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install -r requirements/ray.txt")

ROWS = 120
NODE = {"num_cpus": 2, "object_store_memory": 80 * 2**20}  # logical CPUs; a small object store for a small machine


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from ray.cluster_utils import Cluster

    from corpus.ray_job import runtime_env

    marker = tmp_path_factory.mktemp("pause") / "paused"
    os.environ.update({"CORPUS_PAUSE_AT": "embedding:2", "CORPUS_PAUSE_FILE": str(marker)})  # inherited by the nodes
    two_nodes = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    two_nodes.add_node(**NODE)
    try:
        ray.init(address=two_nodes.address, log_to_driver=False, runtime_env=runtime_env())
        yield marker
    finally:
        ray.shutdown()
        two_nodes.shutdown()
        for name in ("CORPUS_PAUSE_AT", "CORPUS_PAUSE_FILE"):
            os.environ.pop(name, None)


@pytest.fixture(scope="module")
def job(tmp_path_factory, tiny_checkpoint):
    source = write_jsonl(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", sentences(ROWS))
    return JobSettings(input=str(source), output="", checkpoint=str(tiny_checkpoint), id_column="id",
                       rows_per_shard=10, max_batch_tokens=512)


@pytest.fixture(scope="module")
def single_machine(tmp_path_factory, job):
    from corpus import local_job

    output = tmp_path_factory.mktemp("local") / "out"
    local_job.run(replace(job, output=str(output)))
    return output


def shard_names(output) -> list[str]:
    return sorted(path.name for path in (output / "shards").glob("*.parquet"))


def test_an_actor_killed_mid_job_leaves_every_row_once_and_the_same_output(cluster, job, single_machine, tmp_path):
    from corpus import ray_job

    output = tmp_path / "out"
    finished: list = []
    runner = threading.Thread(target=lambda: finished.append(ray_job.run(replace(job, output=str(output), ray=True))))
    runner.start()
    deadline = time.monotonic() + 90
    while not cluster.exists():  # an actor stands still before its second unit and tells its pid
        assert runner.is_alive(), "the job ended before an actor reached its second unit"
        assert time.monotonic() < deadline, "no actor reached its second unit"
        time.sleep(0.05)
    held = len(shard_names(output))
    os.kill(int(cluster.read_text()), signal.SIGKILL)
    runner.join(timeout=90)
    assert not runner.is_alive(), "the job did not finish after its actor was killed"
    assert finished, "the job raised (see the captured log)"
    assert 0 < held < ROWS // job.rows_per_shard  # killed mid-job: some shards written, not all

    found, expected = read_output(output), read_output(single_machine)
    assert sorted(found["id"]) == sorted(f"doc-{i}" for i in range(ROWS))  # each once: no gap, no duplicate
    assert shard_names(output) == shard_names(single_machine)  # the same units, the same shard names
    assert found["id"] == expected["id"]
    np.testing.assert_allclose(found["embedding"], expected["embedding"], rtol=1e-5, atol=1e-6)
    assert found["tokens"] == expected["tokens"]
    done = manifest(output)
    assert done["complete"] and done["totals"] == manifest(single_machine)["totals"]
    assert finished[0].rows == ROWS and finished[0].shards == ROWS // job.rows_per_shard


def test_a_finished_job_rerun_on_ray_does_nothing_and_a_resume_embeds_only_what_is_left(cluster, job, single_machine,
                                                                                          tmp_path):
    import shutil

    from corpus import ray_job

    if not cluster.exists():  # (run alone) no actor stands still here
        cluster.write_text("0")
    output = tmp_path / "out"
    shutil.copytree(single_machine, output)  # a job finished on one machine ...
    before = {p.name: p.stat().st_mtime_ns for p in (output / "shards").iterdir()}
    assert ray_job.run(replace(job, output=str(output), ray=True)).rows == 0  # ... is done on Ray too
    for name in list(before)[:3]:  # three units lost: a resume on Ray makes exactly those
        (output / "shards" / name).unlink()
    manifest_path = output / "manifest.json"
    manifest_path.write_text(manifest_path.read_text().replace('"complete": true', '"complete": false'))
    summary = ray_job.run(replace(job, output=str(output), ray=True))
    assert summary.shards == 3 and summary.already_done == ROWS - 30
    after = {p.name: p.stat().st_mtime_ns for p in (output / "shards").iterdir()}
    assert sorted(after) == sorted(before)
    assert [n for n in after if after[n] != before[n]] == list(before)[:3]
    np.testing.assert_allclose(read_output(output)["embedding"], read_output(single_machine)["embedding"],
                               rtol=1e-5, atol=1e-6)


def test_a_bad_row_stops_the_job_on_ray_with_the_same_one_line_error(cluster, job, tmp_path):
    from corpus import ray_job
    from corpus.errors import CorpusError

    if not cluster.exists():  # (run alone) no actor stands still here
        cluster.write_text("0")
    source = tmp_path / "bad.jsonl"
    source.write_text(open(job.input, encoding="utf-8").read() + "{not json\n", encoding="utf-8")
    with pytest.raises(CorpusError) as stopped:
        ray_job.run(replace(job, input=str(source), output=str(tmp_path / "out"), ray=True))
    message = str(stopped.value)
    assert message.startswith(f"{source}:{ROWS + 1}: ") and "\n" not in message, message
    assert not (tmp_path / "out" / "shards" / f"part-00000-{ROWS:012d}.parquet").exists()
