"""bench.corpus's fastembed peer: run from the peers' environment on the same model and sentences, its vectors are
ours (float32 both, through the corpus job's own path). Skipped where .venv-peers lacks fastembed, unless
BERT_REQUIRE_FASTEMBED is set."""

from __future__ import annotations

import os
import subprocess

import pytest

from bench.corpus.ours import job_settings, single_machine
from bench.corpus.run import cosines, fastembed_peer, read_vectors
from bench.corpus.texts import wikitext_sentences, write_corpus
from devkit.paths import REPO_ROOT, minilm_dir

PEERS_PYTHON = REPO_ROOT / ".venv-peers" / "bin" / "python"


def has_fastembed() -> bool:
    return PEERS_PYTHON.is_file() and subprocess.run([str(PEERS_PYTHON), "-c", "import fastembed"],
                                                     capture_output=True).returncode == 0


def test_fastembed_vectors_are_ours(tmp_path):
    if not has_fastembed():
        if os.environ.get("BERT_REQUIRE_FASTEMBED"):
            pytest.fail(f"{PEERS_PYTHON} cannot import fastembed: install requirements/peers.txt there")
        pytest.skip(f"{PEERS_PYTHON} has no fastembed (requirements/peers.txt)")
    corpus = write_corpus(tmp_path / "corpus.txt", wikitext_sentences(40))
    peer = fastembed_peer(str(PEERS_PYTHON), minilm_dir(), corpus, tmp_path / "fastembed", tmp_path)
    assert peer["rows"] == 40 and peer["seconds"] > 0
    single_machine(job_settings(minilm_dir(), corpus, tmp_path / "ours", "float32"))
    found = cosines(read_vectors(tmp_path / "ours" / "shards"), read_vectors(tmp_path / "fastembed"))
    assert len(found) == 40 and found.min() >= 0.999, found.min()
