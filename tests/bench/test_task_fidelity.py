"""bench.serving.task_fidelity: the task heads benchmark's check that a precision keeps float32's answers."""

from __future__ import annotations

import sys

import pytest

from bench.serving.task_fidelity import LABEL_MARGIN, SPAN_MARGIN, compare, fidelity, sharpen_heads
from devkit.server import free_port, start, start_service

SENTENCES = ["the river rises in the hills north of the town .", "a crane flew over the old mill in spring ."]
CONTEXT = "the river rises in the hills north of the town and flows south past the old mill to the harbour ."
QUESTIONS = ["where does the river rise ?", "what does it flow past ?"]


def answers(labels: list[list[str]], groups: list[list[tuple[str, int, int]]], spans: list[tuple[int, int]],
            score: float = 0.9) -> dict:
    return {"tokens": [[{"entity": label, "score": score} for label in row] for row in labels],
            "entities": [[{"entity_group": g, "score": score, "start": s, "end": e} for g, s, e in row]
                         for row in groups],
            "answers": [{"start": s, "end": e, "score": score} for s, e in spans]}


def test_compare_counts_each_difference():
    reference = answers([["O", "B-PER"], ["O", "O"]], [[("PER", 4, 9)], []], [(0, 5), (7, 9)])
    assert compare(reference, reference) == {
        "token_classification_entities_identical": 1.0, "question_answering_same_span": 1.0,
        "question_answering_max_score_diff": 0.0, "token_classification_label_agreement": 1.0,
        "token_classification_max_score_diff": 0.0}
    moved = answers([["O", "B-LOC"], ["O", "O"]], [[("LOC", 4, 9)], []], [(0, 5), (7, 12)], score=0.8)
    found = compare(reference, moved)
    assert found["token_classification_label_agreement"] == 0.75
    assert found["token_classification_entities_identical"] == 0.5
    assert found["question_answering_same_span"] == 0.5
    assert found["question_answering_max_score_diff"] == pytest.approx(0.1)
    assert found["token_classification_max_score_diff"] == pytest.approx(0.1)


def test_a_peer_without_every_token_is_compared_on_the_entities_it_shares():
    reference = answers([["O", "B-PER"], ["O", "O"]], [[("PER", 4, 9)], [("LOC", 0, 3)]], [(0, 5)])
    peer = {**answers([], [[("PER", 4, 9)], [("ORG", 0, 3)]], [(0, 5)], score=0.7), "tokens": None}
    peer["entities"][1][0]["score"] = 0.1  # a different list: its scores are not compared
    found = compare(reference, peer)
    assert "token_classification_label_agreement" not in found
    assert found["token_classification_entities_identical"] == 0.5
    assert found["token_classification_max_score_diff"] == pytest.approx(0.2)


def test_sharpened_heads_have_the_margins_asked_for(tiny_token_classifier, tiny_question_answerer):
    import transformers

    tagger = transformers.BertForTokenClassification.from_pretrained(tiny_token_classifier).eval()
    answerer = transformers.BertForQuestionAnswering.from_pretrained(tiny_question_answerer).eval()
    tokenizer = transformers.BertTokenizerFast.from_pretrained(tiny_token_classifier)
    margins = sharpen_heads(tagger, answerer, tokenizer, SENTENCES, [(q, CONTEXT) for q in QUESTIONS])
    assert margins["label_margin_median"] == pytest.approx(LABEL_MARGIN, rel=1e-3)
    assert 0 <= margins["label_margin_min"] <= LABEL_MARGIN and 0 <= margins["label_margins_under_1"] <= 1
    # The factor is measured on one pass and checked on another: the tiny answerer's closer question starts at a margin
    # of 0.03, so the factor (about 60) multiplies any difference between the two passes' last bits (a product's sums
    # follow the threads it gets); 0.3% was seen once on a busy 2-core machine
    assert min(margins["span_margins"]) == pytest.approx(SPAN_MARGIN, rel=1e-2)


def test_float32_against_itself_is_exact(tiny_token_classifier, tiny_question_answerer):
    """The benchmark's path: our float32 servers asked twice, and the plain peer once."""
    port = free_port()
    peer_url = f"http://127.0.0.1:{port}"
    servers = [start_service(tiny_token_classifier, "--dtype", "float32"),
               start_service(tiny_question_answerer, "--dtype", "float32"),
               (start([sys.executable, "-m", "bench.serving.task_peer", str(tiny_token_classifier),
                       str(tiny_question_answerer), str(port)], peer_url), peer_url)]
    try:
        found = fidelity({"float32": (servers[0][1], servers[1][1])}, peer_url,
                         [{"inputs": s, "aggregation_strategy": "simple"} for s in SENTENCES],
                         [{"inputs": {"question": q, "context": CONTEXT}} for q in QUESTIONS])
    finally:
        for process, _ in servers:
            process.terminate()
            process.wait(timeout=60)
    assert list(found) == ["float32", "peer_vs_float32"]
    peer = found.pop("peer_vs_float32")
    assert peer["token_classification_entities_identical"] == 1.0  # the same pipeline's entities
    assert 0 <= peer["question_answering_same_span"] <= 1 and peer["question_answering_max_score_diff"] >= 0
    assert found["float32"] == {
        "token_classification_entities_identical": 1.0, "question_answering_same_span": 1.0,
        "question_answering_max_score_diff": 0.0, "token_classification_label_agreement": 1.0,
        "token_classification_max_score_diff": 0.0}
