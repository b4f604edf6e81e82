"""The API's documentation pages, served offline: ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc)
load their scripts, stylesheet and icon from kbflow itself, never from a CDN, so they work on a
machine that reaches no other host.

The files are Swagger UI's and ReDoc's release bundles as the fastapi-offline package ships
them (a dependency, pinned in requirements.lock). Only the files named in `ASSETS` are served,
by name: no directory listing, and nothing from the request's path reaches the file system.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import FileResponse, HTMLResponse, Response

from core.errors import NotFound

DOCS_PATH = "/docs"
REDOC_PATH = "/redoc"
ASSET_PATH = "/docs/assets"
ASSET_DIR = Path(fastapi_offline.__file__).parent / "static"
ASSETS = {  # file name: media type
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "redoc.standalone.js": "text/javascript",
    "favicon.png": "image/png",
}
# Swagger UI's default sends the document to validator.swagger.io for a badge; never here.
SWAGGER_PARAMETERS = {"validatorUrl": None}
# ReDoc's bundle always asks cdn.redoc.ly for the logo of its "API docs by Redocly" link (and
# hides it when that fails): its page may load from kbflow only, so the browser never asks.
# ReDoc styles itself with <style> elements and searches in a worker made from a blob.
REDOC_CSP = (
    "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self' data:; worker-src 'self' blob:; frame-ancestors 'none'; base-uri 'none'"
)


def install(app: FastAPI) -> None:
    """Serve ``app``'s documentation pages and their files (``app`` is made with
    ``docs_url=None, redoc_url=None``, which turn off FastAPI's CDN-loading pages)."""
    openapi_url = app.openapi_url or "/openapi.json"
    oauth2_redirect_url = app.swagger_ui_oauth2_redirect_url or f"{DOCS_PATH}/oauth2-redirect"

    @app.get(DOCS_PATH, include_in_schema=False)
    def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=root + openapi_url,
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=root + oauth2_redirect_url,
            swagger_js_url=f"{root}{ASSET_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSET_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSET_PATH}/favicon.png",
            swagger_ui_parameters={**(app.swagger_ui_parameters or {}), **SWAGGER_PARAMETERS},
        )

    @app.get(oauth2_redirect_url, include_in_schema=False)
    def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(REDOC_PATH, include_in_schema=False)
    def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        page = get_redoc_html(
            openapi_url=root + openapi_url,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{ASSET_PATH}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSET_PATH}/favicon.png",
            with_google_fonts=False,  # fonts.googleapis.com otherwise
        )
        page.headers["Content-Security-Policy"] = REDOC_CSP
        return page

    @app.get(ASSET_PATH + "/{name}", include_in_schema=False)
    def asset(name: str) -> Response:
        media_type = ASSETS.get(name)
        if media_type is None:
            raise NotFound(f"no documentation file {name!r}")
        response = FileResponse(ASSET_DIR / name, media_type=media_type)
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Cache-Control"] = "public, max-age=3600"
        return response
