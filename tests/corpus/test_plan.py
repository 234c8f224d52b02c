"""Work units: every line (record, row) of every file in exactly one unit, units cut where the plan says and
starting at the byte the plan says, the same plan for the same inputs."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpus import streams
from corpus.errors import CorpusError
from corpus.inputs import resolve_inputs
from corpus.plan import WorkUnit, make_plan, plan_from_json, plan_to_json
from corpus.streams import count_lines


def line_starts(data: bytes) -> list[int]:
    """Where each line starts, the slow obvious way."""
    starts, position = [], 0
    for line in data.splitlines(keepends=True):
        if line.endswith(b"\r") and not line.endswith(b"\n"):  # splitlines also splits at a lone \r
            raise AssertionError("test data must not hold a lone carriage return")
        starts.append(position)
        position += len(line)
    return starts


def random_lines(seed: int, count: int) -> bytes:
    rng = random.Random(seed)
    words = ["alpha", "beta", "", " ", "é", "東京", "🎉", '{"text": "x"}']
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 12))) for _ in range(count)]
    ending = rng.choice(["\n", "\r\n"])
    data = ending.join(lines)
    return (data + (ending if rng.random() < 0.5 else "")).encode()


def check_units_cover_the_lines(units: list[WorkUnit], data: bytes, rows_per_shard: int) -> None:
    starts = line_starts(data)
    assert [(u.row_start, u.row_stop) for u in units] == [
        (start, min(start + rows_per_shard, len(starts))) for start in range(0, len(starts), rows_per_shard)]
    assert [u.byte_offset for u in units] == starts[::rows_per_shard]
    assert len({u.name for u in units}) == len(units)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("block_bytes", [1, 5, 64, 1 << 22])
def test_line_counting_finds_every_unit_start_whatever_the_blocks(seed, block_bytes, monkeypatch):
    monkeypatch.setattr(streams, "BLOCK_BYTES", block_bytes)
    data = random_lines(seed, count=random.Random(seed).randint(0, 60))
    for every in (1, 2, 7, 1000):
        stream = iter([data[i:i + block_bytes] for i in range(0, len(data), block_bytes)])
        lines, offsets = count_lines(lambda size: next(stream, b""), every)
        starts = line_starts(data)
        assert lines == len(starts)
        assert offsets == starts[::every]


@pytest.mark.parametrize("rows_per_shard", [1, 3, 10, 10_000])
def test_jsonl_and_text_units(tmp_path, rows_per_shard):
    data = random_lines(7, 95)
    for name in ("a.jsonl", "b.txt"):
        (tmp_path / name).write_bytes(data)
    files = resolve_inputs(str(tmp_path))
    units = make_plan(files, rows_per_shard)
    assert [u.file_index for u in units] == sorted(u.file_index for u in units)
    for index, file in enumerate(files):
        own = [u for u in units if u.file_index == index]
        assert all(u.file == file for u in own)
        check_units_cover_the_lines(own, data, rows_per_shard)


def test_compressed_files_plan_offsets_into_the_decompressed_stream(tmp_path):
    data = random_lines(3, 200)
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(data))
    (tmp_path / "b.jsonl.xz").write_bytes(lzma.compress(data))
    (tmp_path / "c.jsonl.bz2").write_bytes(bz2.compress(data))
    try:
        import zstandard  # noqa: F401  (only to write the fixture; reading goes through pyarrow)
        (tmp_path / "d.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    except ImportError:
        pa_out = pa.BufferOutputStream()
        with pa.CompressedOutputStream(pa_out, "zstd") as compressed:
            compressed.write(data)
        (tmp_path / "d.jsonl.zst").write_bytes(pa_out.getvalue().to_pybytes())
    files = resolve_inputs(str(tmp_path))
    assert [f.compression for f in files] == ["gzip", "xz", "bz2", "zstd"]
    units = make_plan(files, 16)
    for index in range(len(files)):
        check_units_cover_the_lines([u for u in units if u.file_index == index], data, 16)


def test_csv_units_count_records_and_start_at_a_record(tmp_path):
    rows = ["id,text"]
    for number in range(23):
        text = f'"record {number}\nspans, ""lines""\n"' if number % 4 == 0 else f"record {number}"
        rows.append(f"{number},{text}")
        if number % 5 == 0:
            rows.append("")  # blank lines are no records
    data = ("\n".join(rows) + "\n").encode()
    (tmp_path / "t.csv").write_bytes(data)
    units = make_plan(resolve_inputs(str(tmp_path)), 5)
    assert len(units) == 5  # 23 records, 5 a unit
    assert units[0].row_start == 1 and units[-1].row_stop == data.count(b"\n")
    for unit, following in zip(units, units[1:]):
        assert unit.row_stop == following.row_start
    for unit in units:
        # each unit starts at the byte where its first record's line starts, and that record is the
        # (5k)-th one: "id" 0, 5, 10, ...
        assert data[unit.byte_offset:].split(b",", 1)[0] == str(units.index(unit) * 5).encode()
        assert line_starts(data)[unit.row_start] == unit.byte_offset


def test_parquet_units_come_from_the_metadata(tmp_path):
    table = pa.table({"text": [f"row {i}" for i in range(1003)]})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=100)
    units = make_plan(resolve_inputs(str(tmp_path)), 250)
    assert [(u.row_start, u.row_stop, u.byte_offset) for u in units] == [
        (0, 250, None), (250, 500, None), (500, 750, None), (750, 1000, None), (1000, 1003, None)]


def test_empty_files_have_no_units_and_the_plan_is_deterministic(tmp_path):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "header-only.csv").write_bytes(b"id,text\n")
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "empty.parquet")
    (tmp_path / "some.txt").write_bytes(b"one\ntwo\nthree\n")
    files = resolve_inputs(str(tmp_path))
    units = make_plan(files, 2)
    assert [(u.file.name, u.row_start, u.row_stop) for u in units] == [("some.txt", 0, 2), ("some.txt", 2, 3)]
    assert [u.file_index for u in units] == [3, 3]
    assert make_plan(resolve_inputs(str(tmp_path)), 2) == units
    assert plan_from_json(json.loads(json.dumps(plan_to_json(units)))) == units
    assert [u.name for u in units] == ["part-00003-000000000000", "part-00003-000000000002"]


def test_a_utf16_file_is_refused_once_with_what_to_do(tmp_path):
    (tmp_path / "wide.txt").write_bytes("one\ntwo\n".encode("utf-16"))
    with pytest.raises(CorpusError) as caught:
        make_plan(resolve_inputs(str(tmp_path)), 10)
    assert str(caught.value) == (f"{tmp_path / 'wide.txt'}: the file is UTF-16, not UTF-8 "
                                 "(convert it, e.g. iconv -f UTF-16 -t UTF-8 IN > OUT)")


@pytest.mark.parametrize("content", ["one\ntwo\n".encode("utf-16-le"), gzip.compress(b"one\ntwo\n"),
                                     b"\x00\x01binary"])
def test_a_file_that_is_not_utf8_text_at_all_is_refused_once(tmp_path, content):
    for name in ("t.txt", "t.jsonl", "t.csv"):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(CorpusError) as caught:
            make_plan(resolve_inputs(str(tmp_path / name)), 10)
        assert str(caught.value).startswith(f"{tmp_path / name}: the file holds NUL bytes: it is not UTF-8 text")


def test_a_file_that_is_not_parquet_is_refused_by_name(tmp_path):
    (tmp_path / "t.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(CorpusError, match=r"t\.parquet: not a readable Parquet file"):
        make_plan(resolve_inputs(str(tmp_path)), 10)


def test_rows_per_shard_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="rows_per_shard"):
        make_plan([], 0)


def test_the_plan_scales_to_a_large_file(tmp_path):
    """Half a million lines are counted in block passes, not a Python loop a line (figures: the report)."""
    path = tmp_path / "big.txt"
    path.write_bytes(b"a short line of text\n" * 500_000)
    units = make_plan(resolve_inputs(str(path)), 100_000)
    assert [u.byte_offset for u in units] == [i * 21 * 100_000 for i in range(5)]
    assert units[-1].row_stop == 500_000

