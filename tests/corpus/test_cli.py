"""The command as a user meets it: its flags, its output's columns (float16, chunks with their spans), progress on a
terminal and in a log, the summary, and --ray without Ray installed."""

from __future__ import annotations

import io
import json
import sys
import time

import numpy as np
import pyarrow.parquet as pq

from corpus.cli import RAY_MISSING, main, parser, settings_from
from corpus.progress import Progress
from corpus.settings import JobSettings
from tests.corpus.job_helpers import embed_args, manifest, read_output, run_cli, sentences, write_jsonl


def test_flags_become_settings():
    args = parser().parse_args(["embed", "in/*.jsonl", "--output", "out", "--text-column", "body", "--id-column",
                                "key", "--pooling", "cls", "--no-normalize", "--dimensions", "32", "--dtype", "int8",
                                "--chunk-tokens", "100", "--chunk-overlap", "20", "--output-precision", "float16",
                                "--rows-per-shard", "500", "--on-error", "skip", "--max-batch-tokens", "4096"])
    settings = settings_from(args)
    assert settings == JobSettings(input="in/*.jsonl", output="out", checkpoint=settings.checkpoint,
                                   text_column="body", id_column="key", pooling="cls", normalize=False,
                                   dimensions=32, dtype="int8", chunk_tokens=100, chunk_overlap=20,
                                   output_precision="float16", rows_per_shard=500, on_error="skip",
                                   max_batch_tokens=4096)
    assert "input" not in settings.identity() and settings.identity()["chunk_tokens"] == 100


def test_float16_output_holds_the_float32_vectors_rounded(tmp_path, tiny_checkpoint):
    source = write_jsonl(tmp_path / "c.jsonl", sentences(20))
    assert main(embed_args(source, tmp_path / "f32", tiny_checkpoint, "--id-column", "id")) == 0
    assert main(embed_args(source, tmp_path / "f16", tiny_checkpoint, "--id-column", "id",
                           "--output-precision", "float16")) == 0
    shard = next((tmp_path / "f16" / "shards").glob("*.parquet"))
    assert str(pq.read_schema(shard).field("embedding").type.value_type) == "halffloat"
    full, half = read_output(tmp_path / "f32")["embedding"], read_output(tmp_path / "f16")["embedding"]
    np.testing.assert_array_equal(half, full.astype(np.float16).astype(np.float32))


def test_chunks_are_rows_with_their_document_index_and_span(tmp_path, tiny_checkpoint):
    texts = [" ".join(sentences(6, chars=300)), "a short one", " ".join(sentences(3, chars=200))]
    source = write_jsonl(tmp_path / "c.jsonl", texts)
    assert main(embed_args(source, tmp_path / "out", tiny_checkpoint, "--id-column", "id", "--chunk-tokens", "40",
                           "--chunk-overlap", "8")) == 0
    found = read_output(tmp_path / "out")
    by_doc = {}
    for row, doc in enumerate(found["id"]):
        by_doc.setdefault(doc, []).append(row)
    assert list(by_doc) == ["doc-0", "doc-1", "doc-2"] and len(by_doc["doc-1"]) == 1 and len(by_doc["doc-0"]) > 3
    for doc, rows in by_doc.items():
        assert [found["chunk"][r] for r in rows] == list(range(len(rows)))
        assert found["char_start"][rows[0]] == 0
        assert found["char_end"][rows[-1]] == len(texts[int(doc[4:])].rstrip())
    # Each chunk's vector is the vector of the chunk's own text, embedded whole: the span points at its characters.
    chunk_texts = [texts[int(doc[4:])][start:end]
                   for doc, start, end in zip(found["id"], found["char_start"], found["char_end"])]
    whole = write_jsonl(tmp_path / "chunks.jsonl", chunk_texts)
    assert main(embed_args(whole, tmp_path / "whole", tiny_checkpoint, "--id-column", "id")) == 0
    again = read_output(tmp_path / "whole")
    assert again["tokens"] == found["tokens"]
    np.testing.assert_allclose(again["embedding"], found["embedding"], rtol=1e-5, atol=1e-5)
    assert manifest(tmp_path / "out")["totals"]["rows"] == len(chunk_texts)


def test_progress_in_a_log_is_plain_lines_and_the_summary_follows(tmp_path, tiny_checkpoint):
    source = write_jsonl(tmp_path / "c.jsonl", sentences(30))
    done = run_cli(embed_args(source, tmp_path / "out", tiny_checkpoint, "--rows-per-shard", "10"))
    assert done.returncode == 0, done.stderr
    progress = [line for line in done.stderr.splitlines() if line.startswith("progress: ")]
    assert progress and "/30 rows" in progress[0] and "rows/s" in progress[0] and "ETA" in progress[0]
    assert "\r" not in done.stderr
    assert done.stdout.startswith("done: 30 rows read, 30 documents embedded (0 rejected) -> 30 vectors in 3 shards, ")
    assert "rows/s" in done.stdout and "tokens/s" in done.stdout


def test_progress_and_summary_count_the_same_rows_when_blank_lines_hold_no_document(tmp_path, tiny_checkpoint):
    """WikiText's test split as plain text: 789 lines, of which the blank ones are separators, not documents."""
    from tests.conftest import TEST_WIKITEXT

    source = TEST_WIKITEXT / "test.tokens"
    lines = source.read_text(encoding="utf-8").splitlines()
    documents = sum(1 for line in lines if line.strip())
    assert documents < len(lines)  # the case at hand: blank lines among the rows
    done = run_cli(embed_args(source, tmp_path / "out", tiny_checkpoint, "--format", "text", "--truncate"))
    assert done.returncode == 0, done.stderr
    last = [line for line in done.stderr.splitlines() if line.startswith("progress: ")][-1]
    assert last.startswith(f"progress: {len(lines)}/{len(lines)} rows,"), last
    assert done.stdout.startswith(f"done: {len(lines)} rows read, {documents} documents embedded (0 rejected) -> "
                                  f"{documents} vectors in 1 shard, "), done.stdout
    assert manifest(tmp_path / "out")["totals"]["rows"] == documents


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_is_a_bar_redrawn_in_place():
    screen = Terminal()
    progress = Progress(total_rows=100, done_rows=20, stream=screen, redraw_every_s=0)
    time.sleep(0.05)  # loading the model: apart from the rates
    progress.start()
    progress.computed(30, 900)
    progress.written(30, 28, 30, 1)
    summary = progress.finish()
    assert screen.getvalue().count("\r[") >= 2 and "50%" in screen.getvalue() and screen.getvalue().endswith("\n")
    assert (summary.rows, summary.documents, summary.vectors, summary.rejects, summary.tokens,
            summary.already_done) == (30, 28, 30, 1, 900, 20)
    assert summary.start_seconds >= 0.05 > summary.seconds
    assert "s loading the model" in summary.line()


def test_ray_without_ray_installed_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    assert main(["embed", str(tmp_path), "--output", str(tmp_path / "out"), "--ray"]) == 2
    assert capsys.readouterr().err.strip() == f"error: {RAY_MISSING}"
    assert "requirements/ray.txt" in RAY_MISSING


def test_the_manifest_names_the_model_and_every_option(tmp_path, tiny_checkpoint):
    source = write_jsonl(tmp_path / "c.jsonl", sentences(7))
    assert main(embed_args(source, tmp_path / "out", tiny_checkpoint, "--dimensions", "16")) == 0
    written = manifest(tmp_path / "out")
    assert written["complete"] and written["identity"]["dimensions"] == 16 and written["identity"]["pooling"] == "mean"
    assert len(written["model"]["weights_sha256"]) == 64
    assert written["inputs"][0]["uri"] == str(source) and written["inputs"][0]["fingerprint"]
    assert written["shards"] == [{"name": "part-00000-000000000000", "rows": 7, "rejects": 0,
                                  "tokens": written["totals"]["tokens"]}]
    json.dumps(written)


def test_the_readme_example_runs_as_written(tmp_path):
    """README.md's "Embed a corpus" commands, from a folder holding the repository's tests/ (so the output lands in
    the test's folder), with this interpreter for .venv/bin/python."""
    import os
    import re
    import subprocess

    from devkit.paths import REPO_ROOT

    section = (REPO_ROOT / "README.md").read_text().split("## Embed a corpus", 1)[1].split("\n## ", 1)[0]
    commands = re.search(r"```bash\n(.*?)```", section, re.DOTALL).group(1).strip().splitlines()
    (tmp_path / "tests").symlink_to(REPO_ROOT / "tests")
    outputs = []
    for command in commands:
        done = subprocess.run(command.replace(".venv/bin/python", sys.executable), shell=True, cwd=tmp_path,
                              capture_output=True, text=True, timeout=600,
                              env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    assert outputs[0].startswith("done: ") and outputs[-1].split()[0].isdigit()
    assert "[384]" in outputs[-1]
