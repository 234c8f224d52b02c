"""Prepare corpora without training: split sentences, train the vocabulary, fill the token caches.

What `python -m trainer` does first, on its own: useful to prepare a large corpus once (say on a
machine with more cores) and to measure the preparation. Prints what was prepared, the time, the
words per second of sentence splitting and the peak memory of this process and of its workers.

    python -m trainer.data.prepare --corpus ../shared/data/wikipedia-en/enwiki-2015-core.txt.xz \\
        --corpus ../shared/data/wikipedia-en/enwiki-2021-recent.txt.xz --vocab-size 16384
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import sys
import time
from pathlib import Path

from trainer.data.corpus import CorpusError
from trainer.options import TrainOptions


def peak_rss_mib() -> dict[str, float]:
    """Peak resident memory so far of this process, and of the largest of its finished children."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"this_process_mib": round(own, 1), "largest_worker_mib": round(children, 1)}


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m trainer.data.prepare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", action="append", required=True, help="as for python -m trainer (repeatable)")
    parser.add_argument("--eval-corpus")
    parser.add_argument("--init-from", type=Path, help="use this checkpoint's tokenizer instead of training one")
    parser.add_argument("--vocab-size", type=int, default=TrainOptions.vocab_size)
    parser.add_argument("--tokenizer-sample", type=int, default=TrainOptions.tokenizer_sample)
    parser.add_argument("--cache-dir", type=Path, default=TrainOptions.cache_dir)
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args(argv)

    from model.checkpoint import CheckpointError  # after --help
    from trainer.data.pipeline import prepare

    started = time.perf_counter()
    try:
        options = TrainOptions(corpus=args.corpus, eval_corpus=args.eval_corpus, output=args.cache_dir / "unused",
                               init_from=args.init_from, vocab_size=args.vocab_size, tokenizer_sample=args.tokenizer_sample,
                               cache_dir=args.cache_dir, workers=args.workers, progress=False)
        data = prepare(options)
    except (CorpusError, CheckpointError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report = {**data.description, "vocab_size": data.tokenizer.vocab_size,
              "seconds": round(time.perf_counter() - started, 1), "peak_rss": peak_rss_mib()}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
