"""The held-out benchmark through the service: its texts are the trainer's evaluation items, and the service's
answers to them agree with the trainer's in-process evaluation (next-sentence: of the same pairs unmasked)."""

from __future__ import annotations

import re

import torch

from bench.quality import heldout_service
from devkit.paths import WIKITEXT_TEST
from devkit.server import start_service
from model import load_checkpoint
from service.settings import DEFAULT_CHECKPOINT
from trainer.data.tokens import TokenizedCorpus
from trainer.evaluate import build_eval_set, evaluate


def small_eval_set(tokenizer, vocab_size):
    paragraphs = [line.strip() for line in WIKITEXT_TEST.read_text(encoding="utf-8").splitlines()
                  if line.strip() and not line.strip().startswith("=")][:60]
    documents = [[s for s in re.split(r"(?<= \.) ", p) if s] for p in paragraphs]
    corpus = TokenizedCorpus.from_documents(documents, tokenizer)
    return build_eval_set(corpus, tokenizer, vocab_size, 128, examples=48, sentences=48)


def test_items_are_the_trainers_evaluation_items_as_text():
    checkpoint = load_checkpoint(DEFAULT_CHECKPOINT)
    tokenizer = checkpoint.tokenizer
    eval_set = small_eval_set(tokenizer, checkpoint.config.vocab_size)
    words = heldout_service.fill_mask_items(eval_set, tokenizer)
    expected = [row for batch in eval_set.whole_words for row in batch.input_ids[:, 1:].tolist()]
    assert len(words) == len(expected) == sum(len(b.labels) for b in eval_set.whole_words) > 20
    round_trips = 0
    assert [label for _, label in words] == [label for b in eval_set.whole_words for label in b.labels.tolist()]
    for (text, _), ids in zip(words, expected):
        assert text.count("[MASK]") == 1
        retokenized = tokenizer.encode(text).ids[1:]
        original = [i for i in ids if i != tokenizer.pad_id]
        round_trips += retokenized == original
    assert round_trips >= 0.9 * len(words)  # the text says what the trainer's ids say (accents may differ)
    pairs = heldout_service.pair_items(eval_set, tokenizer)
    labels = [label for batch, _ in eval_set.batches for label in batch.nsp_labels.tolist()]
    assert [follows for _, _, follows in pairs] == [label == 0 for label in labels]  # none of these is skipped
    assert all(a and b for a, b, _ in pairs)


def test_the_service_answers_the_items_as_the_trainer_scores_them():
    checkpoint = load_checkpoint(DEFAULT_CHECKPOINT)
    eval_set = small_eval_set(checkpoint.tokenizer, checkpoint.config.vocab_size)
    model = checkpoint.model.float().eval()
    in_process = evaluate(model, eval_set, torch.device("cpu"))
    unmasked_pairs = heldout_service.unmasked_pair_accuracy(model, eval_set)
    process, url = start_service(DEFAULT_CHECKPOINT)
    try:
        served = heldout_service.served_accuracy(url, heldout_service.fill_mask_items(eval_set, checkpoint.tokenizer),
                                                 heldout_service.pair_items(eval_set, checkpoint.tokenizer))
    finally:
        process.terminate()
        process.wait(timeout=60)
    words, pairs = served["whole_word_sentences"], served["pairs"]
    assert words == in_process["whole_word_sentences"] and pairs == in_process["pairs"]
    # a text round trip may change a sentence or two (accents, unknown pieces), never more
    assert abs(served["whole_word_accuracy"] - in_process["whole_word_accuracy"]) * words <= 2
    assert abs(served["nsp_accuracy"] - unmasked_pairs) * pairs <= 2
