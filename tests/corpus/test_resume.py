"""kill -9 at several moments, then the same command again: every input row exactly once, the vectors those of a run
never stopped, no `.tmp-` file left; a finished job rerun does nothing; another job's directory is refused. The
job is stopped at each moment through tests/corpus/paused_job.py."""

from __future__ import annotations

import numpy as np
import pytest

from tests.corpus import job_helpers
from tests.corpus.job_helpers import (embed_args, finished_job, manifest, read_output, run_cli, sentences,
                                      write_jsonl)

ROWS = 100
OPTIONS = ("--id-column", "id", "--rows-per-shard", "16", "--max-batch-tokens", "512")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", sentences(ROWS))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, corpus, tiny_checkpoint):
    return finished_job(tmp_path_factory.mktemp("whole") / "out", corpus, tiny_checkpoint, *OPTIONS)


def shard_bytes(output) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted((output / "shards").iterdir())}


def kill_at(point: str, args: list[str], tmp_path) -> None:
    job_helpers.kill_at(point, args, tmp_path / "paused")


@pytest.mark.parametrize("point", ["plan", "batches:3", "committing:2", "shards:1", "shards:4"])
def test_killed_then_resumed_gives_every_row_once(tmp_path, corpus, tiny_checkpoint, uninterrupted, point):
    output = tmp_path / "out"
    args = embed_args(corpus, output, tiny_checkpoint, *OPTIONS)
    kill_at(point, args, tmp_path)
    assert not manifest(output)["complete"]
    if point == "committing:2":  # killed with a whole shard under its temporary name
        assert list((output / "shards").glob(".tmp-*")) and len(list((output / "shards").glob("part-*"))) == 1
    resumed = run_cli(args)
    assert resumed.returncode == 0, resumed.stderr
    found, expected = read_output(output), read_output(uninterrupted)
    assert sorted(found["id"]) == sorted(f"doc-{i}" for i in range(ROWS))  # each once: no gap, no duplicate
    assert found["id"] == expected["id"]
    np.testing.assert_array_equal(found["embedding"], expected["embedding"])
    assert shard_bytes(output) == shard_bytes(uninterrupted)  # the very files of a run never stopped
    assert not [p for p in output.rglob(".tmp-*")]
    finished = manifest(output)
    assert finished["complete"] and finished["totals"]["rows"] == ROWS
    assert sum(shard["rows"] for shard in finished["shards"]) == ROWS
    if point.startswith("shards:"):
        assert "done by an earlier run" in resumed.stdout


def test_a_finished_job_rerun_does_nothing(tmp_path, corpus, tiny_checkpoint):
    output = tmp_path / "out"
    args = embed_args(corpus, output, tiny_checkpoint, *OPTIONS)
    assert run_cli(args).returncode == 0
    before = {p: p.stat().st_mtime_ns for p in output.rglob("*") if p.is_file()}
    again = run_cli(args)
    assert again.returncode == 0, again.stderr
    assert "nothing to do" in again.stderr and again.stdout == ""
    assert {p: p.stat().st_mtime_ns for p in output.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("changed, named", [
    (("--dimensions", "8"), "--dimensions"),
    (("--no-normalize",), "--normalize"),
    (("--output-precision", "float16"), "--output-precision"),
    (("--pooling", "cls"), "--pooling"),
    (("--rows-per-shard", "20"), "--rows-per-shard"),
    (("--dtype", "int8"), "--dtype"),  # whatever auto resolved to here, it is never int8
])
def test_an_output_made_with_other_settings_is_refused_by_name(tmp_path, corpus, tiny_checkpoint, changed, named):
    output = tmp_path / "out"
    kill_at("shards:1", embed_args(corpus, output, tiny_checkpoint, *OPTIONS), tmp_path)
    options = [o for o in OPTIONS if not (named == "--rows-per-shard" and o in ("--rows-per-shard", "16"))]
    refused = run_cli(embed_args(corpus, output, tiny_checkpoint, *options, *changed))
    assert refused.returncode == 1
    message = refused.stderr.strip().splitlines()[-1]
    assert named in message and "manifest.json" in message, message


def test_another_checkpoint_is_refused(tmp_path, corpus, tiny_checkpoint, tokenizer):
    from model import save_checkpoint
    from tests.conftest import random_model

    other = tmp_path / "other-ckpt"
    save_checkpoint(other, random_model(tokenizer.vocab_size, seed=1), tokenizer)
    output = tmp_path / "out"
    kill_at("shards:1", embed_args(corpus, output, tiny_checkpoint, *OPTIONS), tmp_path)
    refused = run_cli(embed_args(corpus, output, other, *OPTIONS))
    assert refused.returncode == 1 and "another model" in refused.stderr, refused.stderr


def test_a_changed_input_is_refused_by_name(tmp_path, tiny_checkpoint):
    source = write_jsonl(tmp_path / "corpus.jsonl", sentences(40))
    output = tmp_path / "out"
    args = embed_args(source, output, tiny_checkpoint, *OPTIONS)
    kill_at("shards:1", args, tmp_path)
    write_jsonl(source, sentences(41))
    refused = run_cli(args)
    assert refused.returncode == 1
    message = refused.stderr.strip().splitlines()[-1]
    assert str(source) in message and "changed" in message, message
