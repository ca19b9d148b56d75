"""The search page for people (``search/static``, package data): plain HTML/CSS/JS over the API,
served at ``/`` and ``/static`` with a policy that lets it load nothing from elsewhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles

# The search page (``search/static``, package data) loads nothing from elsewhere and runs no inline
# script: the browser enforces both, so a stored value that slips into markup still cannot run.
PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
STATIC = Path(__file__).parent.parent / "static"


class PageFiles(StaticFiles):
    """The page's files, each with the page's policy: opened directly (``/static/index.html``) the
    page is as confined as at ``/``."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers["Content-Security-Policy"] = PAGE_POLICY
        return response


def add_page(app: FastAPI) -> None:
    """``GET /``, the page, and ``/static``, its files: both under ``PAGE_POLICY``."""

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def page() -> FileResponse:
        """The search page: a person's way to try the index in a browser."""
        return FileResponse(STATIC / "index.html", headers={"Content-Security-Policy": PAGE_POLICY})

    app.mount("/static", PageFiles(packages=[("search", "static")]), name="static")
