"""Reading units: the documents of a file in order, each row once whatever the unit size; every row fault a
`Rejected` naming the file, the row and the fault; every file fault one line that says what to do."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.csv  # noqa: F401  (pa.csv)
import pyarrow.parquet as pq
import pytest

from corpus.errors import CorpusError, Rejected
from corpus.inputs import resolve_inputs
from corpus.plan import make_plan
from corpus.readers import Document, check_columns, read_unit
from tests.conftest import wikitext_lines


def read_all(spec: Path | str, rows_per_shard: int = 10_000, text_column=None, id_column=None, format=None):
    files = resolve_inputs(str(spec), format=format)
    return [item for unit in make_plan(files, rows_per_shard)
            for item in read_unit(unit, text_column, id_column)]


def brief(items) -> list[tuple]:
    return [(type(item).__name__, item.row, item.doc_id, item.text if isinstance(item, Document) else item.reason)
            for item in items]


def jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("rows_per_shard", [1, 2, 7, 10_000])
def test_real_text_reads_back_whole_in_every_format_whatever_the_units(tmp_path, rows_per_shard):
    texts = wikitext_lines("test", limit=40)
    jsonl(tmp_path / "w.jsonl", [{"text": t, "n": i} for i, t in enumerate(texts)])
    (tmp_path / "w.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    with gzip.open(tmp_path / "w.txt.gz", "wt", encoding="utf-8") as handle:
        handle.write("\n".join(texts))  # no newline at the end
    pa_table = pa.table({"text": texts, "n": list(range(len(texts)))})
    pq.write_table(pa_table, tmp_path / "w.parquet", row_group_size=3)
    pa.csv.write_csv(pa_table, tmp_path / "w.csv")
    for name in ("w.jsonl", "w.txt", "w.txt.gz", "w.parquet", "w.csv"):
        items = read_all(tmp_path / name, rows_per_shard)
        assert all(isinstance(item, Document) for item in items), name
        assert [item.text for item in items] == texts, name
        first_row = 2 if name == "w.csv" else 1  # the CSV header is line 1
        assert [item.row for item in items] == list(range(first_row, first_row + len(texts))), name
        assert [item.doc_id for item in items] == [f"{name}:{row}" for row in range(first_row, first_row + 40)]
        assert {item.source for item in items} == {str(tmp_path / name)}


def test_jsonl_row_faults_are_rejects_in_place(tmp_path):
    path = tmp_path / "r.jsonl"
    lines = [b'{"text": "first", "id": 7}', b"", b'{"text": "  \\t "}', b'{"text": 5}', b'{"text": null}',
             b'{"body": "x", "title": "y"}', b"{not json", b'["text"]', b'"a bare string is a document"',
             b'{"text": "caf\xe9"}', b"\xff\xfe", b"   ", b'{"text": "last, no newline"}']
    path.write_bytes(b"\n".join(lines))
    assert brief(read_all(path, rows_per_shard=4)) == [
        ("Document", 1, "r.jsonl:1", "first"),
        ("Rejected", 3, "r.jsonl:3", "empty text"),
        ("Rejected", 4, "r.jsonl:4", "text is int, not a string"),
        ("Rejected", 5, "r.jsonl:5", "text is null"),
        ("Rejected", 6, "r.jsonl:6", "no field 'text' (fields: 'body', 'title'; name the right one with "
                                     "--text-column / --id-column)"),
        ("Rejected", 7, "r.jsonl:7", "line is not valid JSON: unexpected character, expected a string key: "
                                     "line 1 column 2 (char 1)"),
        ("Rejected", 8, "r.jsonl:8", "line is a JSON list, not an object"),
        ("Document", 9, "r.jsonl:9", "a bare string is a document"),
        ("Rejected", 10, "r.jsonl:10", "line is not valid UTF-8 (byte 0xe9 at byte 14 of the line; is the file "
                                       "in another encoding? convert it with iconv)"),
        ("Rejected", 11, "r.jsonl:11", "line is not valid UTF-8 (byte 0xff at byte 1 of the line; is the file in "
                                       "another encoding? convert it with iconv)"),
        ("Document", 13, "r.jsonl:13", "last, no newline"),
    ]


def test_jsonl_ids_and_columns(tmp_path):
    path = jsonl(tmp_path / "ids.jsonl", [
        {"doc": "a", "key": "k1"}, {"doc": "b", "key": 2}, {"doc": "c", "key": "k1"}, {"doc": "d"},
        {"doc": "e", "key": None}, {"doc": "f", "key": True}, {"doc": "g", "key": 1.5}, {"doc": "h", "key": ""},
        {"text": "i", "key": "k9"}])
    assert brief(read_all(path, text_column="doc", id_column="key")) == [
        ("Document", 1, "k1", "a"),
        ("Document", 2, "2", "b"),
        ("Document", 3, "k1", "c"),  # a duplicate id is kept: rows, not ids, are what the output holds once
        ("Rejected", 4, None, "no field 'key'"),
        ("Rejected", 5, None, "id is null"),
        ("Rejected", 6, None, "id is bool, not a string or an integer"),
        ("Rejected", 7, None, "id is float, not a string or an integer"),
        ("Rejected", 8, None, "empty id"),
        ("Rejected", 9, "k9", "no field 'doc' (fields: 'text', 'key'; name the right one with --text-column / "
                              "--id-column)"),
    ]


def test_text_lines_keep_their_characters_and_skip_blank_lines(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(b"\xef\xbb\xbfwith a BOM\r\n\r\n  spaced  out \r\n\t\n\xe2\x80\x83x\xc3\n  \nend")
    assert brief(read_all(path)) == [
        ("Document", 1, "t.txt:1", "with a BOM"),
        ("Document", 3, "t.txt:3", "  spaced  out "),
        ("Rejected", 5, "t.txt:5", "line is not valid UTF-8 (byte 0xc3 at byte 5 of the line; is the file in "
                                   "another encoding? convert it with iconv)"),
        ("Document", 7, "t.txt:7", "end"),
    ]
    with pytest.raises(CorpusError, match="a plain text file has no columns"):
        read_all(path, text_column="text")


def test_csv_records_faults_and_columns(tmp_path):
    path = tmp_path / "c.csv"
    path.write_bytes(b'\xef\xbb\xbfid,text,extra\n'
                     b'1,"spans\nlines, with ""quotes""",x\n'
                     b'2,too few\n'
                     b'3,"a "stray" quote",x\n'
                     b'\n'
                     b'4,,x\n'
                     b'5,caf\xe9,x\n'
                     b'6,"fine after the faults",x\n'
                     b'7,"unterminated\nto the end,x\n')
    assert brief(read_all(path, rows_per_shard=2, id_column="id")) == [
        ("Document", 2, "1", 'spans\nlines, with "quotes"'),
        ("Rejected", 4, None, "the record has 2 fields where the header has 3"),
        ("Rejected", 5, None, "not a valid CSV record: ',' expected after '\"'"),
        ("Rejected", 7, "4", "empty text"),
        ("Rejected", 8, "5", "the record is not valid UTF-8 (is the file in another encoding? convert it with "
                              "iconv)"),
        ("Document", 9, "6", "fine after the faults"),
        ("Rejected", 10, None, "not a valid CSV record: unexpected end of data"),
    ]
    with pytest.raises(CorpusError) as caught:
        read_all(path, text_column="body")
    assert str(caught.value) == (f"{path}: no column 'body' (columns: 'id', 'text', 'extra') "
                                 "(name the right one with --text-column / --id-column)")


def test_parquet_rows_nulls_ids_and_row_groups(tmp_path):
    path = tmp_path / "p.parquet"
    texts = ["a", None, "", "d", " ", "f", "g"]
    pq.write_table(pa.table({"body": texts, "key": [10, 11, 12, None, 14, 15, 15]}), path, row_group_size=2)
    assert brief(read_all(path, rows_per_shard=3, text_column="body", id_column="key")) == [
        ("Document", 1, "10", "a"), ("Rejected", 2, "11", "text is null"), ("Rejected", 3, "12", "empty text"),
        ("Rejected", 4, None, "id is null"), ("Rejected", 5, "14", "empty text"), ("Document", 6, "15", "f"),
        ("Document", 7, "15", "g"),
    ]
    # large and dictionary-encoded strings are text too, and so are bytes that are UTF-8
    pq.write_table(pa.table({"text": pa.array(["x", "y"], pa.large_string()).dictionary_encode()}), path)
    assert [item.text for item in read_all(path)] == ["x", "y"]
    pq.write_table(pa.table({"n": [1, 2, 3], "text": pa.array(["é".encode(), b"caf\xe9", b""], pa.binary())}), path)
    assert brief(read_all(path, id_column="n")) == [
        ("Document", 1, "1", "é"), ("Rejected", 2, "2", "text is not valid UTF-8 (byte 0xe9 at byte 4)"),
        ("Rejected", 3, "3", "empty text")]


def test_parquet_schema_faults_name_the_columns(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"body": ["a"], "n": [1], "f": [0.5]}), path)
    with pytest.raises(CorpusError) as caught:
        read_all(path)
    assert str(caught.value) == (f"{path}: no column 'text' (columns: 'body', 'n', 'f') "
                                 "(name the right one with --text-column / --id-column)")
    with pytest.raises(CorpusError, match=r"column 'n' is int64, not text"):
        read_all(path, text_column="n")
    with pytest.raises(CorpusError, match=r"id column 'f' is double, not a string or an integer"):
        read_all(path, text_column="body", id_column="f")
    with pytest.raises(CorpusError, match=r"no column 'key'"):
        check_columns(resolve_inputs(str(path)), "body", "key")
    check_columns(resolve_inputs(str(path)), "body", "n")


def test_check_columns_fails_before_any_work(tmp_path):
    (tmp_path / "a.csv").write_text("id,body\n1,x\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("x\n", encoding="utf-8")
    files = resolve_inputs(str(tmp_path))
    with pytest.raises(CorpusError, match=r"a\.csv: no column 'text' \(columns: 'id', 'body'\)"):
        check_columns(files, None, None)
    with pytest.raises(CorpusError, match=r"b\.txt: a plain text file has no columns"):
        check_columns(files, "body", None)
    check_columns(files[:1], "body", "id")


def test_a_file_that_vanishes_or_changes_after_the_plan(tmp_path):
    path = jsonl(tmp_path / "v.jsonl", [{"text": "one"}, {"text": "two"}])
    [unit, second] = make_plan(resolve_inputs(str(path)), 1)
    path.write_text('{"text": "one"}\n{"text": "two"}\n{"text": "three"}\n', encoding="utf-8")
    with pytest.raises(CorpusError) as caught:
        list(read_unit(second, None, None))
    assert str(caught.value).startswith(f"{path}: the file changed since the job was planned")
    assert "\n" not in str(caught.value) and "new output directory" in str(caught.value)
    path.unlink()
    with pytest.raises(CorpusError) as caught:
        list(read_unit(unit, None, None))
    assert str(caught.value) == (f"{path}: the file is gone (it was there when the job was planned) "
                                 "(restore it, or start again in a new output directory)")


def test_a_file_it_may_not_read_is_one_line(tmp_path, monkeypatch):
    path = jsonl(tmp_path / "locked.jsonl", [{"text": "one"}])
    [unit] = make_plan(resolve_inputs(str(path)), 10)
    import fsspec.implementations.local as local  # as root, chmod cannot lock a file: the file system refuses

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(local.LocalFileSystem, "_open", refuse)
    with pytest.raises(CorpusError) as caught:
        list(read_unit(unit, None, None))
    assert str(caught.value) == (f"{path}: not allowed to read it: [Errno 13] Permission denied "
                                 "(check its permissions or the credentials)")


def test_a_truncated_compressed_file_is_a_file_fault(tmp_path):
    path = tmp_path / "t.jsonl.gz"
    whole = gzip.compress(b"".join(b'{"text": "line %d"}\n' % i for i in range(2000)))
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(CorpusError, match=r"t\.jsonl\.gz: cannot read it: .* \(check that the file is whole"):
        read_all(path)


def test_rejects_become_one_line_errors(tmp_path):
    reject = Rejected("data/r.jsonl", 12, "r.jsonl:12", "line is not valid JSON: oops")
    assert str(reject.as_error()) == ("data/r.jsonl:12: line is not valid JSON: oops (fix or remove that row, or "
                                      "run with --on-error skip to write such rows to the rejects file)")
    assert reject.as_error().rejected("r.jsonl:12") == reject
    assert reject.to_json() == {"source": "data/r.jsonl", "row": 12, "doc_id": "r.jsonl:12",
                                "reason": "line is not valid JSON: oops"}
    error = CorpusError("s3://b/k.csv", "two\nlines", "a\nhint")
    assert str(error) == "s3://b/k.csv: two lines (a hint)"
    with pytest.raises(ValueError):
        error.rejected()
    import pickle  # the job's worker processes and Ray pass errors between processes this way
    assert str(pickle.loads(pickle.dumps(error))) == str(error)


def test_a_compressed_file_is_decompressed_once_for_its_units_in_order(tmp_path, monkeypatch):
    from corpus import streams

    texts = [f"document {i} " + "word " * (i % 17) + "long" * (i % 7 * 100) for i in range(3000)]
    data = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(data))
    (tmp_path / "b.csv.gz").write_bytes(gzip.compress(("text\n" + "\n".join(texts) + "\n").encode()))
    monkeypatch.setattr(streams, "BLOCK_BYTES", 4096)  # many blocks a unit
    decompressed, opened = [], []
    original = streams._decompressed

    def counting(raw, compression):
        stream = original(raw, compression)
        opened.append(compression)

        class Counted:
            def read(self, size):
                block = stream.read(size)
                decompressed.append(len(block))
                return block

            def close(self):
                stream.close()

        return Counted()

    monkeypatch.setattr(streams, "_decompressed", counting)
    files = resolve_inputs(str(tmp_path))
    units = make_plan(files, 100)
    decompressed.clear()
    opened.clear()
    in_order = [item for unit in units for item in read_unit(unit, None, None)]
    assert [d.text for d in in_order] == texts + texts
    csv_units = sum(1 for unit in units if unit.file.format == "csv")
    assert len(opened) == 2 + csv_units  # each file's stream once, and the CSV header once a unit
    # one pass over each file (the CSV header is read again for each unit: a block each), not one per unit
    assert sum(decompressed) <= 2 * len(data) + 4096 * len(units)
    # any order still reads right: a stream already past a unit's start is opened again
    shuffled = units[::-1] + units[::2]
    again = {unit.name: list(read_unit(unit, None, None)) for unit in shuffled}
    assert [item for unit in units for item in again[unit.name]] == in_order
