"""The one place where failures become gRPC status codes, as text-embeddings-inference's gRPC server maps its
error types (router/src/grpc/server.rs, `impl From<ErrorResponse> for Status`):

    TEI error type            our kinds                               gRPC code
    Validation, Empty         validation, empty                       INVALID_ARGUMENT
    Overloaded                overloaded                              RESOURCE_EXHAUSTED
    Unhealthy                 unavailable                             UNAVAILABLE
    Backend, Tokenizer        unsupported (no head for the call),     FAILED_PRECONDITION
                              internal (a batch failed on the device)

and for what TEI answers outside that enum: a missing or wrong API key UNAUTHENTICATED, a message over the size
limit RESOURCE_EXHAUSTED (the gRPC library's own answer), a call the loaded model cannot serve FAILED_PRECONDITION
(TEI: "model is not a classifier model"). A client's deadline that passes is DEADLINE_EXCEEDED, a client that
cancels CANCELLED. Anything else raised while answering is a bug of ours: INTERNAL, with the details in the log
only. No client input reaches INTERNAL (tests/service/frontend/tei_grpc/test_hostile.py).
"""

from __future__ import annotations

import logging

import grpc

from service.errors import ServiceError

log = logging.getLogger("service")

CODES = {
    "validation": grpc.StatusCode.INVALID_ARGUMENT,
    "empty": grpc.StatusCode.INVALID_ARGUMENT,
    "unsupported": grpc.StatusCode.FAILED_PRECONDITION,
    "internal": grpc.StatusCode.FAILED_PRECONDITION,
    "unauthorized": grpc.StatusCode.UNAUTHENTICATED,
    "payload_too_large": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "overloaded": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "unavailable": grpc.StatusCode.UNAVAILABLE,
    "request_timeout": grpc.StatusCode.DEADLINE_EXCEEDED,
    "not_found": grpc.StatusCode.NOT_FOUND,
    "method_not_allowed": grpc.StatusCode.UNIMPLEMENTED,
    "unsupported_media_type": grpc.StatusCode.INVALID_ARGUMENT,
}
# Codes that say the server, not the request, failed: a trace's span is marked an error for these.
SERVER_FAULTS = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.UNAVAILABLE,
                           grpc.StatusCode.DATA_LOSS, grpc.StatusCode.DEADLINE_EXCEEDED})


class CallError(Exception):
    """A gRPC status to end a call with (raised below the handlers, answered by `status_of`)."""

    def __init__(self, code: grpc.StatusCode, message: str, kind: str):
        super().__init__(message)
        self.code, self.message, self.kind = code, message, kind


def status_of(exc: BaseException, route: str) -> tuple[grpc.StatusCode, str, str]:
    """(code, message, error kind for the metrics) of an exception raised while answering a call of `route`."""
    if isinstance(exc, CallError):
        return exc.code, exc.message, exc.kind
    if isinstance(exc, ServiceError):
        return CODES[exc.kind], exc.message, exc.kind
    log.error("internal error on %s", route, exc_info=exc)
    return grpc.StatusCode.INTERNAL, "internal error; the server log has the details", "internal"


def invalid(message: str) -> CallError:
    return CallError(grpc.StatusCode.INVALID_ARGUMENT, message, "validation")
