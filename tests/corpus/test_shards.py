"""The output directory's files: the shard's columns, atomic writes (a full disk leaves nothing half-written), done
units, stale temporary files, and the manifest's refusals naming what differs."""

from __future__ import annotations

import errno

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpus import shards
from corpus.errors import CorpusError, Rejected
from corpus.inputs import InputFile
from corpus.plan import WorkUnit

FILE = InputFile("/data/a.jsonl", "jsonl", 10, "10-1", "a.jsonl")
UNIT = WorkUnit(0, FILE, 0, 3, 0)


def table(precision: str = "float32", chunked: bool = False) -> pa.Table:
    schema = shards.shard_schema(4, precision, chunked)
    vectors = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    chunks = ([0, 1, 0], [0, 5, 0], [9, 14, 3]) if chunked else None
    return shards.shard_table(schema, ["a", "a", "b"], vectors, [5, 6, 3], chunks)


def test_the_embedding_column_is_a_fixed_size_list_of_the_asked_precision(tmp_path):
    for precision, arrow_type in (("float32", pa.float32()), ("float16", pa.float16())):
        shards.prepare_output(tmp_path)
        shards.write_shard(tmp_path, UNIT, table(precision), [])
        read = pq.read_table(shards.shard_path(tmp_path, UNIT.name))
        assert read.schema.field("embedding").type == pa.list_(pa.field("item", arrow_type, nullable=False), 4)
        values = np.asarray(read.column("embedding").to_pylist(), dtype=np.float32)
        expected = (np.arange(12, dtype=np.float32).reshape(3, 4) / 7).astype(precision)
        np.testing.assert_array_equal(values, expected.astype(np.float32))
        assert read.column("id").to_pylist() == ["a", "a", "b"] and read.column("tokens").to_pylist() == [5, 6, 3]


def test_chunked_shards_carry_the_chunk_and_its_span(tmp_path):
    shards.prepare_output(tmp_path)
    shards.write_shard(tmp_path, UNIT, table(chunked=True), [])
    read = pq.read_table(shards.shard_path(tmp_path, UNIT.name))
    assert read.column_names == ["id", "embedding", "tokens", "chunk", "char_start", "char_end"]
    assert read.column("chunk").to_pylist() == [0, 1, 0] and read.column("char_end").to_pylist() == [9, 14, 3]


def test_rejects_go_beside_the_shard(tmp_path):
    shards.prepare_output(tmp_path)
    shards.write_shard(tmp_path, UNIT, table(), [Rejected(FILE.uri, 2, None, "line is not valid JSON")])
    lines = shards.rejects_path(tmp_path, UNIT.name).read_text().splitlines()
    assert lines == ['{"source": "/data/a.jsonl", "row": 2, "doc_id": null, "reason": "line is not valid JSON"}']
    assert shards.done_units(tmp_path) == {UNIT.name}


def test_a_full_disk_leaves_no_shard_and_no_temporary_file(tmp_path, monkeypatch):
    shards.prepare_output(tmp_path)

    def full(table, path):
        with open(path, "wb") as handle:
            handle.write(b"PAR1 half a shard")
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(shards.pq, "write_table", full)
    with pytest.raises(CorpusError) as raised:
        shards.write_shard(tmp_path, UNIT, table(), [])
    message = str(raised.value)
    assert message.startswith(str(shards.shard_path(tmp_path, UNIT.name))) and "no space left" in message
    assert "run the same command again" in message and "\n" not in message
    assert shards.done_units(tmp_path) == set()
    assert not list(tmp_path.rglob(".tmp-*")) and not list(tmp_path.rglob("*.parquet"))


def test_stale_temporary_files_are_removed_and_never_count_as_done(tmp_path):
    shards.prepare_output(tmp_path)
    (tmp_path / "shards" / f".tmp-{UNIT.name}.parquet").write_bytes(b"half")
    (tmp_path / ".tmp-manifest.json").write_text("{")
    assert shards.done_units(tmp_path) == set()
    assert shards.prepare_output(tmp_path) == 2
    assert not list(tmp_path.rglob(".tmp-*"))


IDENTITY = {"pooling": "mean", "normalize": True, "dimensions": None, "output_precision": "float32"}
MODEL = {"checkpoint": "checkpoints/x", "weights_sha256": "ab" * 32}
INPUTS = [{"uri": "/data/a.jsonl", "format": "jsonl", "size": 10, "fingerprint": "10-1"}]


def refusal(**changes) -> str:
    manifest = {"identity": IDENTITY, "model": MODEL, "inputs": INPUTS}
    asked = {"identity": IDENTITY, "model": MODEL, "inputs": INPUTS, **changes}
    with pytest.raises(CorpusError) as raised:
        shards.check_manifest("out", manifest, asked["identity"], asked["model"], asked["inputs"])
    return str(raised.value)


def test_the_manifest_refuses_another_job_naming_what_differs():
    shards.check_manifest("out", {"identity": IDENTITY, "model": MODEL, "inputs": INPUTS}, IDENTITY, MODEL, INPUTS)
    assert "--dimensions (not set)" in refusal(identity={**IDENTITY, "dimensions": 8})
    assert "--output-precision float32" in refusal(identity={**IDENTITY, "output_precision": "float16"})
    assert "another model" in refusal(model={**MODEL, "weights_sha256": "cd" * 32})
    assert refusal(inputs=[{**INPUTS[0], "fingerprint": "11-2"}]).startswith("/data/a.jsonl: this input changed")
    assert refusal(inputs=[]).startswith("/data/a.jsonl: this input was part of the job and is gone")
    extra = {**INPUTS[0], "uri": "/data/b.jsonl"}
    assert refusal(inputs=INPUTS + [extra]).startswith("/data/b.jsonl: this input is new")
