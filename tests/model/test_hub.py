"""Checkpoints named by a Hugging Face Hub id, against a local stand-in for the Hub (tests/hub_stand_in.py):
what is fetched, revisions, every bad case as one line, cut transfers, offline, two processes at once."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import subprocess
import sys
import time

import pytest

from devkit.paths import REPO_ROOT
from model.hub import CheckpointSourceError, resolve_checkpoint
from tests.hub_stand_in import (CROSS_ENCODER_ID, GATED_ID, GATED_TOKEN, MINILM_ID, NEVER_FETCHED, PICKLE_ONLY_ID,
                                hub, minilm_dir, stand_in, tree)  # noqa: F401 - fixtures

LOADER_FILES = {"config.json", "model.safetensors", "vocab.txt", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "modules.json", "1_Pooling/config.json", "sentence_bert_config.json",
                "config_sentence_transformers.json", "README.md"}


def one_line_error(spec: str, *expected: str) -> str:
    with pytest.raises(CheckpointSourceError) as caught:
        resolve_checkpoint(spec)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(spec.split("@")[0]), message
    for text in expected:
        assert text in message, message
    return message


def test_a_local_directory_wins_over_a_hub_id(hub, tmp_path, monkeypatch):
    (tmp_path / "sentence-transformers" / "all-MiniLM-L6-v2").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    resolved = resolve_checkpoint(MINILM_ID)
    assert resolved.path.is_dir() and resolved.hub_id is None and resolved.commit is None
    assert hub.requests == []


def test_a_hub_id_fetches_only_what_the_loader_reads(hub, caplog):
    seen = []
    with caplog.at_level(logging.INFO, logger="model.hub"):
        resolved = resolve_checkpoint(MINILM_ID, progress=seen.append)
    assert resolved.hub_id == MINILM_ID and resolved.revision is None
    assert resolved.commit == hub.repos[MINILM_ID].revisions["main"] == resolved.path.name
    assert resolved.path.is_relative_to(hub.cache)
    source = tree(minilm_dir())
    assert tree(resolved.path) == {name: source[name] for name in LOADER_FILES}  # byte for byte, nothing else
    fetched = hub.fetched()
    assert not [path for path in fetched if any(path.endswith(name) for name in NEVER_FETCHED)]
    # progress: the files and bytes, to the caller and in the log
    last = seen[-1]
    assert last.files_done == last.files_total == len(LOADER_FILES)
    assert last.bytes_done == last.bytes_total == sum((minilm_dir() / n).stat().st_size for n in LOADER_FILES)
    assert any(0 < p.bytes_done < p.bytes_total for p in seen)  # seen while it ran, not only at the end
    logged = [r.getMessage() for r in caplog.records]
    assert any(f"downloading {MINILM_ID}: " in m and " MB" in m for m in logged)
    # a second start reads the cache: no file is transferred again
    before = len(hub.fetched())
    assert resolve_checkpoint(MINILM_ID) == resolved and len(hub.fetched()) == before


def test_a_revision_by_tag_and_by_commit(hub):
    main = resolve_checkpoint(CROSS_ENCODER_ID)
    tagged = resolve_checkpoint(f"{CROSS_ENCODER_ID}@v1")
    assert tagged.revision == "v1" and tagged.commit == hub.repos[CROSS_ENCODER_ID].revisions["v1"] != main.commit
    assert tree(tagged.path)["model.safetensors"] != tree(main.path)["model.safetensors"]
    pinned = resolve_checkpoint(f"{CROSS_ENCODER_ID}@{tagged.commit}")
    assert pinned.path == tagged.path and pinned.commit == tagged.commit


def test_an_unknown_id_or_revision_is_one_line_naming_it(hub):
    one_line_error("test-org/no-such-model", "no such model on the Hugging Face Hub", "HF_TOKEN")
    one_line_error(f"{CROSS_ENCODER_ID}@no-such-branch", "no revision 'no-such-branch'")
    for spec in ("/no/such/directory", "a/b/c", "just-a-name"):
        with pytest.raises(CheckpointSourceError, match="not a directory, and not a Hugging Face Hub id"):
            resolve_checkpoint(spec)


def test_a_gated_model_needs_its_token(hub, monkeypatch):
    one_line_error(GATED_ID, "gated", "set HF_TOKEN")
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    one_line_error(GATED_ID, "HF_TOKEN has no access")
    monkeypatch.setenv("HF_TOKEN", GATED_TOKEN)
    assert (resolve_checkpoint(GATED_ID).path / "model.safetensors").is_file()


def test_a_repository_with_only_pickle_weights_is_refused_before_any_download(hub):
    one_line_error(PICKLE_ONLY_ID, "only pickle weights (pytorch_model.bin)", "never loads")
    assert hub.fetched() == [] and hub.fetched("HEAD") == []


def test_a_transfer_cut_once_is_resumed_where_it_stopped(hub):
    hub.cuts["model.safetensors"] = 1  # 90 MB: the library has written whole 10 MB chunks when it is cut at half
    resolved = resolve_checkpoint(MINILM_ID)
    assert hub.ranges and hub.ranges[0] != "bytes=0-"  # asked for the rest, not the whole file again
    assert tree(resolved.path)["model.safetensors"] == tree(minilm_dir())["model.safetensors"]


def test_a_transfer_cut_for_good_leaves_nothing_half_written_and_the_next_start_fetches_it(hub, monkeypatch):
    import huggingface_hub.file_download

    monkeypatch.setattr(huggingface_hub.file_download.time, "sleep", lambda seconds: None)  # its retry pauses
    hub.cuts["model.safetensors"] = 100
    one_line_error(CROSS_ENCODER_ID, "the download was cut", "start again")
    storage = hub.cache / "models--test-org--tiny-cross-encoder"
    assert not list(storage.glob("snapshots/*/model.safetensors"))
    assert not list(storage.glob("blobs/*.incomplete"))  # the library deletes what it could not finish
    blobs = {p.name for p in storage.glob("blobs/*")}
    hub.cuts.clear()
    resolved = resolve_checkpoint(CROSS_ENCODER_ID)
    weights = hub.repos[CROSS_ENCODER_ID].commits[resolved.commit]["model.safetensors"]
    assert (resolved.path / "model.safetensors").read_bytes() == weights
    assert {p.name for p in storage.glob("blobs/*")} - blobs == {hashlib.sha256(weights).hexdigest()}


def test_offline_a_prefilled_cache_serves_without_a_request(hub, monkeypatch):
    online = resolve_checkpoint(CROSS_ENCODER_ID)
    tagged = resolve_checkpoint(f"{CROSS_ENCODER_ID}@v1")
    hub.requests.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_checkpoint(CROSS_ENCODER_ID) == online
    assert resolve_checkpoint(f"{CROSS_ENCODER_ID}@v1") == tagged
    assert hub.requests == []
    one_line_error(MINILM_ID, "HF_HUB_OFFLINE is set", "holds no complete copy", "docs/hub-models.md")
    assert hub.requests == []


def test_without_network_the_cache_serves_and_an_empty_cache_says_so(hub, monkeypatch):
    online = resolve_checkpoint(CROSS_ENCODER_ID)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")  # nothing listens there
    assert resolve_checkpoint(CROSS_ENCODER_ID) == online
    one_line_error(MINILM_ID, "holds no complete copy", "connect once")


def test_a_disk_too_small_is_refused_before_downloading(hub, monkeypatch):
    import model.hub

    cached = resolve_checkpoint(CROSS_ENCODER_ID)
    monkeypatch.setattr(model.hub.shutil, "disk_usage", lambda path: type("Usage", (), {"free": 10_000_000})())
    one_line_error(MINILM_ID, "not enough disk space", "needs 92 MB but 10 MB are free", "HF_HOME")
    assert [path for path in hub.fetched() if MINILM_ID in path] == []
    assert resolve_checkpoint(CROSS_ENCODER_ID) == cached  # what is cached needs no space


def test_a_disk_that_fills_up_during_the_download_is_one_line(hub, monkeypatch):
    import errno

    import huggingface_hub

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", full)
    one_line_error(CROSS_ENCODER_ID, "not enough disk space", "filled up")


def test_two_processes_resolving_one_id_on_one_cache_at_once(hub):
    """Two replicas starting together: both get the complete snapshot, nothing is left half-written."""
    hub.delay_s = 0.002  # about 0.4 s per MiniLM file transfer of 90 MB: the two overlap
    script = ("import json, sys; from model.hub import resolve_checkpoint; "
              "r = resolve_checkpoint(sys.argv[1]); print(json.dumps([str(r.path), r.commit]))")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    started = time.perf_counter()
    processes = [subprocess.Popen([sys.executable, "-c", script, MINILM_ID], env=env, cwd=REPO_ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [process.communicate(timeout=120) for process in processes]
    assert all(process.returncode == 0 for process in processes), [err[-2000:] for _, err in results]
    paths = {tuple(json.loads(out)) for out, _ in results}
    assert len(paths) == 1, paths
    source = tree(minilm_dir())
    assert tree(resolve_checkpoint(MINILM_ID).path) == {name: source[name] for name in LOADER_FILES}
    assert not list(hub.cache.rglob("*.incomplete"))
    # both asked for the weights; the file lock let one write them (the other found them done, or resumed)
    assert len([p for p in hub.fetched("HEAD") if p.endswith("model.safetensors")]) == 2
    assert time.perf_counter() - started < 120


def test_prefilling_the_cache_for_an_offline_start(hub, monkeypatch):
    """`python -m model.hub ID` (what the Helm chart's init container runs) fills the cache an offline start reads."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    spec = f"{CROSS_ENCODER_ID}@v1"
    done = subprocess.run([sys.executable, "-m", "model.hub", spec], env=env, cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    hub.requests.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    resolved = resolve_checkpoint(spec)
    assert str(resolved.path) == done.stdout.strip() and hub.requests == []
    assert resolved.commit == hub.repos[CROSS_ENCODER_ID].revisions["v1"]
    bad = subprocess.run([sys.executable, "-m", "model.hub", "test-org/nope"], env={**env, "HF_HUB_OFFLINE": "0"},
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("error: test-org/nope: no such")
