"""The cloze probe: its sentences are well-formed, and its answers are the transformers fill-mask pipeline's."""

from __future__ import annotations

import numpy as np
import transformers

from bench.quality import cloze
from service.settings import DEFAULT_CHECKPOINT


def test_the_probe_has_thirty_plus_sentences_with_one_mask_and_answers():
    rows = cloze.read_probe()
    assert len(rows) >= 30
    assert len({sentence for sentence, _ in rows}) == len(rows)
    for sentence, answers in rows:
        assert sentence.count("[MASK]") == 1, sentence
        assert answers and all(a and a == a.lower() and " " not in a for a in answers), sentence  # uncased words


def test_probe_answers_are_the_fill_mask_pipelines_and_hits_follow_from_them():
    result = cloze.probe(DEFAULT_CHECKPOINT)
    pipe = transformers.pipeline("fill-mask", model=transformers.BertForMaskedLM.from_pretrained(DEFAULT_CHECKPOINT,
                                 torch_dtype="float32").eval(), tokenizer=str(DEFAULT_CHECKPOINT), device="cpu")
    answers = dict(cloze.read_probe())
    for row in result["rows"][:6]:
        want = pipe(row["sentence"], top_k=5)
        assert [token for token, _ in row["top"]] == [w["token_str"] for w in want], row["sentence"]
        np.testing.assert_allclose([p for _, p in row["top"]], [w["score"] for w in want], atol=2e-3)
    for row in result["rows"]:
        tokens = [token for token, _ in row["top"]]
        assert row["top1_hit"] == (tokens[0] in answers[row["sentence"]])
        assert row["top5_hit"] == bool(set(tokens) & answers[row["sentence"]])
    assert result["top1"] == sum(r["top1_hit"] for r in result["rows"]) / len(result["rows"]) <= result["top5"]
