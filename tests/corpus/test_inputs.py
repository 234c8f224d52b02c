"""INPUT resolved into files: a file, a directory read recursively, a glob; formats and compression from the
names; one-line errors that say what to do when nothing usable is there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corpus.errors import CorpusError
from corpus.inputs import InputFile, detect_format, resolve_inputs


def touch(path: Path, text: str = "x\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def tree(tmp_path) -> Path:
    root = tmp_path / "corpus"
    for name in ("b.jsonl", "a/x.jsonl", "a/deeper/y.csv", "c/x.jsonl", "d.txt", "e.parquet", "f.ndjson.gz",
                 "g.txt.zst", "h.csv.xz", "i.jsonl.bz2",
                 # beside the data, never documents
                 "_SUCCESS", ".hidden.jsonl", "_tmp/z.jsonl", ".git/q.txt", "README.md", "notes.json"):
        touch(root / name)
    return root


def names(files: list[InputFile]) -> list[str]:
    return [f.name for f in files]


def test_a_directory_is_read_recursively_sorted_skipping_hidden_and_unknown_names(tree):
    files = resolve_inputs(str(tree))
    assert names(files) == ["a/deeper/y.csv", "a/x.jsonl", "b.jsonl", "c/x.jsonl", "d.txt", "e.parquet",
                            "f.ndjson.gz", "g.txt.zst", "h.csv.xz", "i.jsonl.bz2"]
    assert [f.uri for f in files] == sorted(f.uri for f in files)
    assert all(os.path.isabs(f.uri) and f.uri == str(tree / f.name) for f in files)
    by_name = {f.name: (f.format, f.compression) for f in files}
    assert by_name["a/deeper/y.csv"] == ("csv", None) and by_name["e.parquet"] == ("parquet", None)
    assert by_name["f.ndjson.gz"] == ("jsonl", "gzip") and by_name["g.txt.zst"] == ("text", "zstd")
    assert by_name["h.csv.xz"] == ("csv", "xz") and by_name["i.jsonl.bz2"] == ("jsonl", "bz2")
    # the same name in two folders stays two names: generated ids are made from them
    assert len({f.name for f in files}) == len(files)
    # a trailing slash names the same directory
    assert resolve_inputs(str(tree) + "/") == files


def test_a_glob_and_a_recursive_glob(tree):
    assert names(resolve_inputs(str(tree / "*.jsonl"))) == ["b.jsonl"]
    assert names(resolve_inputs(str(tree / "**" / "x.jsonl"))) == ["a/x.jsonl", "c/x.jsonl"]
    # names are relative to the part of the pattern before its first wildcard
    assert names(resolve_inputs(str(tree / "a" / "*" / "*.csv"))) == ["deeper/y.csv"]


def test_a_file_named_outright(tree):
    [file] = resolve_inputs(str(tree / "a" / "x.jsonl"))
    assert (file.name, file.format, file.size) == ("x.jsonl", "jsonl", 2)
    # a name without a known suffix needs --format, and then is read as that
    with pytest.raises(CorpusError, match=r"cannot tell the format .*--format"):
        resolve_inputs(str(tree / "notes.json"))
    [forced] = resolve_inputs(str(tree / "notes.json"), format="jsonl")
    assert forced.format == "jsonl"


def test_format_given_reads_every_visible_file_of_a_directory_as_that(tmp_path):
    touch(tmp_path / "one.data")
    touch(tmp_path / "two.log.gz")
    touch(tmp_path / "_SUCCESS")
    files = resolve_inputs(str(tmp_path), format="text")
    assert [(f.name, f.format, f.compression) for f in files] == [("one.data", "text", None),
                                                                  ("two.log.gz", "text", "gzip")]


def test_nothing_usable_is_one_line_that_says_what_was_there(tmp_path):
    touch(tmp_path / "README.md")
    touch(tmp_path / "data.json")
    with pytest.raises(CorpusError) as caught:
        resolve_inputs(str(tmp_path))
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{tmp_path}: no input files")
    assert "README.md" in message and "data.json" in message and "--format" in message

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CorpusError, match="holds no files"):
        resolve_inputs(str(empty))
    with pytest.raises(CorpusError, match="no such file or directory"):
        resolve_inputs(str(tmp_path / "missing.jsonl"))
    with pytest.raises(CorpusError, match="no input files"):
        resolve_inputs(str(tmp_path / "*.parquet"))
    with pytest.raises(CorpusError, match="unknown format 'xml'"):
        resolve_inputs(str(tmp_path), format="xml")


def test_an_address_without_a_file_system_is_one_line():
    with pytest.raises(CorpusError) as caught:
        resolve_inputs("nosuchscheme://bucket/data.jsonl")
    assert str(caught.value).startswith("nosuchscheme://bucket/data.jsonl: no file system for this address")
    assert "s3://" in str(caught.value) and "\n" not in str(caught.value)


def test_a_compressed_parquet_file_is_refused(tmp_path):
    touch(tmp_path / "t.parquet.gz")
    with pytest.raises(CorpusError, match="Parquet file cannot be compressed"):
        resolve_inputs(str(tmp_path))


def test_the_fingerprint_changes_with_the_file(tmp_path):
    path = touch(tmp_path / "a.jsonl", '{"text": "one"}\n')
    [before] = resolve_inputs(str(path))
    assert resolve_inputs(str(path)) == [before]  # stable while nothing changes
    path.write_text('{"text": "two"}\n', encoding="utf-8")  # the same size
    os.utime(path, ns=(1, 1))
    [after] = resolve_inputs(str(path))
    assert after.fingerprint != before.fingerprint and after.size == before.size


def test_input_files_travel_as_json(tree):
    files = resolve_inputs(str(tree))
    assert [InputFile.from_json(f.to_json()) for f in files] == files


@pytest.mark.parametrize(("name", "expected"), [
    ("a.JSONL", ("jsonl", None)), ("x/y.csv.gz", ("csv", "gzip")), ("t.text.zstd", ("text", "zstd")),
    ("p.pq", ("parquet", None)), ("a.json", (None, None)), ("a.gz", (None, "gzip")),
])
def test_detect_format(name, expected):
    assert detect_format(name) == expected
