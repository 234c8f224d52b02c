"""`create_http_app(runtime) -> FastAPI`: routes, the error mapping, the guards, and the runtime's lifespan.

The runtime's engine link decides where batches run; `service.app.create_app` (one process) and
`service.frontend.worker` (a front-end process of several) build it.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI

from service.frontend.api_key import ApiKey
from service.frontend.fast_routes import FastRoutes
from service.frontend.admission import Admission, LocalRequestCount
from service.frontend.guards import BodyLimit, CloseWhenDraining, RequestMetrics
from service.frontend.http_errors import install_error_handlers
from service.frontend.model_prefix import MODEL_SCOPE, ModelPrefix
from service.frontend.pages import mount_assets, pages, playground_page
from service.frontend.request_context import RequestContext
from service.frontend.routes import api, public
from service.frontend.routes_classify import classify
from service.frontend.routes_cohere import cohere
from service.frontend.routes_colbert import colbert
from service.frontend.routes_openai import openai, openai_alias
from service.frontend.routes_root import root
from service.frontend.routes_tei import tei
from service.frontend.routes_tokens import tokens
from service.frontend.runtime import Runtime

log = logging.getLogger("service")

DESCRIPTION = """Contextual token embeddings, masked-token fill-in and next-sentence scores from a BERT checkpoint,
behind dynamic batching; OpenAI- and text-embeddings-inference-compatible embedding routes for existing clients.
Errors on our routes have the body `{"error": "...", "error_type": "..."}`; the compatible routes answer errors in
their API's own shape. A playground for people is at `/`."""


def create_http_app(runtime: Runtime, admission=None, fast_routes: bool = True) -> FastAPI:
    """The HTTP side of the service over `runtime`; `admission` counts the requests in flight (default: this
    process's own count; `service.frontend.admission.SharedRequestCount` counts those of every front end).
    `fast_routes=False` leaves the computing routes to FastAPI too (tests compare the two)."""
    settings = runtime.settings
    requests = admission or LocalRequestCount(len(runtime.models))  # one admission count for HTTP and gRPC
    grpc_front_end = None
    if settings.grpc_port is not None:  # TEI's gRPC API beside HTTP, over the same runtime (docs/grpc.md)
        from service.frontend.tei_grpc.server import GrpcFrontEnd

        grpc_front_end = GrpcFrontEnd(runtime, requests, reuse_port=settings.workers != 0)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # Load in the background: the server answers /health with 503 until the model is warm.
        async def load():
            try:
                await runtime.start()
            except Exception as exc:  # noqa: BLE001 - reported, and the process stops (service.frontend.serve)
                runtime.lifecycle.failed(str(exc))
                log.error("cannot serve: %s", exc)
                if app.state.on_load_failure is not None:
                    app.state.on_load_failure(exc)
                return
            if app.state.on_loaded is not None:
                app.state.on_loaded()

        app.state.loading = asyncio.create_task(load())
        # Take connections once this process knows as much as the engine: at once while it loads (/health
        # says so), only when ready if it is ready (a front end started after the others, or restarted).
        engine_loading = asyncio.create_task(runtime.link.loading())
        await asyncio.wait([app.state.loading, engine_loading], return_when=asyncio.FIRST_COMPLETED)
        engine_loading.cancel()
        if grpc_front_end is not None:
            await grpc_front_end.start()
        try:
            yield
        finally:
            runtime.lifecycle.drain()
            if grpc_front_end is not None:
                await grpc_front_end.stop()
            if not app.state.loading.done():
                await app.state.loading
            await runtime.shutdown()
            log.info("shutdown: answered %d of %d accepted requests", runtime.requests.answered,
                     runtime.requests.accepted)

    app = FastAPI(title="BERT service", version="0.1.0", description=DESCRIPTION, lifespan=lifespan,
                  docs_url=None, redoc_url=None)  # served by service.frontend.pages from local assets
    app.state.runtime = runtime
    app.state.on_load_failure = None
    app.state.on_loaded = None  # called once loading succeeded (service.frontend.serve: the garbage collector)
    routers = (public, api, openai, openai_alias, tei, classify, tokens, colbert, cohere, root)
    for router in routers:
        app.include_router(router)

    # The route table, read off the routers: what computes (POST), and the metric labels.
    routes = [route for router in routers for route in router.routes]
    api_routes = frozenset(r.path for r in routes if "POST" in r.methods)
    labels = frozenset(r.path for r in routes)

    def route_label(path: str) -> str:
        """Metrics label: the route, or "other" (unknown paths must not create unbounded label values)."""
        return path if path in labels else "other"

    app.include_router(pages)
    app.include_router(playground_page)
    mount_assets(app)

    def count_failure(kind: str, request) -> None:
        runtime.metrics.failures.labels(route_label(request.url.path), kind, request.scope.get(MODEL_SCOPE, "")).inc()

    install_error_handlers(app, on_error=count_failure)
    metrics = runtime.metrics
    if fast_routes:
        app.add_middleware(FastRoutes, routes=routes, on_error=count_failure)
    # Listed innermost first. Admission sits inside BodyLimit: a request counts once its body is in.
    app.add_middleware(Admission, limit=settings.max_concurrent_requests, api_routes=api_routes, metrics=metrics,
                       route_label=route_label, requests=requests, models=list(runtime.models))
    app.add_middleware(BodyLimit, max_body_bytes=settings.max_body_bytes, api_routes=api_routes, metrics=metrics,
                       route_label=route_label, idle_timeout_s=settings.body_idle_timeout_s,
                       total_timeout_s=settings.body_timeout_s)
    # Outside admission and the body checks: without the key, 401 and nothing else (service.frontend.api_key).
    keyed = {(method, r.path) for router in routers if router is not public
             for r in router.routes for method in r.methods}
    if settings.metrics_require_key:
        keyed.add(("GET", "/metrics"))
    app.add_middleware(ApiKey, key=settings.api_key, keyed=frozenset(keyed),
                       on_refused=lambda path: metrics.failures.labels(route_label(path), "unauthorized", "").inc())
    app.add_middleware(CloseWhenDraining, lifecycle=runtime.lifecycle)
    app.add_middleware(RequestMetrics, metrics=metrics, counts=runtime.requests, route_label=route_label)
    # /models/{name}/... is the route without the prefix, for that model, to everything above.
    app.add_middleware(ModelPrefix, runtime=runtime, api_routes=api_routes)
    # Outermost: every answer, refusals included, carries its request id (and, when kept, its trace and log line).
    app.add_middleware(RequestContext, route_label=route_label, tracing=runtime.tracing,
                       keep_records=settings.log_format == "json", log_requests=settings.log_requests,
                       default_model=lambda: runtime.model_name)
    return app
