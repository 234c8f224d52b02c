"""What can go wrong for a client, as plain Python: an error kind and a message fit to show.

The kinds are the service's vocabulary; `service.frontend.http_errors` alone turns them into HTTP responses.
This module imports nothing, so the batcher and the engine can raise these without knowing HTTP.
"""

from __future__ import annotations

KINDS = frozenset({
    "validation", "empty", "unsupported", "unauthorized", "payload_too_large", "unsupported_media_type", "overloaded",
    "unavailable", "not_found", "method_not_allowed", "internal", "request_timeout",
})


class ServiceError(Exception):
    """A failure with a kind from KINDS and a message fit for the client."""

    def __init__(self, kind: str, message: str, retry_after_s: float | None = None, param: str | None = None):
        super().__init__(message)
        if kind not in KINDS:
            raise ValueError(f"unknown error kind {kind!r}")
        self.kind = kind
        self.message = message
        self.retry_after_s = retry_after_s
        self.param = param  # the request field at fault, when one is (OpenAI's error body names it)
