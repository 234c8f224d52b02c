"""Chunks point at the right characters: each chunk's span is where the tokenizer's own pieces of it sit in the
text, the chunks cover every piece in order with the overlap asked for, and the text of a chunk encoded alone
gives the chunk's ids (so its vector is what /embed gives for that text)."""

from __future__ import annotations

import itertools

import pytest

from corpus.chunks import Chunk, check_chunking, chunk_document, chunk_documents
from model.tokenizer import WordPieceTokenizer
from tests.conftest import wikitext_lines
from tests.optional import MINILM, required_or_skip

TRICKY = [
    "  Café Müller's naïve façade — ÅNGSTRÖM, résumé; crème brûlée.  ",
    "東京タワーは美しい。北京欢迎你！ 서울 특별시 and 日本語の文章 mixed with English words.",
    "emoji 🎉🎉 run 👩‍👩‍👧‍👦 family 🇫🇷 flag \t\t tabs \n\n newlines   spaces\u00a0nbsp\u3000ideographic",
    "antidisestablishmentarianism supercalifragilisticexpialidocious pneumonoultramicroscopicsilicovolcanoconiosis",
    "<unk> markers , WikiText @-@ style @,@ tokens ; and numbers 1 @.@ 5",
]


@pytest.fixture(scope="module")
def minilm_tokenizer() -> WordPieceTokenizer:
    return WordPieceTokenizer.load(required_or_skip(*MINILM).MODEL_DIR)


def texts() -> list[str]:
    article = " ".join(wikitext_lines("test", limit=12))
    return TRICKY + [article, " ".join(TRICKY)]


def check_chunks(text: str, chunks: list[Chunk], tokenizer: WordPieceTokenizer, size: int, overlap: int) -> None:
    pieces = tokenizer.pieces([text])[0]
    starts = [i == 0 or pieces.words[i] != pieces.words[i - 1] for i in range(len(pieces.ids))]
    assert [c.index for c in chunks] == list(range(len(chunks)))
    position, previous_stop = 0, 0
    for number, chunk in enumerate(chunks):
        ids = chunk.token_ids
        assert ids[0] == tokenizer.cls_id and ids[-1] == tokenizer.sep_id and 1 <= len(ids) - 2 <= size
        body = ids[1:-1]
        # where this chunk's pieces sit among the text's pieces: from the previous chunk's end back by at most
        # `overlap`, and its span is exactly those pieces' characters
        start = next(s for s in range(max(previous_stop - overlap, position), previous_stop + 1)
                     if pieces.ids[s:s + len(body)] == body)
        stop = start + len(body)
        assert start >= position and (start > position or number == 0)  # always moves forward
        assert start <= previous_stop  # no piece is skipped
        assert (chunk.char_start, chunk.char_end) == (pieces.offsets[start][0], pieces.offsets[stop - 1][1])
        span = text[chunk.char_start:chunk.char_end]
        assert span == span.strip() and span
        cut_word = (start < len(starts) and not starts[start]) or (stop < len(starts) and not starts[stop])
        if not cut_word:
            assert tokenizer.encode(span).ids == ids  # the chunk's text, encoded alone, is the chunk
            assert tokenizer.encode_batch([span])[0].ids == ids  # also by the fast path the job's /embed takes
            if stop < len(starts):  # and it is as long as whole words allow: the next word would not fit
                next_word = next(i for i in range(stop + 1, len(starts) + 1) if i == len(starts) or starts[i])
                assert next_word - start > size
        position, previous_stop = start, stop
    assert previous_stop == len(pieces.ids)  # the last chunk reaches the last piece


@pytest.mark.parametrize(("size", "overlap"), [(1, 0), (2, 1), (5, 0), (5, 2), (16, 4), (64, 16), (510, 0)])
def test_chunks_cover_the_pieces_with_exact_spans(tokenizer, size, overlap):
    for text in texts():
        check_chunks(text, chunk_document(text, tokenizer, size, overlap), tokenizer, size, overlap)


@pytest.mark.parametrize(("size", "overlap"), [(3, 1), (8, 3), (32, 8)])
def test_chunks_with_a_real_vocabulary(minilm_tokenizer, size, overlap):
    for text in texts():
        check_chunks(text, chunk_document(text, minilm_tokenizer, size, overlap), minilm_tokenizer, size, overlap)


def test_overlap_repeats_whole_words_up_to_the_limit(tokenizer):
    text = " ".join(["one two three four five six seven eight nine ten"] * 6)  # one piece a word
    assert all(len(p) == 1 for p in [tokenizer.pieces([w])[0].ids for w in text.split()])
    chunks = chunk_document(text, tokenizer, 10, 3)
    spans = [text[c.char_start:c.char_end] for c in chunks]
    assert spans[0] == "one two three four five six seven eight nine ten"
    assert spans[1] == "eight nine ten one two three four five six seven"
    assert [len(c.token_ids) - 2 for c in chunks[:-1]] == [10] * (len(chunks) - 1)
    no_overlap = chunk_document(text, tokenizer, 10, 0)
    assert len(no_overlap) == 6 and [c.char_start for c in no_overlap][1] == len("one two three four five six "
                                                                                  "seven eight nine ten ")


def test_a_short_text_is_one_chunk_and_an_empty_one_is_cls_sep(tokenizer):
    text = "A short sentence."
    [chunk] = chunk_document(text, tokenizer, 128, 16)
    assert chunk.token_ids == tokenizer.encode(text).ids
    assert (chunk.char_start, chunk.char_end) == (0, len(text))
    for empty in ("", "   \t\n"):
        assert chunk_document(empty, tokenizer, 8, 2) == [Chunk(0, 0, 0, [tokenizer.cls_id, tokenizer.sep_id])]


def test_a_word_longer_than_a_chunk_is_cut_and_the_chunks_still_move_forward(tokenizer):
    word = "pneumonoultramicroscopicsilicovolcanoconiosis"
    pieces = tokenizer.pieces([word])[0]
    assert len(pieces.ids) > 4
    chunks = chunk_document(f"a {word} b", tokenizer, 3, 1)
    assert [c.token_ids[1:-1] for c in chunks][0] == tokenizer.pieces(["a"])[0].ids
    joined = [piece for c in chunks[1:-1] for piece in c.token_ids[1:-1]]
    assert len(joined) >= len(pieces.ids)  # every piece of the word, some twice (the overlap)


def test_batched_equals_one_by_one(tokenizer):
    batch = texts()
    assert chunk_documents(batch, tokenizer, 12, 3) == [chunk_document(t, tokenizer, 12, 3) for t in batch]


@pytest.mark.parametrize(("size", "overlap", "message"), [
    (0, 0, "--chunk-tokens must be positive, not 0"),
    (-3, 0, "--chunk-tokens must be positive"),
    (8, -1, r"--chunk-overlap must be at least 0 and less than --chunk-tokens \(8\), not -1"),
    (8, 8, r"--chunk-overlap must be at least 0 and less than --chunk-tokens \(8\), not 8"),
    (511, 0, r"--chunk-tokens 511 plus \[CLS\] and \[SEP\] exceeds the model's 512 positions: use at most 510"),
])
def test_settings_that_cannot_chunk_are_refused_by_flag(tokenizer, size, overlap, message):
    with pytest.raises(ValueError, match=message):
        chunk_document("text", tokenizer, size, overlap)
    with pytest.raises(ValueError, match=message):
        check_chunking(size, overlap, 512)


def test_every_setting_on_a_small_grid_terminates_and_covers(tokenizer):
    text = TRICKY[2] + " " + TRICKY[3]
    for size, overlap in itertools.product(range(1, 7), range(0, 6)):
        if overlap < size:
            check_chunks(text, chunk_document(text, tokenizer, size, overlap), tokenizer, size, overlap)
