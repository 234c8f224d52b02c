"""`python -m service`: flags generated from Settings (each also an environment variable), then uvicorn."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import Literal, get_args, get_origin

from pydantic import ValidationError

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
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # one line per Hub request; model.hub logs the progress
    from model.hub import CheckpointSourceError, resolve_checkpoint

    try:  # a directory, or a Hub id fetched into the cache now: a bad one ends here, before the port is bound
        source = resolve_checkpoint(settings.checkpoint)
    except CheckpointSourceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    import uvicorn

    from service.app import create_app

    app = create_app(settings)
    runtime = app.state.runtime
    runtime.source = source  # resolved already: the loader does not ask the Hub again

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            # Health turns 503 and new requests are refused at once; accepted ones finish; then exit 0.
            # (uvicorn's own handler re-raises the signal after shutdown, which would end us with -15.)
            runtime.lifecycle.drain()
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            elif settings.drain_seconds > 0:
                asyncio.get_event_loop().call_later(settings.drain_seconds, setattr, self, "should_exit", True)
            else:
                self.should_exit = True

    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                            timeout_keep_alive=settings.keep_alive_s,
                            timeout_graceful_shutdown=max(30, settings.queue_timeout_s + 5), access_log=False)
    server = Server(config)
    failed: list[Exception] = []

    def stop_on_failure(exc: Exception) -> None:
        failed.append(exc)
        server.should_exit = True

    app.state.on_load_failure = stop_on_failure
    server.run()
    if failed:
        print(f"error: {failed[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
