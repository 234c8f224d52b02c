"""Masking statistics and next-sentence pair construction."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from trainer.data.corpus import read_documents
from trainer.data.examples import TrainingPairs, build_pairs, collate
from trainer.data.masking import mask_tokens, replaceable_ids, slots_per_row
from trainer.data.tokens import TokenizedCorpus


def test_masking_rate_split_and_specials(tokenizer):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, tokenizer.vocab_size, (512, 128), generator=g)
    special = torch.zeros_like(ids, dtype=torch.bool)
    special[:, 0] = special[:, 60] = special[:, 127] = True
    special[:400, 100:] = True  # padding in most rows
    ids[special] = tokenizer.pad_id
    replace = replaceable_ids(tokenizer, tokenizer.vocab_size)
    masked = mask_tokens(ids, special, g, tokenizer.mask_id, replace, rate=0.15)

    assert not masked.positions[special].any()  # specials and padding never chosen
    chosen_per_row = masked.positions.sum(1).float()
    real_per_row = (~special).sum(1).float()
    assert torch.allclose(chosen_per_row, torch.round(real_per_row * 0.15), atol=0)
    new = masked.input_ids[masked.positions]
    to_mask = (new == tokenizer.mask_id).float().mean().item()
    kept = (new == masked.labels).float().mean().item()
    assert abs(to_mask - 0.80) < 0.02 and abs(kept - 0.10 - 0.0) < 0.02 + 0.001  # 10% unchanged (+ rare random hits)
    randomised = 1 - to_mask - kept
    assert abs(randomised - 0.10) < 0.02
    assert not torch.isin(new, torch.tensor(sorted(tokenizer.special_ids - {tokenizer.mask_id}))).any()
    assert torch.equal(masked.input_ids[~masked.positions], ids[~masked.positions])


def test_slots_per_row_is_the_most_masking_ever_chooses(tokenizer):
    """A step of fixed shapes has `slots_per_row` places for a pair's masked positions: never too few (a row would
    not fit), and no more than the fullest pair needs (each spare slot costs the MLM head a row)."""
    replace = replaceable_ids(tokenizer, tokenizer.vocab_size)
    for width in (8, 48, 128, 512):
        for rate in (0.15, 0.2, 0.5, 0.99):
            ids = torch.randint(5, tokenizer.vocab_size, (64, width))
            special = torch.zeros_like(ids, dtype=torch.bool)
            special[:, 0] = special[:, width // 2] = special[:, -1] = True  # [CLS] A [SEP] B [SEP], nothing padded
            ends = width - torch.arange(64) % (width - 3)  # row 0 full, the others padded from `ends` on
            special |= torch.arange(width)[None, :] >= ends[:, None]
            masked = mask_tokens(ids, special, torch.Generator().manual_seed(width), tokenizer.mask_id, replace, rate)
            assert int(masked.positions.sum(1).max()) == slots_per_row(width, rate), (width, rate)


def test_masks_are_redrawn_each_time(tokenizer):
    ids = torch.randint(5, 500, (4, 64))
    special = torch.zeros_like(ids, dtype=torch.bool)
    replace = replaceable_ids(tokenizer, tokenizer.vocab_size)
    first = mask_tokens(ids, special, torch.Generator().manual_seed(1), tokenizer.mask_id, replace)
    second = mask_tokens(ids, special, torch.Generator().manual_seed(2), tokenizer.mask_id, replace)
    assert not torch.equal(first.positions, second.positions)


def test_pairs_are_half_random_from_other_documents_and_fit(small_corpus, tokenizer):
    corpus = TokenizedCorpus.from_documents((d.sentences for d in read_documents(small_corpus)), tokenizer)
    max_len = 64
    pairs = build_pairs(corpus, max_len, seed=3)
    labels = np.array([p.is_random_next for p in pairs])
    assert 0.4 < labels.mean() < 0.6
    lengths = np.array([len(p.segment_a) + len(p.segment_b) + 3 for p in pairs])
    assert lengths.max() <= max_len
    assert np.median(lengths) >= 0.9 * max_len  # filled towards the limit, not mostly padding
    # Every token of the corpus that fits lands in some pair: nothing is dropped for being long.
    assert sum(len(p.segment_a) for p in pairs) > 0.4 * corpus.num_tokens

    # A "random next" B comes from another document: its text is not in A's document.
    doc_of_token = {}
    for doc in range(corpus.num_documents):
        for s in corpus.document_sentences(doc):
            doc_of_token.setdefault(tuple(corpus.sentence(s)[:6].tolist()), doc)
    checked = 0
    for p in pairs:  # all of them: the tokenizer's training is not deterministic, so a few hundred vary too much
        if p.is_random_next:
            a_doc = doc_of_token.get(tuple(p.segment_a[:6].tolist()))
            b_doc = doc_of_token.get(tuple(p.segment_b[:6].tolist()))
            if a_doc is not None and b_doc is not None:
                assert a_doc != b_doc
                checked += 1
    assert checked > 5


def test_long_sentences_are_truncated_not_dropped(tokenizer):
    from trainer.data.corpus import Document

    long = " ".join(["word"] * 300) + " ."
    documents = [Document("a", [long, "short one ."]), Document("b", ["other text here .", "and more ."])]
    corpus = TokenizedCorpus.from_documents((d.sentences for d in documents), tokenizer)
    pairs = build_pairs(corpus, 32, seed=0)
    assert any(len(p.segment_a) + len(p.segment_b) == 29 for p in pairs)


def test_collate_layout(tokenizer):
    from trainer.data.examples import PairExample

    batch = collate([PairExample(np.array([10, 11]), np.array([12]), False),
                     PairExample(np.array([20]), np.array([21, 22, 23]), True)], tokenizer)
    c, s, p = tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id
    assert batch.input_ids.tolist() == [[c, 10, 11, s, 12, s, p], [c, 20, s, 21, 22, 23, s]]
    assert batch.token_type_ids.tolist() == [[0, 0, 0, 0, 1, 1, 0], [0, 0, 0, 1, 1, 1, 1]]
    assert batch.special_mask.tolist()[0] == [True, False, False, True, False, True, True]
    assert batch.nsp_labels.tolist() == [0, 1]


def test_a_range_of_documents_is_a_corpus_of_those_documents(small_corpus, tokenizer):
    corpus = TokenizedCorpus.from_documents((d.sentences for d in read_documents(small_corpus)), tokenizer)
    first, end = 1, corpus.num_documents - 1
    part = corpus.documents(first, end)
    assert part.num_documents == end - first
    for doc in range(part.num_documents):
        mine = [part.sentence(s).tolist() for s in part.document_sentences(doc)]
        theirs = [corpus.sentence(s).tolist() for s in corpus.document_sentences(first + doc)]
        assert mine == theirs
    assert part.num_tokens == sum(len(corpus.sentence(s)) for d in range(first, end)
                                  for s in corpus.document_sentences(d))


def with_an_empty_first_sentence(corpus: TokenizedCorpus) -> TokenizedCorpus:
    """The same documents, each opening with a sentence of no tokens: a pair starting there may come out empty."""
    sentences, documents = corpus.sentence_offsets, corpus.document_offsets
    starts = [np.concatenate(([sentences[s0]], sentences[s0:s1])) for s0, s1 in zip(documents[:-1], documents[1:])]
    sizes = np.diff(documents) + 1
    return TokenizedCorpus(corpus.ids, np.concatenate(starts + [sentences[-1:]]),
                           np.concatenate(([0], np.cumsum(sizes))))


@pytest.mark.parametrize("empty_sentences", [False, True], ids=["every-sentence-has-tokens", "empty-sentences"])
def test_advancing_the_cursors_is_building_the_pairs(small_corpus, tokenizer, empty_sentences):
    """A worker process moves the data cursors past the other workers' steps with TrainingPairs.advance, which
    counts the steps' draws instead of building their pairs: the same cursors as building them, step after step,
    from two sources, over passes that wrap. Where a pair can come out empty (and the step draws again), counting
    would fall behind: there it builds the pairs, and agrees too."""
    corpus = TokenizedCorpus.from_documents((d.sentences for d in read_documents(small_corpus)), tokenizer)
    if empty_sentences:
        corpus = with_an_empty_first_sentence(corpus)
    half = corpus.num_documents // 2
    pairs = TrainingPairs([corpus.documents(0, half), corpus.documents(half, corpus.num_documents)], 64, seed=5)
    built, advanced = pairs.initial_cursors(), pairs.initial_cursors()
    redrawn = 0
    for step in range(30):
        before = copy.deepcopy(built)
        pairs.batch(step, 48, built)
        pairs.advance(step, 48, advanced)
        assert advanced == built, step
        chunks = [len(s) - 1 for s in pairs.starts]
        redrawn += sum((b[0] - a[0]) * n + b[1] - a[1] for a, b, n in zip(before, built, chunks)) - 48
    assert min(epoch for epoch, _ in built) >= 2  # every source's passes wrapped
    assert (redrawn > 0) == empty_sentences  # the second case does exercise the pairs that come out empty
