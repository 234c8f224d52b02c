"""The API key, checked once, in front of everything else a request could learn from (`--api-key`).

An ASGI middleware outside admission and the body checks: a request without the key gets 401 before
its body is read, before its size (413), content type or coding (415) or fields (422) are looked at,
and without taking an admission slot. Which routes need the key is decided by `create_http_app`:
every API route (the computing POSTs, /info, /v1/models), and /metrics when `metrics_require_key`.
/health and /live stay open for orchestrators; so do the pages for people (/docs, /redoc,
/openapi.json, the playground and their assets): a browser cannot send a Bearer header when it
opens a page, they compute nothing and show only the API's shape, and the playground sends the key
its user types with every call it makes.
"""

from __future__ import annotations

import hmac

from service.frontend.http_errors import error_response

MESSAGE = "missing or wrong API key; send 'Authorization: Bearer <key>'"


def key_matches(authorization: str | bytes, key: str) -> bool:
    """Whether an Authorization header carries `Bearer <key>` (compared in constant time)."""
    header = authorization.decode("latin-1") if isinstance(authorization, bytes) else authorization
    scheme, _, supplied = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(supplied.strip().encode("latin-1"), key.encode())


class ApiKey:
    def __init__(self, app, key: str | None, keyed: frozenset[tuple[str, str]], on_refused=None):
        """`keyed`: the (method, path) pairs that need the key; `on_refused(path)` counts a refusal."""
        self.app = app
        self.key = key
        self.keyed = keyed
        self.on_refused = on_refused

    async def __call__(self, scope, receive, send):
        if self.key is None or scope["type"] != "http" or (scope["method"], scope["path"]) not in self.keyed:
            return await self.app(scope, receive, send)
        authorization = next((value for name, value in scope["headers"] if name == b"authorization"), b"")
        if key_matches(authorization, self.key):
            return await self.app(scope, receive, send)
        if self.on_refused is not None:
            self.on_refused(scope["path"])
        return await error_response("unauthorized", MESSAGE, scope["path"])(scope, receive, send)
