"""The training benchmark: its peer optimizes the same objective as our trainer, and the harness runs."""

from __future__ import annotations

import json
import subprocess
import sys

import torch
import torch.nn.functional as F

from bench.training.peer import IGNORED, pad_to, transformers_twin
from devkit.paths import REPO_ROOT
from tests.conftest import random_model
from trainer.forward import pretraining_logits


def test_peer_loss_equals_our_training_loss():
    """Same weights, same batch: the peer's padded full-vocabulary loss is our masked-positions loss."""
    ours = random_model(300, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).train()
    peer = transformers_twin(ours.config).train()
    peer.load_state_dict(ours.state_dict(), strict=False)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 300, (4, 20), generator=g)
    types = torch.zeros_like(ids)
    types[:, 10:] = 1
    mask = torch.ones_like(ids)
    mask[1, 14:] = 0
    positions = (torch.rand(ids.shape, generator=g) < 0.2) & mask.bool()
    positions[:, 0] = False
    positions[:, 3] = True
    nsp_labels = torch.tensor([0, 1, 1, 0])

    mlm, nsp, _ = pretraining_logits(ours, ids, types, mask, positions)
    our_loss = F.cross_entropy(mlm, ids[positions]) + F.cross_entropy(nsp, nsp_labels)
    labels = torch.where(positions, ids, IGNORED)
    width = 24  # the peer pads further, to --max-seq-len
    peer_loss = peer(input_ids=pad_to(ids, width, 0), token_type_ids=pad_to(types, width, 0),
                     attention_mask=pad_to(mask, width, 0), labels=pad_to(labels, width, IGNORED),
                     next_sentence_label=nsp_labels).loss
    torch.testing.assert_close(our_loss, peer_loss, rtol=0, atol=1e-5)


def test_training_benchmark_runs_both_systems(small_corpus, small_eval_corpus, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "bench.training.speed", "--minutes", "0.04", "--preset", "tiny", "--corpus", str(small_corpus),
         "--eval-corpus", str(small_eval_corpus), "--batch-size", "8", "--work", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [r["system"] for r in rows] == ["ours", "transformers"]
    for row in rows:
        # MFU counts every layer's full work; ours skips part of the last layer (a large share of a 2-layer model),
        # so against a peak measured on a shared CPU its figure can pass 1: it was 1.03 in one CI run.
        ceiling = 2 if row["system"] == "ours" else 1
        assert row["steps"] > 0 and row["tokens_per_s"] > 0 and 0 < row["mfu"] < ceiling
        assert 0 <= row["mlm_accuracy"] <= 1 and row["masked_tokens"] == rows[0]["masked_tokens"]
    assert "| ours |" in result.stdout and "| transformers |" in result.stdout
