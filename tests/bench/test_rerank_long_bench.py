"""bench/rerank/long_inputs.py on the tiny checkpoint (windows of 128 tokens, passages of 50 words so that they
fit): the chunked vector against its windows embedded one by one, and the rounds whose median is the benchmark's
figure (a quick run's figures mean nothing; that they come from what was timed is what is tested)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.rerank import long_inputs, texts


def test_a_long_document_equals_its_windows_and_each_round_gives_a_ratio(tiny_checkpoint):
    found = long_inputs.measure(tiny_checkpoint, texts.long_document(600), texts.passages(48, words=50), rounds=3)
    assert found.windows > 3 and found.tokens > 3 * 128  # several windows of the checkpoint's 128 tokens
    assert found.cosine_to_windows > 0.9999
    assert len(found.round_ratios) == 3 and all(r > 0 for r in found.round_ratios)
    assert found.ratio == float(np.median(found.round_ratios))
    # each window's [CLS] and [SEP] and the overlaps are computed beside the document's own tokens
    assert found.computed_tokens_per_s > found.long_tokens_per_s and found.computed_ratio > found.ratio
    assert found.best_of_ratio == found.long_tokens_per_s / found.short_tokens_per_s


def test_each_overlap_is_the_servers_and_its_vector_is_kept_for_comparison(tiny_checkpoint):
    document, passages = texts.long_document(600), texts.passages(48, words=50)
    wide = long_inputs.measure(tiny_checkpoint, document, passages, rounds=1, overlap=32)
    none = long_inputs.measure(tiny_checkpoint, document, passages, rounds=1, overlap=0)
    assert (wide.overlap, none.overlap) == (32, 0) and wide.windows > none.windows
    assert wide.cosine_to_windows > 0.9999 and none.cosine_to_windows > 0.9999
    # the same document cut elsewhere: near, not equal
    assert 0.5 < long_inputs.cosine(wide.vector, none.vector) < 1 - 1e-6
    assert long_inputs.cosine(wide.vector, wide.vector) == pytest.approx(1.0)
