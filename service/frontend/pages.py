"""Pages for people: the API documentation (Swagger UI at /docs, ReDoc at /redoc) served from assets
installed with the package, so it renders on a machine without internet, and the playground at /.

Nothing here loads from a CDN: the Swagger UI and ReDoc bundles come from the `fastapi-offline` wheel,
the playground is three small static files of this package, and ReDoc is told not to fetch Google Fonts.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.responses import FileResponse, HTMLResponse
from starlette.staticfiles import StaticFiles

DOCS_ASSETS = Path(str(files("fastapi_offline") / "static"))
PLAYGROUND = Path(__file__).with_name("playground")

pages = APIRouter(include_in_schema=False)


@pages.get("/docs")
async def swagger() -> HTMLResponse:
    return get_swagger_ui_html(openapi_url="/openapi.json", title="BERT service - API",
                               swagger_js_url="/assets/docs/swagger-ui-bundle.js",
                               swagger_css_url="/assets/docs/swagger-ui.css",
                               swagger_favicon_url="/assets/docs/favicon.png")


@pages.get("/redoc")
async def redoc() -> HTMLResponse:
    return get_redoc_html(openapi_url="/openapi.json", title="BERT service - API",
                          redoc_js_url="/assets/docs/redoc.standalone.js", redoc_favicon_url="/assets/docs/favicon.png",
                          with_google_fonts=False)


# In the OpenAPI document, since POST / is an API route: GET on that path is this page, not an unknown method.
playground_page = APIRouter(tags=["Pages"])


@playground_page.get("/", response_class=HTMLResponse, summary="The playground (an HTML page for people)")
async def playground() -> FileResponse:
    """Fill-mask, next-sentence scores and similarity (rank or classify for a cross-encoder or classifier)."""
    return FileResponse(PLAYGROUND / "index.html", media_type="text/html")


def mount_assets(app: FastAPI) -> None:
    app.mount("/assets/docs", StaticFiles(directory=DOCS_ASSETS), name="docs-assets")
    app.mount("/assets/playground", StaticFiles(directory=PLAYGROUND), name="playground-assets")
