"""The job on Ray Data, on a local cluster of two Ray nodes: the same shards as the job on one machine (names, ids,
vectors within float tolerance), written to a directory or by the nodes to an object store (moto's S3 server); an
embedding actor killed mid-job (SIGKILL) with the job still finishing with every row exactly once; an option the
model cannot take refused before anything is written.

Ray is an optional extra: without it these tests skip, unless BERT_REQUIRE_RAY=1 (as `make test` sets, which
installs it) makes its absence a failure."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import replace

import numpy as np
import pytest

from corpus.settings import JobSettings
from tests.corpus.job_helpers import manifest, read_output, read_vectors, sentences, write_jsonl
from tests.corpus.ray_pause import MARKER_VARIABLE
from tests.optional import required_or_skip

ray = required_or_skip("ray", "BERT_REQUIRE_RAY", "Ray is an optional extra: pip install -r requirements/ray.txt")

ROWS = 120
NODE = {"num_cpus": 2, "object_store_memory": 80 * 2**20}  # logical CPUs; a small object store for a small machine


@pytest.fixture(scope="module")
def store():
    """moto's S3 server, when moto is installed, with its credentials and endpoint in the environment before the
    nodes start: each node has the store's credentials of its own, as a cluster's nodes do."""
    from tests.corpus.object_store import environment, local_store

    try:
        import moto.server  # noqa: F401
    except ImportError:
        if os.environ.get("BERT_REQUIRE_MOTO") == "1":  # as make test sets: fail rather than skip the S3 test
            raise
        yield None
        return
    with local_store() as endpoint:
        before = dict(os.environ)
        os.environ.update(environment(endpoint))
        try:
            yield endpoint
        finally:
            os.environ.clear()
            os.environ.update(before)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, store):
    """Two nodes; the test's ray.init adds tests/corpus/ray_pause.py as the workers' setup hook, so that the first
    actor to reach its second unit stands still, to be killed (the job's code has no hook of its own)."""
    from ray.cluster_utils import Cluster

    from corpus.ray_job import runtime_env

    marker = tmp_path_factory.mktemp("pause") / "paused"
    environment = runtime_env()
    environment["env_vars"][MARKER_VARIABLE] = str(marker)
    two_nodes = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    two_nodes.add_node(**NODE)
    try:
        ray.init(address=two_nodes.address, log_to_driver=False,
                 runtime_env={**environment, "worker_process_setup_hook": "tests.corpus.ray_pause.install"})
        yield marker
    finally:
        ray.shutdown()
        two_nodes.shutdown()


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
    deadline = time.monotonic() + 120
    while not cluster.exists():  # an actor stands still before its second unit and tells its pid
        assert runner.is_alive(), "the job ended before an actor reached its second unit"
        assert time.monotonic() < deadline, "no actor reached its second unit"
        time.sleep(0.05)
    held = len(shard_names(output))
    os.kill(int(cluster.read_text()), signal.SIGKILL)
    runner.join(timeout=120)
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


def test_chunked_float16_output_on_ray_equals_one_machine(cluster, job, tmp_path):
    from corpus import local_job, ray_job

    if not cluster.exists():  # (run alone) no actor stands still here
        cluster.write_text("0")
    chunked = replace(job, chunk_tokens=12, chunk_overlap=3, output_precision="float16", rows_per_shard=40)
    local_job.run(replace(chunked, output=str(tmp_path / "local")))
    ray_job.run(replace(chunked, output=str(tmp_path / "ray"), ray=True))
    found, expected = read_output(tmp_path / "ray"), read_output(tmp_path / "local")
    assert shard_names(tmp_path / "ray") == shard_names(tmp_path / "local")
    for column in ("id", "tokens", "chunk", "char_start", "char_end"):
        assert found[column] == expected[column], column
    assert len(found["id"]) > ROWS  # chunked: more rows than documents
    np.testing.assert_allclose(found["embedding"], expected["embedding"], rtol=1e-3, atol=1e-3)


def test_the_nodes_write_to_an_object_store_what_one_machine_writes_to_a_directory(cluster, store, job,
                                                                                  single_machine, tmp_path):
    if store is None:
        pytest.skip("moto is not installed (requirements/dev.txt): no local S3 server")
    from corpus import ray_job
    from tests.corpus.object_store import BUCKET, download, keys

    if not cluster.exists():  # (run alone) no actor stands still here
        cluster.write_text("0")
    summary = ray_job.run(replace(job, output=f"s3://{BUCKET}/on-ray", ray=True))
    assert summary.shards == ROWS // job.rows_per_shard
    objects = keys(store, "on-ray")
    shards = sorted(name for name in objects if name.startswith("shards/"))
    assert shards == [f"shards/{name}" for name in shard_names(single_machine)]
    assert sorted(name for name in objects if name.startswith("done/")) == \
        [name.replace("shards/", "done/").replace(".parquet", ".json") for name in shards]
    found, expected = read_output(download(store, "on-ray", tmp_path)), read_output(single_machine)
    assert found["id"] == expected["id"] and found["tokens"] == expected["tokens"]
    np.testing.assert_allclose(found["embedding"], expected["embedding"], rtol=1e-5, atol=1e-6)
    assert manifest(tmp_path)["complete"] and manifest(tmp_path)["totals"] == manifest(single_machine)["totals"]


def test_an_option_the_model_cannot_take_is_refused_on_ray_before_anything_is_written(cluster, job, tmp_path):
    from corpus import ray_job
    from corpus.settings import SettingsError

    if not cluster.exists():  # (run alone) no actor stands still here
        cluster.write_text("0")
    output = tmp_path / "out"
    with pytest.raises(SettingsError) as refused:  # the tiny model is 64 wide
        ray_job.run(replace(job, output=str(output), dimensions=65, ray=True))
    assert "--dimensions" in str(refused.value) and "\n" not in str(refused.value)
    assert not output.exists()
    corrected = ray_job.run(replace(job, output=str(output), dimensions=16, ray=True))
    assert corrected.documents == ROWS and manifest(output)["identity"]["dimensions"] == 16


def test_an_int8_job_holds_every_actor_to_the_int8_kernels_it_recorded(cluster, job, tmp_path):
    """The identity records the int8 path of a node that runs the engine, and an actor on a node whose kernels differ
    refuses to embed (its vectors could differ in the last bits from the others' in the same output)."""
    from corpus import ray_job
    from corpus.errors import CorpusError
    from kernels import int8_path_identity

    if not cluster.exists():
        cluster.write_text("0")
    output = tmp_path / "out"
    settings = replace(job, output=str(output), dtype="int8", ray=True)
    assert ray_job.run(settings).documents == ROWS
    assert manifest(output)["identity"]["int8_path"] == int8_path_identity()  # both nodes are this machine
    with pytest.raises(CorpusError) as refused:
        ray_job._EmbedUnit(ray_job._settings_json(settings), "int8 formulas 0; attention torch's; torch 1.0 (AVX2)")
    message = str(refused.value)
    assert message.startswith("Ray node ") and int8_path_identity() in message and "torch 1.0 (AVX2)" in message


def test_multi_vector_and_long_input_outputs_on_ray_equal_one_machine(cluster, job, tiny_colbert, tmp_path):
    from corpus import local_job, ray_job

    if not cluster.exists():  # (run alone) no actor stands still here
        cluster.write_text("0")
    long = " ".join(sentences(12, chars=400))  # far past the tiny model's 128 positions
    source = write_jsonl(tmp_path / "corpus.jsonl", sentences(30) + [long])
    for name, options in (("multi", {"checkpoint": str(tiny_colbert), "multi_vector": True, "long_input": "chunk"}),
                          ("long", {"long_input": "chunk"})):
        settings = replace(job, input=str(source), rows_per_shard=8, **options)
        local_job.run(replace(settings, output=str(tmp_path / name / "local")))
        ray_job.run(replace(settings, output=str(tmp_path / name / "ray"), ray=True))
        found, expected = read_vectors(tmp_path / name / "ray"), read_vectors(tmp_path / name / "local")
        assert found[0] == expected[0] and found[2] == expected[2] and len(found[0]) == 31
        for mine, want in zip(found[1], expected[1]):
            np.testing.assert_allclose(mine, want, rtol=1e-5, atol=1e-5)
