"""Request body bytes -> a JSON value: the one parser every route's body goes through, which refuses
anything it cannot read with a 4xx `ServiceError` and raises nothing else.

orjson alone does the work, because it already holds every bound the routes rely on, in compiled code:
- nesting deeper than 1024 levels is refused (no Python recursion, so no RecursionError);
- a number too large for a 64-bit float is refused, and an integer beyond 64 bits reads as a float, which
  no integer field accepts (so no 4,300-digit integer reaches Python's int parser);
- every string is valid UTF-8 and holds no lone surrogate (`"\\ud800"`), so every string field of every
  route is valid Unicode by construction: the tokenizer, the error messages and orjson's own writer all
  take it as it is.
The standard library's `json` accepts all three (and NaN), which is why it is no fallback here, and why
FastAPI's own body reading (`json.loads`) is replaced by this one on the routes FastAPI answers itself.

A body may come compressed (`Content-Encoding: gzip`, `deflate`, or a list of them): it is inflated with
its inflated size bounded by the same body limit (413 beyond, whatever the compression ratio); any other
coding is refused with 415.
"""

from __future__ import annotations

import zlib
from typing import Any

import orjson
from fastapi.routing import APIRoute
from starlette.requests import Request

from service.errors import ServiceError

# Each accepted content coding -> the zlib window bits that read it (None: nothing to undo).
CODINGS = {"identity": None, "gzip": zlib.MAX_WBITS | 16, "x-gzip": zlib.MAX_WBITS | 16, "deflate": zlib.MAX_WBITS}
UTF8_BOM = b"\xef\xbb\xbf"
MAX_DEPTH = 1024  # orjson's own limit on nesting, stated here for the messages and the docs


def parse_body(raw: bytes, content_encoding: str | None = None, max_bytes: int | None = None) -> Any:
    """The body's JSON value, or a ServiceError: 415 for an unknown content coding, 413 for an inflated body
    over `max_bytes`, 422 for anything that is not one complete JSON document (the reason named)."""
    body = decode_content(raw, content_encoding, max_bytes)
    if body.startswith(UTF8_BOM):
        body = body[len(UTF8_BOM):]  # RFC 8259 lets a parser ignore it; Windows tools write files with one
    if not body:
        raise ServiceError("validation", "body: Field required")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ServiceError("validation", _describe(str(exc))) from None


async def request_json(request: Request) -> Any:
    """The request's body through `parse_body`, under the server's body size limit."""
    limit = request.app.state.runtime.settings.max_body_bytes
    return parse_body(await request.body(), request.headers.get("content-encoding"), limit)


class _ParsedRequest(Request):
    """A request whose JSON has been read already: FastAPI takes it from here instead of `json.loads`. FastAPI
    still reads the body's bytes first: they come again from a `receive` that replays them (plain ASGI), then
    the connection's own."""

    def __init__(self, request: Request, raw: bytes, value: Any):
        super().__init__(request.scope, replaying(raw, request.receive))
        self._value = value

    async def json(self) -> Any:
        return self._value


class ParsedBodyRoute(APIRoute):
    """The route class of every API router: a route that FastAPI itself answers (a body-taking route when
    `service.frontend.fast_routes` is off) reads its body through `parse_body` too."""

    def get_route_handler(self):
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def parse_first(request: Request):
            raw = await request.body()
            return await handler(_ParsedRequest(request, raw, await request_json(request)))

        return parse_first


def replaying(raw: bytes, receive):
    """An ASGI `receive` that gives the body `raw` once, then whatever the connection's `receive` gives (after the
    body: disconnect notifications). For whoever has read the body and hands the request on."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await receive()

    return replay


def _describe(reason: str) -> str:
    """orjson's reason, in the words of the bound it names (its messages hold only the reason and a position)."""
    if reason.startswith("depth limit exceeded") or reason.startswith("recursion limit"):
        return f"the request body is nested more than {MAX_DEPTH} levels deep ({reason})"
    if "infinity" in reason:
        return f"the request body holds a number too large to read ({reason})"
    if "surrogate" in reason or "UTF-8" in reason:
        return f"the request body is not valid UTF-8 JSON: strings must be valid Unicode, without lone " \
               f"surrogates such as \\ud800 ({reason})"
    return f"the request body is not valid JSON ({reason})"


def check_content_encoding(content_encoding: str | None) -> list[str]:
    """The codings of a Content-Encoding header, in the order they were applied; 415 for one we cannot undo."""
    codings = [c.strip().lower() for c in (content_encoding or "").split(",") if c.strip()]
    unknown = [c for c in codings if c not in CODINGS]
    if unknown:
        raise ServiceError("unsupported_media_type", f"content-encoding {unknown[0]!r} is not supported; send the "
                                                     "body as is, or compressed with gzip or deflate")
    return codings


def decode_content(raw: bytes, content_encoding: str | None, max_bytes: int | None) -> bytes:
    """The body with its content codings undone, last applied first; never more than `max_bytes` inflated."""
    body = raw
    for coding in reversed(check_content_encoding(content_encoding)):
        if CODINGS[coding] is not None:
            body = _inflate(body, coding, max_bytes)
    return body


def _inflate(data: bytes, coding: str, max_bytes: int | None) -> bytes:
    limit = max_bytes if max_bytes is not None else 1 << 62
    bits = CODINGS[coding]
    if coding == "deflate" and data[:1] and (data[0] & 0x0F) != 8:
        bits = -zlib.MAX_WBITS  # raw deflate without the zlib header: what some clients send as "deflate"
    out, rest = [], data
    try:
        while rest:  # gzip allows several members one after the other
            inflater = zlib.decompressobj(bits)
            chunk = inflater.decompress(rest, limit - sum(map(len, out)) + 1)
            out.append(chunk)
            if sum(map(len, out)) > limit or inflater.unconsumed_tail:
                raise ServiceError("payload_too_large", f"the request body inflates ({coding}) to more than "
                                                        f"{limit} bytes, the body size limit")
            if not inflater.eof:
                raise ServiceError("validation", f"the request body is not a complete {coding} stream")
            rest = inflater.unused_data
            if rest and bits != CODINGS["gzip"]:
                raise ServiceError("validation", f"the request body has data after its {coding} stream")
    except zlib.error as exc:
        raise ServiceError("validation", f"the request body is not valid {coding} data ({exc})") from None
    return b"".join(out)
