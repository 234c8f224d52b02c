"""`python -m service`: flags generated from Settings (each also an environment variable), then one process
(`--workers 0`) or the engine process and its front ends (`service.supervisor`)."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Literal, get_args, get_origin

from pydantic import ValidationError

from service.logs import configure_logging
from service.settings import Settings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m service",
        description="Serve a BERT checkpoint: POST /encode, /fill-mask, /nsp; GET /health, /info, /metrics, /docs. "
                    "Every flag can also be set by the environment variable shown.",
    )
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        env = "BERT_" + name.upper()
        help_text = f"{field.description} [env {env}; default: {field.default}]"
        annotation = field.annotation
        if annotation is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif get_origin(annotation) is Literal:
            parser.add_argument(flag, choices=list(get_args(annotation)), default=None, help=help_text)
        elif get_origin(annotation) is list:  # given once per item (several models: --checkpoint a=... --checkpoint b=...)
            parser.add_argument(flag, action="append", default=None, help=help_text)
        else:
            parser.add_argument(flag, default=None, help=help_text)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if v is not None}
    try:
        settings = Settings(**overrides)  # flags win over environment variables
    except ValidationError as exc:
        for error in exc.errors():
            where = ".".join(str(p) for p in error["loc"]) or "settings"
            print(f"error: {where}: {error['msg']}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    from model.hub import CheckpointSourceError, resolve_checkpoint

    specs = settings.models()
    sources = {}
    for spec in specs:  # a directory, or a Hub id fetched into the cache now: a bad one ends here, before the port
        try:
            sources[spec.name] = resolve_checkpoint(spec.checkpoint)
        except CheckpointSourceError as exc:
            print(f"error: model {spec.name}: {exc}" if len(specs) > 1 else f"error: {exc}", file=sys.stderr)
            return 2

    from service.supervisor import Supervisor, auto_workers

    workers = auto_workers(settings.device) if settings.workers == "auto" else settings.workers
    if workers > 0:
        return Supervisor(settings, workers, sources).run()

    from service.app import create_app
    from service.frontend.serve import serve_http

    app = create_app(settings.model_copy(update={"workers": 0}))
    app.state.runtime.set_sources(sources)  # resolved already: the runtime does not ask the Hub again
    failure = serve_http(app, settings)
    if failure is not None:
        print(f"error: {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
