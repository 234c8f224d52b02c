"""Fill-mask compared where it means something: the bundled model's answers to the cloze probe's sentences
(bench/quality/data/cloze.tsv), judged by the best token on the masks where the reference answer is confident.

A random model spreads its probability over the vocabulary (about 1/300 each with 300 tokens): scores "within 0.02"
of each other, or probability vectors at cosine 0.99, hold whatever the model computes. A trained model's confident
answers do not: where the reference gives its best token at least twice the probability of the second, a path that
computes the same states gives the same best token in any precision, and a path that computes wrong ones does not.
Used by the GPU-marked tests and, on the CPU, by tests/service/engine/test_graphs.py (the same logic, another device)."""

from __future__ import annotations

import numpy as np

from devkit.paths import REPO_ROOT
from service.tasks import FillMaskItem

CHECKPOINT = REPO_ROOT / "checkpoints" / "minilm-wikipedia"
PROBE = REPO_ROOT / "bench" / "quality" / "data" / "cloze.tsv"  # read as data: the tests import no benchmark code
CONFIDENT_RATIO = 2.0  # best token's probability over the second's
CONFIDENT_FLOOR = 0.2  # ... and at least this probability
TOP_K = 10
SCORE_LOG_TOLERANCE = 0.1  # nats: the best token's probability, relative (bfloat16 logits, ~0.4% per product)


def probe_sentences() -> list[str]:
    """The probe's sentences (its first column; lines starting with '#' are comments)."""
    lines = PROBE.read_text(encoding="utf-8").splitlines()
    return [line.split("\t")[0] for line in lines if line and not line.startswith("#")]


def cloze_items(tokenizer, copies: int = 1) -> list[FillMaskItem]:
    """One fill-mask item per probe sentence (`copies` times, so that a batch fills a larger graph)."""
    texts = probe_sentences()  # "[MASK]" is the tokenizer's own mask token
    items = []
    for encoded in tokenizer.encode_batch(texts * copies, truncate=True):
        ids = list(encoded.ids)
        items.append(FillMaskItem(ids, list(encoded.type_ids), mask_positions=[ids.index(tokenizer.mask_id)],
                                  top_k=TOP_K))
    return items


def confident(results) -> list[int]:
    """Indices of the results whose (only) mask's best token is confident (CONFIDENT_RATIO, CONFIDENT_FLOOR)."""
    chosen = []
    for index, result in enumerate(results):
        scores = result.masks[0].scores
        if len(scores) >= 2 and scores[0] >= CONFIDENT_FLOOR and scores[0] >= CONFIDENT_RATIO * scores[1]:
            chosen.append(index)
    return chosen


def assert_same_fill_mask(reference: list, other: list, at_least: int = 5) -> int:
    """Every answer the same shape as the reference's; on the reference's confident masks, the same best token with
    its probability within SCORE_LOG_TOLERANCE nats. Returns how many masks were confident (at least `at_least`:
    a comparison of nothing proves nothing)."""
    assert len(other) == len(reference), (len(other), len(reference))
    for a, b in zip(reference, other, strict=True):
        assert len(b.masks) == len(a.masks)
        for mask_a, mask_b in zip(a.masks, b.masks, strict=True):
            assert mask_b.position == mask_a.position
            assert len(mask_b.token_ids) == len(mask_a.token_ids) == len(mask_b.scores) == len(mask_a.scores)
            assert np.all(np.diff(mask_b.scores) <= 0), "scores not best first"
    sure = confident(reference)
    assert len(sure) >= at_least, f"only {len(sure)} confident masks: the comparison would prove little"
    for index in sure:
        a, b = reference[index].masks[0], other[index].masks[0]
        assert b.token_ids[0] == a.token_ids[0], (index, a.token_ids[:3], b.token_ids[:3])
        assert abs(np.log(b.scores[0]) - np.log(a.scores[0])) <= SCORE_LOG_TOLERANCE, (index, a.scores[0], b.scores[0])
    return len(sure)
