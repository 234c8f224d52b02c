"""WordPiece tokenizer for BERT, built on the `tokenizers` library.

Saved as `vocab.txt` + `tokenizer.json` (+ `tokenizer_config.json`, `special_tokens_map.json`) so
that `transformers.BertTokenizerFast.from_pretrained(dir)` opens it and yields the same ids.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from model.ascii_wordpiece import from_pipeline
from model.files import read_json_object

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
# WikiText replaces rare words with this marker; it must read as one [UNK], not `<`, `unk`, `>`.
WIKITEXT_UNK = "<unk>"


class TokenizerError(ValueError):
    """A tokenizer file is missing or unusable; the message names the file."""


@dataclass(frozen=True)
class EncodedText:
    ids: list[int]
    type_ids: list[int]
    offsets: list[tuple[int, int]]
    truncated: bool
    vocab: Sequence[str]  # the tokenizer's, id -> token

    @property
    def tokens(self) -> list[str]:
        """The token strings, read off the vocabulary when asked (most requests never show them)."""
        return [self.vocab[i] for i in self.ids]


def _bert_pipeline(tok: Tokenizer, lowercase: bool) -> None:
    # The `<unk>` rewrite runs after lower-casing, so it writes the normalized form of [UNK]; the
    # [UNK] added token is registered as normalized (below), so it matches that form.
    tok.normalizer = normalizers.Sequence(
        [
            normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase),
            normalizers.Replace(WIKITEXT_UNK, UNK.lower() if lowercase else UNK),
        ]
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")


def _special_added_tokens(lowercase: bool) -> list[AddedToken]:
    return [AddedToken(t, normalized=(t == UNK and lowercase), special=True) for t in SPECIAL_TOKENS]


@dataclass(frozen=True)
class TextPieces:
    """One text's word pieces without special tokens, and where each came from: what token classification and
    question answering need to map predictions back onto the text."""

    ids: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]]  # character offsets into the text
    words: list[int | None]  # the pre-tokenizer's word each piece belongs to


class WordPieceTokenizer:
    """BERT's tokenizer: lower-casing normalizer, WordPiece, `[CLS] A [SEP] B [SEP]` with segment ids."""

    def __init__(self, backend: Tokenizer, model_max_length: int = 512, lowercase: bool = True):
        for token in SPECIAL_TOKENS:
            if backend.token_to_id(token) is None:
                raise TokenizerError(f"the vocabulary has no {token} token")
        self.model_max_length = model_max_length
        self.lowercase = lowercase
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            backend.token_to_id(t) for t in SPECIAL_TOKENS
        )
        backend.post_processor = processors.TemplateProcessing(
            single=f"{CLS} $A {SEP}",
            pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
            special_tokens=[(CLS, self.cls_id), (SEP, self.sep_id)],
        )
        backend.no_padding()
        backend.no_truncation()
        self._backend = backend
        # A second copy that truncates: truncation is state on a `tokenizers.Tokenizer`, and the
        # service encodes from several threads, so each mode gets its own immutable instance.
        definition = backend.to_str()  # the vocabulary's JSON: made once for the three readers below
        self._truncating = Tokenizer.from_str(definition)
        self._truncating.enable_truncation(model_max_length, strategy="longest_first")
        self._truncating_left = Tokenizer.from_str(definition)  # keeps the ends of long texts
        self._truncating_left.enable_truncation(model_max_length, strategy="longest_first", direction="left")
        self._vocab_list: list[str] | None = None
        self._ascii = from_pipeline(json.loads(definition))  # None: this pipeline runs in the library only

    # ---- construction --------------------------------------------------------------------------

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        vocab_size: int = 8192,
        min_frequency: int = 2,
        lowercase: bool = True,
        model_max_length: int = 512,
    ) -> "WordPieceTokenizer":
        tok = Tokenizer(models.WordPiece(unk_token=UNK, max_input_chars_per_word=100))
        _bert_pipeline(tok, lowercase)
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=[AddedToken(t, normalized=False, special=True) for t in SPECIAL_TOKENS],
            continuing_subword_prefix="##",
        )
        # The marker is not a word: keep its characters out of the learned vocabulary.
        tok.train_from_iterator((t.replace(WIKITEXT_UNK, " ") for t in texts), trainer=trainer)
        tok.add_special_tokens(_special_added_tokens(lowercase))
        return cls(tok, model_max_length=model_max_length, lowercase=lowercase)

    @classmethod
    def from_vocab(cls, vocab: Sequence[str], lowercase: bool = True, model_max_length: int = 512) -> "WordPieceTokenizer":
        tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token=UNK, max_input_chars_per_word=100))
        _bert_pipeline(tok, lowercase)
        tok.add_special_tokens(_special_added_tokens(lowercase))
        return cls(tok, model_max_length=model_max_length, lowercase=lowercase)

    @classmethod
    def load(cls, directory: str | Path, max_length_cap: int | None = None) -> "WordPieceTokenizer":
        """Open `tokenizer.json` if present (ours or a transformers one), else build from `vocab.txt`.

        `max_length_cap` (the model's position count) bounds `model_max_length` from the config.
        """
        directory = Path(directory)
        settings = read_json_object(directory / "tokenizer_config.json", TokenizerError)
        lowercase = bool(settings.get("do_lower_case", True))
        max_len = settings.get("model_max_length", 512)
        # transformers writes a huge sentinel when no limit is known
        max_len = max_len if isinstance(max_len, int) and 0 < max_len < 1_000_000 else 512
        if max_length_cap is not None:
            max_len = min(max_len, max_length_cap)
        tokenizer_file, vocab_file = directory / "tokenizer.json", directory / "vocab.txt"
        if tokenizer_file.is_file():
            try:
                backend = Tokenizer.from_file(str(tokenizer_file))
            except Exception as exc:  # the library raises a bare Exception on malformed JSON
                raise TokenizerError(f"{tokenizer_file}: not a valid tokenizers file ({exc})") from None
            return cls(_require_wordpiece(backend, tokenizer_file), model_max_length=max_len, lowercase=lowercase)
        if vocab_file.is_file():
            try:
                vocab = vocab_file.read_text(encoding="utf-8").splitlines()
            except (OSError, UnicodeDecodeError) as exc:
                raise TokenizerError(f"{vocab_file}: cannot be read ({exc})") from None
            try:
                return cls.from_vocab(vocab, lowercase=lowercase, model_max_length=max_len)
            except TokenizerError as exc:
                raise TokenizerError(f"{vocab_file}: {exc}") from None
        raise TokenizerError(f"{directory}: no tokenizer.json or vocab.txt")

    def save(self, directory: str | Path, model_max_length: int | None = None) -> None:
        """`model_max_length` overrides the recorded limit (a checkpoint caps it at the model's positions)."""
        directory = Path(directory)
        self._backend.save(str(directory / "tokenizer.json"))
        (directory / "vocab.txt").write_text("".join(t + "\n" for t in self.vocab), encoding="utf-8")
        specials = {"unk_token": UNK, "sep_token": SEP, "pad_token": PAD, "cls_token": CLS, "mask_token": MASK}
        config = {
            "tokenizer_class": "BertTokenizer",
            "do_lower_case": self.lowercase,
            "tokenize_chinese_chars": True,
            "strip_accents": None,
            "model_max_length": model_max_length or self.model_max_length,
            "clean_up_tokenization_spaces": True,
            **specials,
        }
        (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
        (directory / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")

    # ---- vocabulary ----------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def vocab(self) -> list[str]:
        if self._vocab_list is None:
            by_id = sorted(self._backend.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
            if [i for _, i in by_id] != list(range(len(by_id))):
                raise TokenizerError("vocabulary ids are not contiguous")
            self._vocab_list = [t for t, _ in by_id]
        return self._vocab_list

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str:
        return self.vocab[token_id]

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset((self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id))

    # ---- encoding ------------------------------------------------------------------------------

    def encode(self, text: str, pair: str | None = None, truncate: bool = False) -> EncodedText:
        return self.encode_batch([text if pair is None else (text, pair)], truncate=truncate, offsets=True)[0]

    def encode_batch(self, inputs: Sequence[str | tuple[str, str]], truncate: bool = False,
                     direction: str = "right", offsets: bool = False) -> list[EncodedText]:
        """Encode texts or (a, b) pairs with special tokens. With `truncate`, pairs are cut
        longest-first to `model_max_length`, at their ends (`direction` right) or starts (left);
        without it, nothing is cut (callers check length). Character `offsets` cost about a fifth
        of the encoding (tokenizers' encode_batch_fast skips them): without them they are all (0, 0)."""
        backend = (self._truncating if direction == "right" else self._truncating_left) if truncate else self._backend
        encode = backend.encode_batch if offsets else backend.encode_batch_fast
        vocab = self.vocab
        fast = [None] * len(inputs) if offsets or self._ascii is None else \
            [self._ascii.ids(text) if isinstance(text, str) else None for text in inputs]
        rest = [text for text, ids in zip(inputs, fast) if ids is None]
        slow = iter(encode(rest, add_special_tokens=True) if rest else ())
        encoded = []
        for ids in fast:
            if ids is None:
                e = next(slow)
                encoded.append(EncodedText(e.ids, e.type_ids, e.offsets, bool(e.overflowing), vocab))
            else:
                encoded.append(self._with_specials(ids, truncate, direction, vocab))
        return encoded

    def _with_specials(self, ids: list[int], truncate: bool, direction: str, vocab: Sequence[str]) -> EncodedText:
        """`[CLS] ids [SEP]` as the library's post-processor and truncation make it (model_max_length in all)."""
        room = self.model_max_length - 2
        truncated = truncate and len(ids) > room
        if truncated:
            ids = ids[:room] if direction == "right" else ids[len(ids) - room:]
        ids = [self.cls_id, *ids, self.sep_id]
        return EncodedText(ids, [0] * len(ids), [(0, 0)] * len(ids), truncated, vocab)

    def pieces(self, texts: Sequence[str]) -> list[TextPieces]:
        e = self._backend.encode_batch(list(texts), add_special_tokens=False)
        return [TextPieces(x.ids, x.tokens, x.offsets, x.word_ids) for x in e]

    def join_tokens(self, tokens: Sequence[str]) -> str:
        """Token strings as text, the way transformers' `convert_tokens_to_string` joins them (the decoder's rule)."""
        decoder = self._backend.decoder
        return decoder.decode(list(tokens)) if decoder is not None else " ".join(tokens)

    def tokenize_words(self, texts: Sequence[str]) -> list[list[int]]:
        """Word-piece ids without special tokens, for building training examples."""
        return [e.ids for e in self._backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def fingerprint(self) -> str:
        """A stable hash of the whole tokenizer definition (for cache keys)."""
        return hashlib.sha256(self._backend.to_str().encode()).hexdigest()[:16]


def _require_wordpiece(backend: Tokenizer, path: Path) -> Tokenizer:
    kind = type(backend.model).__name__
    if kind != "WordPiece":
        raise TokenizerError(f"{path}: model is {kind}, BERT needs WordPiece")
    return backend
