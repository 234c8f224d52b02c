"""The ASCII fast path (model/ascii_wordpiece.py) against the `tokenizers` library it stands in for: the same ids,
segment ids and truncation on every WikiText-2 line and on generated ASCII, for the bundled tokenizer (BERT's
uncased pipeline as all-MiniLM-L6-v2 ships it), ours (with the `<unk>` rewrite) and a cased one; everything it
does not handle goes to the library."""

from __future__ import annotations

import copy
import json
import random
import string

import pytest
from tokenizers import Tokenizer

from model import WordPieceTokenizer, load_checkpoint
from model.ascii_wordpiece import EXTRA_PUNCTUATION, from_pipeline
from service.settings import DEFAULT_CHECKPOINT
from tests.conftest import wikitext_lines


@pytest.fixture(scope="module")
def tokenizers(tokenizer) -> dict[str, WordPieceTokenizer]:
    bundled = load_checkpoint(DEFAULT_CHECKPOINT).tokenizer
    # A cased pipeline as Hugging Face ships one (bert-base-cased: BertNormalizer without lower-casing), over the
    # uncased vocabulary, so that capitalised words break into pieces or [UNK].
    spec = json.loads(bundled._backend.to_str())
    spec["normalizer"]["lowercase"] = False
    cased = WordPieceTokenizer(Tokenizer.from_str(json.dumps(spec)), lowercase=False)
    # Ours cased: its `<unk>` rewrite writes a `[UNK]` that no added token matches afterwards (text, then).
    ours_cased = WordPieceTokenizer.from_vocab(bundled.vocab, lowercase=False)
    return {"bundled": bundled, "ours": tokenizer, "cased": cased, "ours cased": ours_cased}


def library(tok: WordPieceTokenizer, texts: list, truncate: bool, direction: str = "right"):
    backend = (tok._truncating if direction == "right" else tok._truncating_left) if truncate else tok._backend
    return [(e.ids, e.type_ids, bool(e.overflowing)) for e in backend.encode_batch_fast(texts, add_special_tokens=True)]


def ours(tok: WordPieceTokenizer, texts: list, truncate: bool, direction: str = "right"):
    return [(e.ids, e.type_ids, e.truncated) for e in tok.encode_batch(texts, truncate=truncate, direction=direction)]


def generated_ascii(count: int, seed: int = 0) -> list[str]:
    """Words, numbers, runs of punctuation (typographic too), odd whitespace, WikiText's marker in both cases, words too long."""
    rng = random.Random(seed)
    parts = [lambda: rng.choice(["the", "The", "THE", "running", "unbelievably", "xqzt", "Zürich"[:1]]),
             lambda: "".join(rng.choices(string.ascii_letters, k=rng.randint(1, 14))),
             lambda: "".join(rng.choices(string.digits + ".,", k=rng.randint(1, 6))),
             lambda: "".join(rng.choices(string.punctuation, k=rng.randint(1, 4))),
             lambda: "".join(rng.choices(EXTRA_PUNCTUATION + "—–—–“”’" + string.punctuation, k=rng.randint(1, 3))),
             lambda: rng.choice(["<unk>", "<UNK>", "<Unk>", "<unk", "unk>", "[MASK]", "[mask]", "[UNK]", "[unk]",
                                 "[CLS][SEP]", "[MASK", "x[MASK]y", "[[MASK]]"]),
             lambda: "a" * rng.choice([99, 100, 101, 150]),
             lambda: rng.choice([" ", "  ", "\t", "\n", "\r\n", ""])]
    return ["".join(rng.choice(parts)() + rng.choice(["", " ", " ", "\t"]) for _ in range(rng.randint(0, 40)))
            for _ in range(count)]


@pytest.mark.parametrize("name", ["bundled", "ours", "cased", "ours cased"])
def test_every_wikitext_line_and_generated_text_encode_as_the_library_does(tokenizers, name):
    tok = tokenizers[name]
    assert tok._ascii is not None, "this pipeline should take the fast path"
    texts = wikitext_lines("test") + wikitext_lines("valid") + generated_ascii(3000)
    handled = sum(tok._ascii.ids(text) is not None for text in texts)
    assert handled > 0.8 * len(texts)  # the comparison exercises the fast path (WikiText has non-ASCII lines too)
    for start in range(0, len(texts), 500):
        chunk = texts[start:start + 500]
        assert ours(tok, chunk, truncate=False) == library(tok, chunk, truncate=False)
        assert ours(tok, chunk, truncate=True) == library(tok, chunk, truncate=True)
        assert ours(tok, chunk, truncate=True, direction="left") == library(tok, chunk, True, "left")


def test_truncation_at_a_short_limit_and_the_marker(tokenizers):
    tok = tokenizers["ours"]
    short = WordPieceTokenizer(tok._backend, model_max_length=8)
    texts = ["one two three four five six seven eight nine", "a <unk> b <UNK> c", "<unk>", "", "  \t "]
    for direction in ("right", "left"):
        assert ours(short, texts, True, direction) == library(short, texts, True, direction)
    assert tok.encode("a <unk> b").ids == [tok.cls_id, tok.token_to_id("a"), tok.unk_id, tok.token_to_id("b"),
                                           tok.sep_id]


def test_what_it_does_not_handle_goes_to_the_library(tokenizers):
    tok = tokenizers["bundled"]
    others = ["Café au lait", "北京 is a city", "tab\x0bvertical", "nul\x00byte", "é", "bell\x07", "30°C",
              "x − y", "a—b°", "ﬁne"]  # symbols stay inside BERT's words; ligatures are not punctuation
    assert all(tok._ascii.ids(text) is None for text in others)
    mixed = ["plain words", *others, "the [MASK] sat", "more plain words"]
    assert ours(tok, mixed, True) == library(tok, mixed, True)
    pairs = [("first part", "second part"), ("x", "y")]
    assert [e.ids for e in tok.encode_batch(pairs)] == [e.ids for e in tok._backend.encode_batch(pairs)]
    text = "Offsets are kept."
    assert tok.encode(text).offsets == tok._backend.encode(text).offsets != [(0, 0)] * len(tok.encode(text).ids)


def test_pipelines_it_cannot_reproduce_get_no_fast_path(tokenizers):
    spec = json.loads(tokenizers["bundled"]._backend.to_str())
    assert from_pipeline(spec) is not None
    for change in (lambda s: s.update(pre_tokenizer={"type": "Whitespace"}),
                   lambda s: s["model"].update(max_input_chars_per_word=50),
                   lambda s: s["model"].update(continuing_subword_prefix="@@"),
                   lambda s: s.update(normalizer={"type": "Lowercase"}),
                   lambda s: s["added_tokens"].append({"content": "<x>", "id": 5, "lstrip": True}),
                   lambda s: s["added_tokens"].append({"content": "é", "id": 5}),
                   lambda s: s.update(normalizer={"type": "Sequence", "normalizers": [
                       s["normalizer"], {"type": "Replace", "pattern": {"Regex": "a+"}, "content": "a"}]})):
        changed = copy.deepcopy(spec)
        change(changed)
        assert from_pipeline(changed) is None


def test_typographic_punctuation_takes_the_fast_path(tokenizers):
    """Dashes and curly quotes are split off as the library splits them, without a trip through it."""
    texts = ["Wade – Giles", "five children — three sons", "“Quoted” and ‘single’ … «guillemets» ¿qué? no: que",
             "a–b—c‐d", "‖‗†‡•‣※‼⁇⁈"]
    for name, tok in tokenizers.items():
        handled = [t for t in texts if "é" not in t]
        assert all(tok._ascii.ids(t) is not None for t in handled), name
        assert ours(tok, texts, True) == library(tok, texts, True), name
