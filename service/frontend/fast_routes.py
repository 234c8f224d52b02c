"""The computing routes (every POST of the API) answered without FastAPI's per-request machinery.

FastAPI spends more CPU per request than everything else a front end does for a one-sentence /embed
(route matching over every route, dependency solving, body parsing in Python; measured with cProfile
on the in-process app: over half of the front end's time), and on a GPU host that CPU is what bounds
the requests per second. This middleware reads the same table FastAPI built (the same endpoint
functions, body models, dependencies and error answers) and calls the endpoint directly: a dict
lookup for the route, `service.frontend.body` and pydantic-core for the body, the dependencies (all of the form
`async def dep(request)`) awaited in order. FastAPI still documents every route (/docs, /openapi.json)
and serves everything else (pages, GET routes, 404s and 405s).

`tests/service/frontend/test_fast_routes.py` checks that both paths answer every request alike.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Annotated, Any, get_args, get_origin, get_type_hints

from fastapi import FastAPI
from fastapi.params import Depends
from fastapi.routing import APIRoute
from pydantic import TypeAdapter
from starlette.requests import Request

from service.frontend.body import request_json
from service.frontend.disconnects import HTTP_CYCLE, can_sweep
from service.frontend.http_errors import answer_exception
from service.frontend.model_prefix import split_model_path


@dataclass
class _Endpoint:
    call: Any  # the route's async function
    checks: tuple  # route-level dependencies: awaited first, their results unused (the API key)
    arguments: tuple  # (name, how): how is "request", "body" or an async dependency of the request
    body: TypeAdapter | None

    async def __call__(self, request: Request):
        for check in self.checks:
            await check(request)
        values = {}
        for name, how in self.arguments:
            if how == "request":
                values[name] = request
            elif how == "body":
                values[name] = self.body.validate_python(await request_json(request), from_attributes=True)
            else:
                values[name] = await how(request)
        return await self.call(**values)


def _endpoint(route: APIRoute) -> _Endpoint | None:
    """How to call `route` directly, or None when it uses something this does not do (FastAPI answers it)."""
    hints = get_type_hints(route.endpoint, include_extras=True)
    arguments, body = [], None
    for name, parameter in inspect.signature(route.endpoint).parameters.items():
        hint = hints.get(name)
        depends = [m for m in get_args(hint)[1:] if isinstance(m, Depends)] if get_origin(hint) is Annotated else []
        if hint is Request:
            arguments.append((name, "request"))
        elif depends and inspect.iscoroutinefunction(depends[0].dependency):
            arguments.append((name, depends[0].dependency))
        elif body is None and not depends and parameter.kind is parameter.POSITIONAL_OR_KEYWORD:
            arguments.append((name, "body"))
            body = TypeAdapter(hint)
        else:
            return None
    checks = tuple(d.dependency for d in route.dependencies)
    if not all(inspect.iscoroutinefunction(check) for check in checks):
        return None
    return _Endpoint(route.endpoint, checks, tuple(arguments), body)


class FastRoutes:
    def __init__(self, app, routes: list, on_error=None):
        """`routes`: the API routers' routes (paths with their routers' prefixes, dependencies included)."""
        self.app = app
        self.on_error = on_error
        self.table: dict[str, _Endpoint] = {}
        for route in routes:
            if isinstance(route, APIRoute) and route.methods == {"POST"} and "{" not in route.path:
                endpoint = _endpoint(route)
                if endpoint is not None:
                    self.table[route.path] = endpoint

    async def __call__(self, scope, receive, send):
        endpoint = self.table.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if endpoint is None:
            return await self.app(scope, receive, send)
        request = Request(scope, receive)
        try:
            response = await endpoint(request)
        except Exception as exc:  # noqa: BLE001 - answered exactly as FastAPI's handlers answer it
            response = answer_exception(request, exc, self.on_error)
        await response(scope, receive, send)


class DirectEntry:
    """The app as uvicorn serves it: a POST to a computing route enters the service's own middleware
    (metrics, admission, body limit, then `FastRoutes`) directly, past the layers FastAPI and Starlette wrap
    around every request (a telemetry check that reads the environment, an error catcher, a body limit of
    their own): 13% of the event loop's time on one-sentence /embed requests (py-spy --gil). Everything else
    (pages, GET routes, unknown paths, lifespan) goes to the app itself."""

    def __init__(self, app: FastAPI):
        self.app = app
        self.chain = app
        self.paths: frozenset[str] = frozenset()
        for cls, args, kwargs in reversed(app.user_middleware):  # listed outermost first
            self.chain = cls(self.chain, *args, **kwargs)  # the same objects (admission count, metrics) shared
            if cls is FastRoutes:
                self.paths = frozenset(self.chain.table)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST" and self._computing(scope["path"]):
            scope["app"] = self.app  # what Starlette sets: the routes' dependencies read the app's state
            cycle = can_sweep(receive)
            if cycle is not None:  # the middleware wraps `receive`: the routes find the request object here
                scope[HTTP_CYCLE] = cycle
            return await self.chain(scope, receive, send)
        return await self.app(scope, receive, send)

    def _computing(self, path: str) -> bool:
        """A computing route, for the default model or under /models/{name} (ModelPrefix, in the chain, strips it)."""
        split = split_model_path(path)
        return (split[1] if split is not None else path) in self.paths
