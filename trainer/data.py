"""From `--corpus`/`--eval-corpus` to tokenized train and eval corpora and a tokenizer."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path

from model.checkpoint import load_checkpoint
from model.tokenizer import WordPieceTokenizer
from trainer.corpus import CorpusError, checksum, corpus_files, read_documents
from trainer.download import REMOTE_CORPORA, fetch
from trainer.examples import TokenizedCorpus, tokenize, tokenize_cached
from trainer.options import TrainOptions

log = logging.getLogger("trainer")
# Bump when corpus cleaning or sentence splitting changes, so cached tokenizers and ids are rebuilt.
PIPELINE_VERSION = 2


@dataclass
class PreparedData:
    tokenizer: WordPieceTokenizer
    train: TokenizedCorpus
    eval: TokenizedCorpus
    description: dict


def resolve_paths(options: TrainOptions) -> tuple[Path, Path | None]:
    if options.corpus in REMOTE_CORPORA:
        train, default_eval = fetch(options.corpus, options.cache_dir)
        return train, Path(options.eval_corpus) if options.eval_corpus else default_eval
    return Path(options.corpus), Path(options.eval_corpus) if options.eval_corpus else None


def prepare(options: TrainOptions, tokenizer: WordPieceTokenizer | None = None) -> PreparedData:
    train_path, eval_path = resolve_paths(options)
    train_files = corpus_files(train_path)
    corpus_sum = checksum(train_files)
    # Read (and sentence-split) at most once, and only if the tokenizer or the token cache needs it.
    train_documents = functools.cache(lambda: read_documents(train_path))

    if tokenizer is None and options.init_from is not None:
        tokenizer = load_checkpoint(options.init_from).tokenizer
    if tokenizer is None:
        tokenizer_dir = options.cache_dir / f"tokenizer-v{PIPELINE_VERSION}-{corpus_sum}-{options.vocab_size}"
        if (tokenizer_dir / "tokenizer.json").is_file():
            tokenizer = WordPieceTokenizer.load(tokenizer_dir)
        else:
            log.info("training a %d-token WordPiece vocabulary on %s", options.vocab_size, train_path)
            texts = (s for d in train_documents() for s in d.sentences)
            tokenizer = WordPieceTokenizer.train(texts, vocab_size=options.vocab_size)
            tokenizer_dir.mkdir(parents=True, exist_ok=True)
            tokenizer.save(tokenizer_dir)

    cache = options.cache_dir / "tokens" / f"v{PIPELINE_VERSION}-{corpus_sum}-{tokenizer.fingerprint()}.safetensors"
    train = tokenize_cached(train_documents, tokenizer, cache)
    if eval_path is not None:
        eval_files = corpus_files(eval_path)
        eval_cache = options.cache_dir / "tokens" / f"v{PIPELINE_VERSION}-{checksum(eval_files)}-{tokenizer.fingerprint()}.safetensors"
        held_out = tokenize_cached(lambda: read_documents(eval_path), tokenizer, eval_cache)
    else:
        train, held_out = split_documents(train, options.eval_fraction)
    for name, corpus in (("training", train), ("evaluation", held_out)):
        if corpus.num_documents < 2:
            raise CorpusError(f"the {name} corpus has {corpus.num_documents} document(s); "
                              "next-sentence pairs need at least two")
    description = {
        "train": str(train_path), "train_checksum": corpus_sum, "train_documents": train.num_documents,
        "train_tokens": train.num_tokens, "eval": str(eval_path) if eval_path else f"last {options.eval_fraction:.0%} of train documents",
        "eval_documents": held_out.num_documents, "eval_tokens": held_out.num_tokens,
    }
    return PreparedData(tokenizer, train, held_out, description)


def split_documents(corpus: TokenizedCorpus, fraction: float) -> tuple[TokenizedCorpus, TokenizedCorpus]:
    """Hold out the last `fraction` of documents (a fixed slice, so runs are comparable)."""
    held = max(2, round(corpus.num_documents * fraction)) if fraction > 0 else 0
    cut = corpus.num_documents - held
    if cut < 2:
        raise CorpusError(f"the corpus has only {corpus.num_documents} document(s): too few to hold some out; "
                          "give --eval-corpus")
    return _subset(corpus, 0, cut), _subset(corpus, cut, corpus.num_documents)


def _subset(corpus: TokenizedCorpus, first_doc: int, end_doc: int) -> TokenizedCorpus:
    s0, s1 = int(corpus.document_offsets[first_doc]), int(corpus.document_offsets[end_doc])
    t0, t1 = int(corpus.sentence_offsets[s0]), int(corpus.sentence_offsets[s1])
    return TokenizedCorpus(
        ids=corpus.ids[t0:t1],
        sentence_offsets=corpus.sentence_offsets[s0 : s1 + 1] - t0,
        document_offsets=corpus.document_offsets[first_doc : end_doc + 1] - s0,
    )


__all__ = ["PreparedData", "prepare", "split_documents", "tokenize"]
