"""The WordPiece tokenizer against transformers' BertTokenizerFast on the same vocabulary."""

from __future__ import annotations

import transformers

from model import WordPieceTokenizer
from tests.conftest import wikitext_lines

PAIRS = [
    ("The cat sat on the mat.", "It was warm there."),
    ("Robert Boulter is an English film and television actor.", "He had a guest-starring role in 2000."),
    ("Ünïcödé accents and 漢字 characters", "emoji 🙂 and tabs\tand   spaces"),
]


def test_pair_encoding_matches_transformers(tmp_path, tokenizer):
    tokenizer.save(tmp_path)
    reference = transformers.BertTokenizerFast.from_pretrained(tmp_path)
    for a, b in PAIRS:
        ours = tokenizer.encode(a, b)
        theirs = reference(a, b)
        assert ours.ids == theirs["input_ids"]
        assert ours.type_ids == theirs["token_type_ids"]
    single = tokenizer.encode(PAIRS[1][0])
    assert single.ids == reference(PAIRS[1][0])["input_ids"]
    assert single.ids[0] == tokenizer.cls_id and single.ids[-1] == tokenizer.sep_id


def test_pair_truncation_is_longest_first_like_transformers(tmp_path, tokenizer):
    # (without the WikiText <unk> marker, which transformers' BertTokenizer splits into 3 pieces)
    long_a = " ".join(wikitext_lines("valid", limit=3)).replace("<unk>", "")
    short_b = "a short second sentence ."
    limited = WordPieceTokenizer(tokenizer._backend, model_max_length=40)
    limited.save(tmp_path)
    reference = transformers.BertTokenizerFast.from_pretrained(tmp_path)
    ours = limited.encode(long_a, short_b, truncate=True)
    theirs = reference(long_a, short_b, truncation="longest_first", max_length=40)
    assert len(ours.ids) == 40 and ours.truncated
    assert ours.ids == theirs["input_ids"] and ours.type_ids == theirs["token_type_ids"]
    assert not limited.encode("short", "pair", truncate=True).truncated
    assert len(limited.encode(long_a, short_b, truncate=False).ids) > 40


def test_wikitext_unk_marker_is_one_unk_token(tokenizer):
    encoded = tokenizer.encode("the <unk> river")
    assert encoded.ids.count(tokenizer.unk_id) == 1
    assert len(encoded.ids) == len(tokenizer.encode("the river").ids) + 1
    assert "unk" not in tokenizer.vocab  # the marker did not leak into the learned vocabulary


def test_offsets_point_into_the_original_text(tokenizer):
    text = "Hello Wonderful World"
    encoded = tokenizer.encode(text)
    pieces = [text[s:e] for (s, e), t in zip(encoded.offsets, encoded.ids) if t not in tokenizer.special_ids]
    assert "".join(pieces).lower() == text.replace(" ", "").lower()


def test_training_a_small_vocabulary():
    texts = ["the quick brown fox jumps over the lazy dog"] * 20 + ["pack my box with five dozen liquor jugs"] * 20
    small = WordPieceTokenizer.train(texts, vocab_size=120, min_frequency=1)
    assert small.vocab_size <= 120
    assert small.vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert small.token_to_id("the") is not None
    assert small.decode(small.encode("the lazy dog").ids) == "the lazy dog"


def test_save_load_round_trip(tmp_path, tokenizer):
    tokenizer.save(tmp_path)
    loaded = WordPieceTokenizer.load(tmp_path)
    for a, b in PAIRS:
        assert loaded.encode(a, b).ids == tokenizer.encode(a, b).ids
    (tmp_path / "tokenizer.json").unlink()  # vocab.txt alone must suffice too
    from_vocab = WordPieceTokenizer.load(tmp_path)
    assert from_vocab.encode(*PAIRS[0]).ids == tokenizer.encode(*PAIRS[0]).ids
