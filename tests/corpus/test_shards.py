"""The output directory's files: the shard's columns, a unit staged then committed (a full disk leaves nothing
half-written), done units, stale temporary files, and the manifest's refusals naming what differs."""

from __future__ import annotations

import errno

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpus import local_output, shards
from corpus.errors import CorpusError, Rejected
from corpus.inputs import InputFile
from corpus.local_output import LocalOutput
from corpus.manifest import check_manifest
from corpus.plan import WorkUnit

FILE = InputFile("/data/a.jsonl", "jsonl", 10, "10-1", "a.jsonl")
UNIT = WorkUnit(0, FILE, 0, 3, 0)


def table(precision: str = "float32", chunked: bool = False) -> pa.Table:
    schema = shards.shard_schema(4, precision, chunked)
    vectors = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    spans = ([0, 1, 0], [0, 5, 0], [9, 14, 3]) if chunked else None
    return shards.shard_table(schema, ["a", "a", "b"], vectors, [5, 6, 3], spans)


def shard_path(root, unit=UNIT):
    return root / "shards" / f"{unit.name}.parquet"


def test_the_embedding_column_is_a_fixed_size_list_of_the_asked_precision(tmp_path):
    output = LocalOutput(tmp_path)
    for precision, arrow_type in (("float32", pa.float32()), ("float16", pa.float16())):
        output.prepare()
        output.write_shard(UNIT.name, table(precision), [])
        read = pq.read_table(shard_path(tmp_path))
        assert read.schema.field("embedding").type == pa.list_(pa.field("item", arrow_type, nullable=False), 4)
        values = np.asarray(read.column("embedding").to_pylist(), dtype=np.float32)
        expected = (np.arange(12, dtype=np.float32).reshape(3, 4) / 7).astype(precision)
        np.testing.assert_array_equal(values, expected.astype(np.float32))
        assert read.column("id").to_pylist() == ["a", "a", "b"] and read.column("tokens").to_pylist() == [5, 6, 3]


def test_the_bytes_written_to_a_path_are_the_bytes_an_object_store_gets():
    written = table(chunked=True)
    assert pq.read_table(pa.BufferReader(shards.parquet_bytes(written))).equals(written)


def test_chunked_shards_carry_the_chunk_and_its_span(tmp_path):
    output = LocalOutput(tmp_path)
    output.prepare()
    output.write_shard(UNIT.name, table(chunked=True), [])
    read = pq.read_table(shard_path(tmp_path))
    assert read.column_names == ["id", "embedding", "tokens", "chunk", "char_start", "char_end"]
    assert read.column("chunk").to_pylist() == [0, 1, 0] and read.column("char_end").to_pylist() == [9, 14, 3]


def test_rejects_go_beside_the_shard_and_a_unit_counts_once_committed(tmp_path):
    output = LocalOutput(tmp_path)
    output.prepare()
    staged = output.stage(UNIT.name, table(), [Rejected(FILE.uri, 2, None, "line is not valid JSON")])
    lines = (tmp_path / "rejects" / f"{UNIT.name}.jsonl").read_text().splitlines()
    assert lines == ['{"source": "/data/a.jsonl", "row": 2, "doc_id": null, "reason": "line is not valid JSON"}']
    assert output.done_units() == set() and staged.name.startswith(".tmp-")  # staged whole: not done yet
    output.commit(UNIT.name, staged)
    assert output.done_units() == {UNIT.name} and not staged.exists()
    assert output.shard_summaries([UNIT.name]) == [{"name": UNIT.name, "rows": 3, "rejects": 1, "tokens": 14}]


def test_a_full_disk_leaves_no_shard_and_no_temporary_file(tmp_path, monkeypatch):
    output = LocalOutput(tmp_path)
    output.prepare()

    def full(table, path):
        with open(path, "wb") as handle:
            handle.write(b"PAR1 half a shard")
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(local_output.pq, "write_table", full)
    with pytest.raises(CorpusError) as raised:
        output.write_shard(UNIT.name, table(), [])
    message = str(raised.value)
    assert message.startswith(str(shard_path(tmp_path))) and "no space left" in message
    assert "run the same command again" in message and "\n" not in message
    assert output.done_units() == set()
    assert not list(tmp_path.rglob(".tmp-*")) and not list(tmp_path.rglob("*.parquet"))


def test_stale_temporary_files_are_removed_and_never_count_as_done(tmp_path):
    output = LocalOutput(tmp_path)
    output.prepare()
    (tmp_path / "shards" / f".tmp-{UNIT.name}.parquet").write_bytes(b"half")
    (tmp_path / ".tmp-manifest.json").write_text("{")
    assert output.done_units() == set()
    assert output.prepare() == 2
    assert not list(tmp_path.rglob(".tmp-*"))


def test_an_output_that_is_a_file_is_refused_untouched(tmp_path):
    target = tmp_path / "out"
    target.write_text("not a directory")
    with pytest.raises(CorpusError, match="--output is a file"):
        LocalOutput(target).check_target()
    assert target.read_text() == "not a directory"


IDENTITY = {"pooling": "mean", "normalize": True, "dimensions": None, "output_precision": "float32"}
MODEL = {"checkpoint": "checkpoints/x", "weights_sha256": "ab" * 32}
INPUTS = [{"uri": "/data/a.jsonl", "format": "jsonl", "size": 10, "fingerprint": "10-1"}]


def refusal(**changes) -> str:
    manifest = {"identity": IDENTITY, "model": MODEL, "inputs": INPUTS}
    asked = {"identity": IDENTITY, "model": MODEL, "inputs": INPUTS, **changes}
    with pytest.raises(CorpusError) as raised:
        check_manifest("out/manifest.json", manifest, asked["identity"], asked["model"], asked["inputs"])
    return str(raised.value)


def test_the_manifest_refuses_another_job_naming_what_differs():
    check_manifest("out/manifest.json", {"identity": IDENTITY, "model": MODEL, "inputs": INPUTS}, IDENTITY, MODEL,
                   INPUTS)
    assert "--dimensions (not set)" in refusal(identity={**IDENTITY, "dimensions": 8})
    assert "--output-precision float32" in refusal(identity={**IDENTITY, "output_precision": "float16"})
    assert "another model" in refusal(model={**MODEL, "weights_sha256": "cd" * 32})
    assert refusal(inputs=[{**INPUTS[0], "fingerprint": "11-2"}]).startswith("/data/a.jsonl: this input changed")
    assert refusal(inputs=[]).startswith("/data/a.jsonl: this input was part of the job and is gone")
    extra = {**INPUTS[0], "uri": "/data/b.jsonl"}
    assert refusal(inputs=INPUTS + [extra]).startswith("/data/b.jsonl: this input is new")
