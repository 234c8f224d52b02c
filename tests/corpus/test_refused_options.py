"""An option the model or the device cannot take is refused before the job writes anything, so the corrected command
works: each refused flag, then the corrected command, into a directory and into a bucket; and a stopped job's
output that a refused run meets is left exactly as it was, then resumed by the corrected command."""

from __future__ import annotations

import pytest
import torch

from corpus.cli import main
from tests.corpus import job_helpers
from tests.corpus.job_helpers import embed_args, manifest, read_output, sentences, write_jsonl
from tests.optional import required_or_skip

ROWS = 30
OPTIONS = ("--id-column", "id", "--rows-per-shard", "10")
# (refused flags, the flag the message names, the corrected flags); the tiny model is 64 wide, 128 positions long
REFUSED = [
    (("--dimensions", "65"), "--dimensions", ("--dimensions", "16")),
    (("--chunk-tokens", "200"), "--chunk-tokens", ("--chunk-tokens", "40")),
    (("--max-batch-tokens", "64"), "--max-batch-tokens", ()),
    (("--dtype", "int8"), "--dtype int8", ()),  # refused on a GPU: the device below says cuda
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", sentences(ROWS))


@pytest.fixture(scope="module")
def endpoint():
    required_or_skip("moto.server", "BERT_REQUIRE_MOTO", "moto (requirements/dev.txt) is the local S3 server")
    from tests.corpus.object_store import local_store

    with local_store() as url:
        yield url


def on_a_gpu(monkeypatch) -> None:
    """CUDA seems present, so the engine's device is a GPU (int8 is refused before any CUDA call: this machine need
    not have one)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def refused(args: list[str], named: str, capsys, monkeypatch) -> str:
    with monkeypatch.context() as patched:
        if "int8" in args:
            on_a_gpu(patched)
        assert main(args) == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message.startswith("error: ") and named in message, message
    return message


@pytest.mark.parametrize("flags, named, corrected", REFUSED, ids=[r[1] for r in REFUSED])
def test_a_refused_flag_leaves_no_directory_and_the_corrected_command_works(tmp_path, corpus, tiny_checkpoint,
                                                                            capsys, monkeypatch, flags, named,
                                                                            corrected):
    output = tmp_path / "out"
    refused(embed_args(corpus, output, tiny_checkpoint, *OPTIONS, *flags), named, capsys, monkeypatch)
    assert not output.exists()
    assert main(embed_args(corpus, output, tiny_checkpoint, *OPTIONS, *corrected)) == 0
    assert manifest(output)["complete"] and len(set(read_output(output)["id"])) == ROWS


@pytest.mark.parametrize("flags, named, corrected", REFUSED, ids=[r[1] for r in REFUSED])
def test_a_refused_flag_writes_no_object_and_the_corrected_command_works(endpoint, corpus, tiny_checkpoint, capsys,
                                                                         monkeypatch, tmp_path, flags, named,
                                                                         corrected):
    from tests.corpus.object_store import BUCKET, download, keys, use_store

    use_store(monkeypatch, endpoint)
    prefix = f"refused-{named.split()[-1].strip('-')}"
    output = f"s3://{BUCKET}/{prefix}"
    refused(embed_args(corpus, output, tiny_checkpoint, *OPTIONS, *flags), named, capsys, monkeypatch)
    assert keys(endpoint, prefix) == {}
    assert main(embed_args(corpus, output, tiny_checkpoint, *OPTIONS, *corrected)) == 0
    local = download(endpoint, prefix, tmp_path)
    assert manifest(local)["complete"] and len(set(read_output(local)["id"])) == ROWS


def snapshot(folder) -> dict:
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("flags, named", [(("--max-batch-tokens", "64"), "--max-batch-tokens"),
                                          (("--dimensions", "65"), "--dimensions")])
def test_a_stopped_job_met_by_a_refused_flag_is_left_as_it_was_then_resumed(tmp_path, corpus, tiny_checkpoint,
                                                                            capsys, monkeypatch, flags, named):
    output = tmp_path / "out"
    args = embed_args(corpus, output, tiny_checkpoint, *OPTIONS)
    job_helpers.kill_at("committing:2", args, tmp_path / "paused")  # one shard done, one staged under .tmp-
    before = snapshot(output)
    assert any(".tmp-" in name for name in before)
    with monkeypatch.context():
        assert main([*args, *flags]) in (1, 2)  # 2: the model refuses it; 1: the manifest does (another job)
    assert named in capsys.readouterr().err.strip().splitlines()[-1]
    assert snapshot(output) == before
    assert main(args) == 0
    assert sorted(read_output(output)["id"]) == sorted(f"doc-{i}" for i in range(ROWS))
