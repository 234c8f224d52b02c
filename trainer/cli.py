"""`python -m trainer`: argparse generated from TrainOptions, errors as one clear line."""

from __future__ import annotations

import argparse
import logging
import sys
import types
import typing
from dataclasses import MISSING, fields
from pathlib import Path

from trainer.options import TrainOptions

EXAMPLES = """examples:
  python -m trainer --corpus ../shared/data/wikitext-2/wiki.valid.tokens \\
                    --eval-corpus ../shared/data/wikitext-2/wiki.test.tokens --output runs/mini --time-budget 10
  python -m trainer --corpus wikitext-103 --output runs/base --preset base --max-steps 100000
  torchrun --nproc-per-node 8 -m trainer --corpus wikitext-103 --output runs/base --preset base
  python -m trainer --corpus my_texts/ --output runs/mine --resume
  python -m trainer --corpus enwiki.txt.xz:4 --corpus books/:1 --eval-corpus held_out.txt --output runs/mix
"""


def _base_type(annotation):
    hint = typing.get_type_hints(TrainOptions)[annotation]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainer", description="Pre-train BERT (masked LM + next-sentence prediction) into a "
        "checkpoint directory that the service serves and transformers opens.", epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for f in fields(TrainOptions):
        flag = "--" + f.name.replace("_", "-")
        kind = _base_type(f.name)
        meta = f.metadata
        default = None if f.default is MISSING else f.default
        help_text = (meta["help"] + ("" if default is None else f" (default: {default})")).replace("%", "%%")
        if typing.get_origin(kind) is list:
            parser.add_argument(flag, action="append", help=help_text, required=meta.get("required", False))
        elif kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        else:
            parser.add_argument(flag, type=Path if kind is Path else kind, default=default, help=help_text,
                                choices=meta.get("choices"), required=meta.get("required", False))
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    # torch (through the checkpoint code and the loop) is imported only after --help is answered
    from model.checkpoint import CheckpointError
    from model.config import ConfigError
    from model.hub import resolve_checkpoint
    from model.tokenizer import TokenizerError
    from trainer.data.corpus import CorpusError
    from trainer.data.download import EXIT_PERMANENT, EXIT_TRANSIENT, DownloadError
    from trainer.loop import Interrupted, train
    from trainer.run_files import command_line

    try:
        if args.init_from is not None:  # a directory, or a Hub id (org/name[@revision]) fetched into the Hub cache
            args.init_from = resolve_checkpoint(args.init_from).path
        options = TrainOptions(**vars(args))
        output = train(options, command_line(argv))  # main([...]) from Python: its list, not this process's argv
    except Interrupted as interrupt:
        return 128 + interrupt.signum
    except DownloadError as exc:  # a distinct code, so a supervisor can tell "retry later" from "never"
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_PERMANENT if exc.permanent else EXIT_TRANSIENT
    except (CorpusError, CheckpointError, ConfigError, TokenizerError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # disk full, unwritable output: say so, no traceback
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        print(f"error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    print(f"checkpoint written to {output}")
    return 0
