"""A corpus prepared here and carried as token ids: `python -m trainer --corpus DIR` where DIR is a token cache
(trainer.data.tokens' layout) with a `prepared.json` naming the tokenizer it was made with.

Why: a GPU machine without network gets only what travels with the repository, within a size limit. The raw text
of a slice of Wikipedia is twice the size of its token ids, and splitting and tokenizing it there would spend GPU
minutes on the host. So a slice is cut and tokenized here, once, to fit a size (`python -m trainer.data.prepared`,
`make gpu-corpus`), and the trainer reads it as it reads its own caches.

    python -m trainer.data.prepared --corpus ../shared/data/wikipedia-en/enwiki-2015-core.txt.xz \\
        --corpus ../shared/data/wikipedia-en/enwiki-2021-recent.txt.xz --init-from checkpoints/minilm-wikipedia \\
        --mib 48 --out .data/gpu-corpus/wikipedia
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from trainer.data.corpus import CorpusError
from trainer.data.tokens import TokenizedCorpus, build_token_cache

MARKER = "prepared.json"
TEXT_BYTES_PER_CACHE_BYTE = 2.0  # natural English text over its word-piece ids (uint16) and offsets, with a margin


def is_prepared(path: Path) -> bool:
    return (Path(path) / MARKER).is_file()


def load_prepared(path: Path, tokenizer) -> tuple[TokenizedCorpus, str]:
    """(the prepared corpus, its checksum); a CorpusError if it was made with another tokenizer or is incomplete."""
    info = json.loads((Path(path) / MARKER).read_text())
    if info.get("tokenizer") != tokenizer.fingerprint():
        raise CorpusError(f"corpus {path}: prepared with another tokenizer ({info.get('tokenizer')}, this run's is "
                          f"{tokenizer.fingerprint()}); prepare it again with this run's --init-from")
    corpus = TokenizedCorpus.load(Path(path))
    if corpus is None:
        raise CorpusError(f"corpus {path}: its token ids are incomplete or unreadable; prepare it again")
    return corpus, info["checksum"]


def cache_bytes(corpus: TokenizedCorpus) -> int:
    return corpus.ids.nbytes + 8 * (len(corpus.sentence_offsets) + len(corpus.document_offsets))


def fit(corpus: TokenizedCorpus, most_bytes: int) -> TokenizedCorpus:
    """The longest run of whole documents from the start whose cache takes at most `most_bytes`."""
    item = corpus.ids.dtype.itemsize
    tokens_at = corpus.sentence_offsets[corpus.document_offsets]  # tokens before each document boundary
    sizes = tokens_at * item + 8 * (corpus.document_offsets + 1) + 8 * (np.arange(corpus.num_documents + 1) + 1)
    documents = int(np.searchsorted(sizes, most_bytes, side="right")) - 1
    return corpus.documents(0, max(documents, 0))


def write_prepared(corpus: TokenizedCorpus, target: Path, tokenizer, sources: list[str]) -> dict:
    """`corpus` as a prepared directory at `target` (written whole, then renamed into place)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        digest = hashlib.sha256()
        for name, array in (("ids", corpus.ids), ("sentences", corpus.sentence_offsets),
                            ("documents", corpus.document_offsets)):
            data = np.ascontiguousarray(array).tobytes()
            (tmp / f"{name}.bin").write_bytes(data)
            digest.update(data)
        meta = {"dtype": corpus.ids.dtype.name, "tokens": corpus.num_tokens,
                "sentences": len(corpus.sentence_offsets) - 1, "documents": corpus.num_documents}
        (tmp / "meta.json").write_text(json.dumps(meta))
        info = {"tokenizer": tokenizer.fingerprint(), "checksum": digest.hexdigest()[:16], "sources": sources,
                "bytes": cache_bytes(corpus), **meta}
        (tmp / MARKER).write_text(json.dumps(info, indent=1) + "\n")
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return info


def _documents(path: Path):
    """A corpus file's documents (blank-line separated paragraphs, the layout of ../shared/data's files)."""
    opener = lzma.open if path.suffix == ".xz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        lines: list[str] = []
        for line in handle:
            if line.strip():
                lines.append(line)
            elif lines:
                yield "".join(lines)
                lines = []
        if lines:
            yield "".join(lines)


def text_slice(corpora: list[Path], text_bytes: int, target: Path) -> int:
    """The first documents of each corpus, in proportion to the corpora's (stored) sizes, about `text_bytes` in all,
    into one text file of the same layout; returns the bytes written."""
    sizes = [path.stat().st_size for path in corpora]
    written = 0
    with open(target, "w", encoding="utf-8") as out:
        for path, size in zip(corpora, sizes):
            quota, taken = text_bytes * size / sum(sizes), 0
            for document in _documents(path):
                if taken >= quota:
                    break
                out.write(document + "\n")
                taken += len(document.encode())
            written += taken
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.data.prepared", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, action="append", required=True, help="text files to slice (repeatable)")
    parser.add_argument("--init-from", type=Path, required=True, help="the checkpoint whose tokenizer the run uses")
    parser.add_argument("--mib", type=float, required=True, help="the prepared corpus's size on disk, at most")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workers", type=int, default=0, help="processes splitting sentences (0: one per core)")
    args = parser.parse_args(argv)

    from model.checkpoint import load_checkpoint
    from trainer.data.sentences import write_sentence_file

    started = time.perf_counter()
    tokenizer = load_checkpoint(args.init_from).tokenizer
    most = int(args.mib * 2**20)
    with tempfile.TemporaryDirectory(prefix="gpu-corpus-") as scratch:
        work = Path(scratch)
        text = work / "slice.txt"
        text_bytes = text_slice(args.corpus, int(most * TEXT_BYTES_PER_CACHE_BYTE), text)
        write_sentence_file(text, work / "sentences.txt", args.workers or None)
        whole = build_token_cache(work / "sentences.txt", tokenizer, work / "tokens")
        kept = fit(whole, most)
        if kept.num_documents < 4:
            print(f"error: {args.mib} MiB holds {kept.num_documents} documents; give more", file=sys.stderr)
            return 2
        info = write_prepared(kept, args.out, tokenizer, [str(p) for p in args.corpus])
    info.update(text_bytes_read=text_bytes, seconds=round(time.perf_counter() - started, 1))
    print(json.dumps(info, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
