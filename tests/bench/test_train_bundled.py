"""The GPU training chain, on the CPU in seconds: a slice of Wikipedia prepared as token ids (trainer.data.prepared,
`make gpu-corpus`), a few warm-started steps from it (bench.gpu.train_bundled --dry-run), the result packed in parts
of at most 16 MiB with a manifest of hashes, joined and verified (bench.gpu.parts), and exported as a checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from bench.gpu import parts
from bench.gpu.train_bundled import WARM_START
from devkit.paths import REPO_ROOT
from model.checkpoint import load_checkpoint
from trainer.data.corpus import CorpusError
from trainer.data.prepared import cache_bytes, fit, load_prepared
from trainer.data.tokens import TokenizedCorpus

# Slices of the shared Wikipedia set's files, in its format (tests/data/README.md): the suite needs nothing beside it.
TEST_WIKIPEDIA = REPO_ROOT / "tests" / "data" / "wikipedia-en"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-corpus") / "wikipedia"
    result = subprocess.run([sys.executable, "-m", "trainer.data.prepared", "--corpus",
                             str(TEST_WIKIPEDIA / "enwiki-2021-recent-slice.txt.xz"), "--corpus",
                             str(TEST_WIKIPEDIA / "brown-slice.txt.xz"), "--init-from", str(WARM_START), "--mib", "0.25",
                             "--out", str(out), "--workers", "1"], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return out, json.loads(result.stdout)


def test_the_slice_fits_its_size_in_the_trainers_format(prepared):
    out, info = prepared
    assert 0.2 * 2**20 < info["bytes"] <= 0.25 * 2**20 and info["documents"] >= 4
    assert sum(f.stat().st_size for f in out.glob("*.bin")) == info["bytes"]
    corpus, checksum = load_prepared(out, load_checkpoint(WARM_START).tokenizer)
    assert corpus.num_tokens == info["tokens"] and checksum == info["checksum"]
    assert corpus.ids.max() < load_checkpoint(WARM_START).model.config.vocab_size


def test_a_slice_of_another_tokenizer_is_refused(prepared, tmp_path):
    out, _ = prepared
    info = json.loads((out / "prepared.json").read_text())
    other = tmp_path / "other"
    other.mkdir()
    for f in out.iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    (other / "prepared.json").write_text(json.dumps({**info, "tokenizer": "0123456789abcdef"}))
    with pytest.raises(CorpusError, match="prepared with another tokenizer"):
        load_prepared(other, load_checkpoint(WARM_START).tokenizer)


def test_fit_keeps_whole_documents_within_the_size():
    ids = np.arange(100, dtype=np.uint16)
    sentences = np.array([0, 10, 30, 50, 60, 100], dtype=np.int64)
    documents = np.array([0, 2, 3, 5], dtype=np.int64)
    corpus = TokenizedCorpus(ids, sentences, documents)
    assert cache_bytes(corpus) == 200 + 8 * 10
    for most in (0, 100, 150, 200, 279, 280, 10**6):
        kept = fit(corpus, most)
        assert cache_bytes(kept) <= most or kept.num_documents == 0
        if kept.num_documents < corpus.num_documents:
            assert cache_bytes(corpus.documents(0, kept.num_documents + 1)) > most


def test_train_on_the_slice_pack_join_verify_export(prepared, tmp_path):
    corpus, _ = prepared
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "bench.gpu.train_bundled", "--dry-run", "--corpus", str(corpus),
                             "--out", str(out), "--work", str(tmp_path / "work")], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    summary = json.loads((out / "train-summary.json").read_text())
    assert summary["packed"] == "final" and summary["steps"] == 4 and summary["tokens_per_s"] > 0
    assert 0.0 <= summary["input_wait"] <= 1.0
    assert summary["compiled_step"] == {"compiled": False, "cuda_graphs": False, "fell_back": None}
    assert summary["parts"]["count"] >= 3  # the bundled shape's float16 weights: 45 MB
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and all(p.stat().st_size <= 16 * 2**20 for p in out.iterdir())  # what comes back

    joined = tmp_path / "joined"
    assert parts.main(["join", str(out), str(joined)]) == 0
    checkpoint = load_checkpoint(joined)
    assert checkpoint.model.config.hidden_size == 384 and checkpoint.metadata["progress"]["step"] == 4

    exported = tmp_path / "exported"
    result = subprocess.run([sys.executable, "-m", "trainer.export", str(joined), str(exported), "--dtype", "float16"],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert load_checkpoint(exported).model.has_mlm_head and (exported / "README.md").is_file()


def test_a_damaged_or_missing_part_fails_the_join(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    (source / "model.safetensors").write_bytes(np.random.default_rng(0).bytes(40_000))
    (source / "config.json").write_text("{}")
    out = tmp_path / "out"
    manifest = parts.pack(source, out, part_bytes=16_384)
    assert len(manifest["parts"]) >= 3
    assert parts.join(out, tmp_path / "good")["sha256"] == manifest["sha256"]
    assert (tmp_path / "good" / "model.safetensors").read_bytes() == (source / "model.safetensors").read_bytes()
    second = out / manifest["parts"][1]["name"]
    data = bytearray(second.read_bytes())
    data[100] ^= 1
    second.write_bytes(bytes(data))
    with pytest.raises(parts.PartsError, match="part-001"):
        parts.join(out, tmp_path / "bad")
    second.unlink()
    with pytest.raises(parts.PartsError, match="part-001 is missing"):
        parts.join(out, tmp_path / "bad")
    (out / parts.MANIFEST).unlink()
    with pytest.raises(parts.PartsError, match="did not finish"):
        parts.join(out, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
