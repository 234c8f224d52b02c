"""From `--corpus` (one or more, with weights) and `--eval-corpus` to token caches and a tokenizer.

Per corpus, once: sentences split on every core into a cache file (`trainer.data.sentences`); per
(corpus, tokenizer), once: token ids in memory-mapped files (`trainer.data.tokens`). A vocabulary is
trained on a sample of the training sentences. Nothing here holds a whole corpus in memory.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

from model.tokenizer import WordPieceTokenizer
from trainer.data.corpus import CorpusError, checksum, corpus_files
from trainer.data.download import REMOTE_CORPORA, fetch
from trainer.data.sentences import write_sentence_file
from trainer.data.tokens import TokenizedCorpus, build_token_cache, sample_sentences
from trainer.options import TrainOptions
from trainer.data.prepared import is_prepared, load_prepared

log = logging.getLogger("trainer")
# Bump when corpus cleaning, sentence splitting or the cache layout changes: every cache is rebuilt.
PIPELINE_VERSION = 3


@dataclass
class Source:
    """One `--corpus` entry: where its text is, and its weight in the mix (None = by size)."""

    path: Path
    weight: float | None
    checksum: str = ""
    eval_path: Path | None = None  # a named corpus's own validation split


@dataclass
class PreparedData:
    tokenizer: WordPieceTokenizer
    train: list[TokenizedCorpus]
    weights: list[float] | None
    eval: TokenizedCorpus
    description: dict


def parse_source(spec: str, cache_dir: Path) -> Source:
    """`PATH`, `PATH:WEIGHT`, `NAME` or `NAME:WEIGHT` (NAME: a public corpus, downloaded once)."""
    name, _, weight_text = spec.rpartition(":")
    weight = None
    if name and not Path(spec).exists():
        try:
            weight = float(weight_text)
        except ValueError:
            name = spec
        else:
            if not weight > 0:
                raise CorpusError(f"--corpus {spec}: the weight must be a positive number")
    else:
        name = spec
    if name in REMOTE_CORPORA:
        train, default_eval = fetch(name, cache_dir)
        return Source(train, weight, eval_path=default_eval)
    return Source(Path(name), weight)


def sentence_file(path: Path, options: TrainOptions) -> tuple[Path, str]:
    """The cached sentence split of a corpus (made on first use); and the corpus checksum."""
    corpus_sum = checksum(corpus_files(path))
    target = options.cache_dir / "sentences" / f"v{PIPELINE_VERSION}-{corpus_sum}.txt"
    if not target.is_file():
        log.info("splitting %s into sentences (once; cached in %s)", path, target)
        write_sentence_file(path, target, options.workers or None)
    if target.stat().st_size == 0:
        raise CorpusError(f"corpus {path}: no text found (empty or whitespace only)")
    return target, corpus_sum


def token_cache(path: Path, options: TrainOptions, tokenizer: WordPieceTokenizer) -> tuple[TokenizedCorpus, str]:
    if is_prepared(path):  # token ids prepared elsewhere (trainer.data.prepared): nothing to split or tokenize
        return load_prepared(path, tokenizer)
    sentences, corpus_sum = sentence_file(path, options)
    directory = options.cache_dir / "tokens" / f"v{PIPELINE_VERSION}-{corpus_sum}-{tokenizer.fingerprint()}"
    corpus = TokenizedCorpus.load(directory)
    if corpus is None:
        log.info("tokenizing %s into %s", path, directory)
        corpus = build_token_cache(sentences, tokenizer, directory)
    if corpus.num_tokens == 0:
        raise CorpusError(f"corpus {path}: no text found (empty or whitespace only)")
    return corpus, corpus_sum


def train_tokenizer(sources: list[Source], options: TrainOptions) -> WordPieceTokenizer:
    files = [sentence_file(s.path, options)[0] for s in sources]
    key = hashlib.sha256("|".join(f.name for f in files).encode()).hexdigest()[:16]
    directory = options.cache_dir / f"tokenizer-v{PIPELINE_VERSION}-{key}-{options.vocab_size}-{options.tokenizer_sample}"
    if (directory / "tokenizer.json").is_file():
        return WordPieceTokenizer.load(directory)
    log.info("training a %d-token WordPiece vocabulary on a sample of %d sentences", options.vocab_size,
             options.tokenizer_sample)
    tokenizer = WordPieceTokenizer.train(sample_sentences(files, options.tokenizer_sample), vocab_size=options.vocab_size)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(directory)
    return tokenizer


def prepare(options: TrainOptions, tokenizer: WordPieceTokenizer | None = None) -> PreparedData:
    sources = [parse_source(spec, options.cache_dir) for spec in options.corpus]
    given = [s.weight is not None for s in sources]
    if any(given) and not all(given):
        raise CorpusError("give a weight to every --corpus or to none (PATH:WEIGHT); without weights each "
                          "source is read in proportion to its size")
    if tokenizer is None and options.init_from is not None:
        from model.checkpoint import load_checkpoint

        tokenizer = load_checkpoint(options.init_from).tokenizer
    if tokenizer is None:
        tokenizer = train_tokenizer(sources, options)

    train = []
    for source in sources:
        corpus, source.checksum = token_cache(source.path, options, tokenizer)
        train.append(corpus)
    eval_path = Path(options.eval_corpus) if options.eval_corpus else sources[0].eval_path
    if eval_path is not None:
        held_out, _ = token_cache(eval_path, options, tokenizer)
        eval_note = str(eval_path)
    else:
        train[0], held_out = split_documents(train[0], options.eval_fraction)
        eval_note = f"last {options.eval_fraction:.0%} of the documents of {sources[0].path}"
    for name, corpus in [*((f"training ({s.path})", c) for s, c in zip(sources, train)), ("evaluation", held_out)]:
        if corpus.num_documents < 2:
            raise CorpusError(f"the {name} corpus has {corpus.num_documents} document(s); "
                              "next-sentence pairs need at least two")
    weights = [s.weight for s in sources] if all(given) else None
    total_weight = sum(weights) if weights else sum(c.num_tokens for c in train)
    description = {
        "train": [{"path": str(s.path), "checksum": s.checksum, "documents": c.num_documents, "tokens": c.num_tokens,
                   "share": (s.weight if weights else c.num_tokens) / total_weight} for s, c in zip(sources, train)],
        "train_documents": sum(c.num_documents for c in train), "train_tokens": sum(c.num_tokens for c in train),
        "eval": eval_note, "eval_documents": held_out.num_documents, "eval_tokens": held_out.num_tokens,
    }
    return PreparedData(tokenizer, train, weights, held_out, description)


def split_documents(corpus: TokenizedCorpus, fraction: float) -> tuple[TokenizedCorpus, TokenizedCorpus]:
    """Hold out the last `fraction` of documents (a fixed slice, so runs are comparable)."""
    held = max(2, round(corpus.num_documents * fraction)) if fraction > 0 else 0
    cut = corpus.num_documents - held
    if cut < 2:
        raise CorpusError(f"the corpus has only {corpus.num_documents} document(s): too few to hold some out; "
                          "give --eval-corpus")
    return corpus.documents(0, cut), corpus.documents(cut, corpus.num_documents)


__all__ = ["PreparedData", "Source", "parse_source", "prepare", "split_documents"]
