"""`--output s3://...` against a local S3-compatible server (moto's server mode): the same shards as a directory,
byte for byte; each unit committed by a record written after its shard, so a job killed at any moment and run
again ends with every row exactly once and the bytes of a run never stopped; a finished job rerun does nothing; a
missing bucket is one line."""

from __future__ import annotations

import json

import pytest

from tests.corpus import job_helpers
from tests.corpus.job_helpers import (embed_args, finished_job, manifest, read_output, run_cli, sentences,
                                      write_jsonl)
from tests.optional import required_or_skip

required_or_skip("moto.server", "BERT_REQUIRE_MOTO", "moto (requirements/dev.txt) is the local S3 server")
from tests.corpus.object_store import BUCKET, download, environment, keys, local_store  # noqa: E402

ROWS = 60
OPTIONS = ("--id-column", "id", "--rows-per-shard", "10", "--max-batch-tokens", "512", "--on-error", "skip")


@pytest.fixture(scope="module")
def endpoint():
    with local_store() as url:
        yield url


@pytest.fixture(scope="module")
def store_env(endpoint) -> dict:
    return environment(endpoint)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """ROWS documents, one of which (doc-13) is not JSON: a rejects file beside its shard."""
    path = write_jsonl(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", sentences(ROWS))
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[13] = '{"id": "doc-13", "text": "unterminated'
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def in_a_directory(tmp_path_factory, corpus, tiny_checkpoint):
    return finished_job(tmp_path_factory.mktemp("directory") / "out", corpus, tiny_checkpoint, *OPTIONS)


def files_of(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_same_job(found: dict[str, bytes], directory) -> None:
    """Every shard and rejects file byte-equal to the directory's, one commit record per shard, and the same
    finished manifest but for where the output is."""
    expected = files_of(directory)
    data = {name: value for name, value in found.items() if name.startswith(("shards/", "rejects/"))}
    assert data == {name: value for name, value in expected.items() if name.startswith(("shards/", "rejects/"))}
    shards = sorted(name for name in found if name.startswith("shards/"))
    assert sorted(name for name in found if name.startswith("done/")) == \
        [name.replace("shards/", "done/").replace(".parquet", ".json") for name in shards]
    written, wanted = json.loads(found["manifest.json"]), manifest(directory)
    assert written["complete"] and written["totals"] == wanted["totals"] and written["shards"] == wanted["shards"]
    assert written["plan"] == wanted["plan"] and written["identity"] == wanted["identity"]


def test_a_job_writes_to_a_bucket_what_it_writes_to_a_directory(endpoint, store_env, corpus, tiny_checkpoint,
                                                                 in_a_directory, tmp_path):
    done = run_cli(embed_args(corpus, f"s3://{BUCKET}/whole", tiny_checkpoint, *OPTIONS), env=store_env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"done: {ROWS} rows read, {ROWS - 1} documents embedded (1 rejected) -> ")
    found = keys(endpoint, "whole")
    assert_same_job(found, in_a_directory)
    assert sorted(read_output(download(endpoint, "whole", tmp_path))["id"]) == \
        sorted(f"doc-{i}" for i in range(ROWS) if i != 13)

    again = run_cli(embed_args(corpus, f"s3://{BUCKET}/whole", tiny_checkpoint, *OPTIONS), env=store_env)
    assert again.returncode == 0 and "nothing to do" in again.stderr and again.stdout == ""
    assert keys(endpoint, "whole") == found  # nothing rewritten


@pytest.mark.parametrize("point", ["plan", "batches:3", "committing:2", "shards:4"])
def test_killed_then_resumed_in_a_bucket_gives_every_row_once_and_the_same_bytes(endpoint, store_env, corpus,
                                                                                 tiny_checkpoint, in_a_directory,
                                                                                 tmp_path, point):
    prefix = f"killed-{point.replace(':', '-')}"
    args = embed_args(corpus, f"s3://{BUCKET}/{prefix}", tiny_checkpoint, *OPTIONS)
    job_helpers.kill_at(point, args, tmp_path / "paused", env=store_env)
    stopped = keys(endpoint, prefix)
    assert not json.loads(stopped["manifest.json"])["complete"]
    if point == "committing:2":  # killed with the second unit's shard and rejects uploaded whole, not committed
        assert len([n for n in stopped if n.startswith("shards/")]) == 2
        assert [n for n in stopped if n.startswith(("done/", "rejects/"))] == \
            ["done/part-00000-000000000000.json", "rejects/part-00000-000000000010.jsonl"]
    resumed = run_cli(args, env=store_env)
    assert resumed.returncode == 0, resumed.stderr
    if point == "committing:2":  # the uncommitted shard and its rejects did not count: removed, then redone
        assert "removed 2 unfinished file(s)" in resumed.stderr
    if point == "shards:4":
        assert "40 rows were done by an earlier run" in resumed.stdout
    assert_same_job(keys(endpoint, prefix), in_a_directory)


def test_a_missing_bucket_is_one_line_and_nothing_is_written(endpoint, store_env, corpus, tiny_checkpoint):
    refused = run_cli(embed_args(corpus, "s3://no-such-bucket/out", tiny_checkpoint, *OPTIONS), env=store_env)
    assert refused.returncode == 1
    message = refused.stderr.strip().splitlines()[-1]
    assert message.startswith("error: s3://no-such-bucket/out: the bucket 'no-such-bucket' does not exist"), message
    assert "Traceback" not in refused.stderr
