"""Bad input met by the whole job: each stops it with one line naming the file (and row) and what to do, or under
--on-error skip goes to the rejects file with its reason; a full disk and a vanished input stop it with nothing
half-written, resumable by the same command."""

from __future__ import annotations

import errno
import json

import pytest

from corpus import local_job, local_output
from corpus.local_output import LocalOutput
from corpus.cli import main
from tests.corpus.job_helpers import embed_args, manifest, read_output, sentences

GOOD = sentences(12)


def corpus_with_faults(path):
    lines = [json.dumps({"id": f"doc-{i}", "text": t}) for i, t in enumerate(GOOD)]
    lines[3] = '{"id": "doc-3", "text": "unterminated'  # line 4: not JSON
    lines[6] = json.dumps({"id": "doc-6", "text": "   "})  # line 7: empty text
    lines[9] = json.dumps({"id": "doc-9", "text": "word " * 400})  # line 10: too long for 128 positions
    path.write_bytes(("\n".join(lines) + "\n").encode() + b'{"id": "doc-12", "text": "caf\xe9"}\n')  # line 13: Latin-1
    return path


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def test_the_first_bad_row_stops_the_job_naming_it_then_skip_resumes(tmp_path, tiny_checkpoint, capsys):
    source = corpus_with_faults(tmp_path / "c.jsonl")
    output = tmp_path / "out"
    args = embed_args(source, output, tiny_checkpoint, "--id-column", "id", "--rows-per-shard", "5")
    assert main(args) == 1
    message = last_line(capsys.readouterr().err)
    assert message.startswith(f"error: {source}:4: ") and "JSON" in message and "--on-error skip" in message
    assert LocalOutput(output).done_units() == set() and not manifest(output)["complete"]

    assert main([*args, "--on-error", "skip"]) == 0
    summary = capsys.readouterr().out
    assert "4 rejected" in summary, summary
    found = read_output(output)
    assert sorted(found["id"]) == sorted(f"doc-{i}" for i in range(12) if i not in (3, 6, 9))
    rejects = [json.loads(line) for path in sorted((output / "rejects").glob("*.jsonl"))
               for line in path.read_text().splitlines()]
    assert [r["row"] for r in rejects] == [4, 7, 10, 13]
    assert all(r["source"] == str(source) for r in rejects)
    assert "JSON" in rejects[0]["reason"] and "empty" in rejects[1]["reason"]
    assert "tokens long" in rejects[2]["reason"] and "--truncate" in rejects[2]["reason"]
    assert "UTF-8" in rejects[3]["reason"]
    assert manifest(output)["totals"] == {"rows": 9, "rejects": 4, "tokens": sum(found["tokens"])}


def test_a_too_long_document_is_embedded_under_truncate(tmp_path, tiny_checkpoint):
    source = tmp_path / "long.txt"
    source.write_text("word " * 400 + "\nshort line\n")
    assert main(embed_args(source, tmp_path / "out", tiny_checkpoint, "--truncate")) == 0
    found = read_output(tmp_path / "out")
    assert found["id"] == ["long.txt:1", "long.txt:2"] and found["tokens"][0] == 128


def test_a_missing_column_stops_before_any_work(tmp_path, tiny_checkpoint, capsys):
    source = tmp_path / "c.csv"
    source.write_text("id,body\n1,hello there\n")
    assert main(embed_args(source, tmp_path / "out", tiny_checkpoint, "--text-column", "text")) == 1
    message = last_line(capsys.readouterr().err)
    assert str(source) in message and "text" in message and "\n" not in message


def test_a_full_disk_stops_with_one_line_and_nothing_half_written(tmp_path, tiny_checkpoint, capsys, monkeypatch):
    source = tmp_path / "c.txt"
    source.write_text("\n".join(GOOD) + "\n")
    output = tmp_path / "out"
    args = embed_args(source, output, tiny_checkpoint, "--rows-per-shard", "4")
    real_write = local_output.pq.write_table
    written = []

    def fills_up(table, path):
        if written:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(path)
        real_write(table, path)
    monkeypatch.setattr(local_output.pq, "write_table", fills_up)
    assert main(args) == 1
    message = last_line(capsys.readouterr().err)
    assert message.startswith(f"error: {output / 'shards'}/part-") and "no space left" in message
    assert len(LocalOutput(output).done_units()) == 1 and not list(output.rglob(".tmp-*"))
    monkeypatch.setattr(local_output.pq, "write_table", real_write)
    assert main(args) == 0  # space again: the same command finishes the job
    assert read_output(output)["id"] == [f"c.txt:{i}" for i in range(1, 13)]


def test_an_input_that_vanishes_mid_run_stops_naming_it(tmp_path, tiny_checkpoint, capsys, monkeypatch):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.txt").write_text("\n".join(GOOD[:6]) + "\n")
    (folder / "b.txt").write_text("\n".join(GOOD[6:]) + "\n")
    real_read = local_job.read_unit

    def read_then_lose_b(unit, *args):
        (folder / "b.txt").unlink(missing_ok=True)
        return real_read(unit, *args)
    monkeypatch.setattr(local_job, "read_unit", read_then_lose_b)
    output = tmp_path / "out"
    assert main(embed_args(folder, output, tiny_checkpoint)) == 1
    message = last_line(capsys.readouterr().err)
    assert message.startswith(f"error: {folder / 'b.txt'}") and "\n" not in message
    assert not list(output.rglob(".tmp-*")) and not manifest(output)["complete"]
    monkeypatch.undo()
    assert main(embed_args(folder, output, tiny_checkpoint)) == 1  # resumed: the plan's input is gone, said so
    assert "is gone" in last_line(capsys.readouterr().err)


@pytest.mark.parametrize("flags, named", [
    (("--chunk-tokens", "200"), "--chunk-tokens"),
    (("--dimensions", "65"), "--dimensions"),
    (("--rows-per-shard", "0"), "--rows-per-shard"),
    (("--chunk-tokens", "8", "--chunk-overlap", "8"), "--chunk-overlap"),
])
def test_options_that_cannot_work_exit_2_naming_the_flag(tmp_path, tiny_checkpoint, capsys, flags, named):
    source = tmp_path / "c.txt"
    source.write_text("hello\n")
    assert main(embed_args(source, tmp_path / "out", tiny_checkpoint, *flags)) == 2
    message = last_line(capsys.readouterr().err)
    assert message.startswith("error: ") and named in message
