"""BERT's tokenization of plain ASCII text, in Python, giving the ids the `tokenizers` pipeline gives.

Why: the library spends about 40-52 µs on a 144-character WikiText sentence on this project's CPUs (its normalizer
17, its pre-tokenizer 27: each builds aligned strings for offsets that the hot path never reads): three quarters
of a front end's work on an 8-sentence request, and the largest share of a GPU host's server samples (py-spy,
BENCHMARKS.md). For text of printable ASCII, BERT's pipeline reduces to string operations:

1. added tokens registered as not normalized ([CLS], [MASK], ...) are cut out of the raw text, leftmost-longest;
2. each other part is normalized: lower-cased if the model is uncased (accents and CJK do not occur in ASCII,
   and the control characters it drops are not handled here), then the pipeline's `Replace` steps (ours reads
   WikiText's `<unk>` as `[unk]`);
3. added tokens registered as normalized are cut out of the normalized text;
4. the rest splits on whitespace, each punctuation character (every printable ASCII character that is not a
   letter or digit) a word of its own;
5. WordPiece per word: greedy longest match, `##` continuations; the whole word is [UNK] when a part matches no
   piece or the word exceeds 100 characters. Words repeat, so each word's pieces are kept once found, as the
   library's own WordPiece cache does.

Typographic punctuation outside ASCII (dashes, curly quotes, ellipsis, guillemets: `EXTRA_PUNCTUATION`) is
handled too: BERT's pre-tokenizer splits every character of a Unicode punctuation category off as a word, and
lower-casing and accent stripping leave these unchanged. In WikiText-2's test sentences one in 23 has an en or em
dash, and the library costs six times the fast path on them (72 against 12 µs a sentence, 8 at a time).

Anything else goes to the library: any other character outside printable ASCII, tab, newline and return (letters
with accents, symbols such as ° or −, which BERT keeps inside words); a pipeline not of this shape; pairs; requests
for character offsets. `tests/model/test_ascii_wordpiece.py` compares the two on every WikiText-2 line and on
generated text (ASCII and that punctuation).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping

MAX_WORD_CHARS = 100  # the library's max_input_chars_per_word for BERT
CACHE_WORDS = 100_000  # words whose pieces are remembered (a few MB); the cache starts over when full


def _extra_punctuation() -> str:
    """Non-ASCII characters of a Unicode punctuation category (BERT's `_is_punctuation`) from Latin-1 and General
    Punctuation that NFD, lower- and upper-casing leave as they are: the pipeline makes each a word of its own."""
    candidates = map(chr, [*range(0xA1, 0xC0), *range(0x2010, 0x205F)])
    return "".join(ch for ch in candidates if unicodedata.category(ch).startswith("P")
                   and unicodedata.normalize("NFD", ch) == ch == ch.lower() == ch.upper())


EXTRA_PUNCTUATION = _extra_punctuation()
_NOT_HANDLED = re.compile(r"[^\x20-\x7e\t\n\r" + re.escape(EXTRA_PUNCTUATION) + "]")
_UNCASED_WORDS = re.compile(r"[a-z0-9]+|[^\sa-z0-9]")
_CASED_WORDS = re.compile(r"[A-Za-z0-9]+|[^\sA-Za-z0-9]")


def from_pipeline(spec: Mapping) -> AsciiWordPiece | None:
    """The fast path for a `tokenizers` pipeline (its JSON, `Tokenizer.to_str()`), or None unless the pipeline is
    one whose effect on ASCII it reproduces exactly: BertNormalizer, then any `Replace` of one string by another;
    BertPreTokenizer; WordPiece with `##`, 100 characters a word and an [UNK] in its vocabulary; added tokens of
    ASCII without the single-word or strip options."""
    normalizer, model = spec.get("normalizer") or {}, spec.get("model") or {}
    steps = normalizer.get("normalizers", []) if normalizer.get("type") == "Sequence" else [normalizer]
    if not steps or steps[0].get("type") != "BertNormalizer":
        return None
    lowercase = bool(steps[0].get("lowercase"))
    replacements = []
    for step in steps[1:]:
        pattern = step.get("pattern") or {}
        if step.get("type") != "Replace" or set(pattern) != {"String"} or not _ascii(pattern["String"], step["content"]):
            return None
        replacements.append((pattern["String"], step["content"]))
    if (spec.get("pre_tokenizer") or {}).get("type") != "BertPreTokenizer" or model.get("type") != "WordPiece" or \
            model.get("continuing_subword_prefix") != "##" or model.get("max_input_chars_per_word") != MAX_WORD_CHARS:
        return None
    vocab = model.get("vocab") or {}
    if model.get("unk_token") not in vocab:
        return None
    raw, normalized = {}, {}
    for token in spec.get("added_tokens") or []:
        content = token.get("content", "")
        if not content or not _ascii(content) or token.get("single_word") or token.get("lstrip") or token.get("rstrip"):
            return None
        if token.get("normalized"):
            normalized[_normalize(content, lowercase, replacements)] = token["id"]
        else:
            raw[content] = token["id"]
    return AsciiWordPiece(vocab, vocab[model["unk_token"]], lowercase, replacements, raw, normalized)


def _ascii(*texts: str) -> bool:
    return all(text.isascii() and not _NOT_HANDLED.search(text) for text in texts)


def _normalize(text: str, lowercase: bool, replacements: list[tuple[str, str]]) -> str:
    if lowercase:
        text = text.lower()
    for old, new in replacements:
        text = text.replace(old, new)
    return text


def _splitter(tokens: Mapping[str, int]) -> re.Pattern | None:
    """A pattern whose split keeps the tokens, leftmost and, among those starting there, longest first."""
    if not tokens:
        return None
    return re.compile("(" + "|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True)) + ")")


class AsciiWordPiece:
    """`ids(text)`: the ids between [CLS] and [SEP] for a text it handles, else None."""

    def __init__(self, vocab: Mapping[str, int], unk_id: int, lowercase: bool,
                 replacements: list[tuple[str, str]], raw_tokens: Mapping[str, int],
                 normalized_tokens: Mapping[str, int]):
        self.vocab = dict(vocab)
        self.unk_id = unk_id
        self.lowercase = lowercase
        self.replacements = replacements
        self.raw_tokens, self.normalized_tokens = dict(raw_tokens), dict(normalized_tokens)
        self._raw_split, self._normalized_split = _splitter(raw_tokens), _splitter(normalized_tokens)
        self._words = _UNCASED_WORDS if lowercase else _CASED_WORDS
        # Tuples, not lists: the garbage collector stops tracking a tuple of ints, while 100,000 cached lists
        # would all be walked by every full collection of a serving process (see service/memory.py).
        self._pieces: dict[str, tuple[int, ...]] = {}

    def ids(self, text: str) -> list[int] | None:
        if _NOT_HANDLED.search(text):
            return None
        ids: list[int] = []
        parts = self._raw_split.split(text) if self._raw_split else [text]
        for index, part in enumerate(parts):
            if index % 2:  # re.split puts the matched tokens at the odd places
                ids.append(self.raw_tokens[part])
            elif part:
                self._normalized_part(_normalize(part, self.lowercase, self.replacements), ids)
        return ids

    def _normalized_part(self, text: str, ids: list[int]) -> None:
        parts = self._normalized_split.split(text) if self._normalized_split else [text]
        for index, part in enumerate(parts):
            if index % 2:
                ids.append(self.normalized_tokens[part])
            elif part:
                self._words_of(part, ids)

    def _words_of(self, text: str, ids: list[int]) -> None:
        pieces = self._pieces
        for word in self._words.findall(text):
            found = pieces.get(word)
            if found is None:
                found = self._word_pieces(word)
                if len(pieces) >= CACHE_WORDS:
                    pieces.clear()
                pieces[word] = found
            ids.extend(found)

    def _word_pieces(self, word: str) -> tuple[int, ...]:
        if len(word) > MAX_WORD_CHARS:
            return (self.unk_id,)
        whole = self.vocab.get(word)
        if whole is not None:
            return (whole,)
        ids, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                found = self.vocab.get(piece)
                if found is not None:
                    ids.append(found)
                    start = end
                    break
            else:
                return (self.unk_id,)  # a part no piece matches: the whole word is unknown
        return tuple(ids)
