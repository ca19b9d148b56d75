"""What keeps a page on another site from using a server on this machine through its visitor's
browser (``BrowserGuard``): a browser sends a cross-site ``POST`` without asking first (no CORS
preflight) only with a form's Content-Type, so those are refused; and a page that rebinds its own
host name to 127.0.0.1 (DNS rebinding) reaches a loopback server with its own name as the Host,
so a server bound to loopback answers only requests for a loopback name, as Jupyter's does."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from typing import Any

from search.server.errors import error_answer

# The Content-Types a browser sends cross-site with no preflight (the Fetch standard's safelist)
FORM_TYPES = frozenset({"text/plain", "application/x-www-form-urlencoded", "multipart/form-data"})
NOT_JSON = "send the body as JSON with 'Content-Type: application/json'"
NOT_LOCAL = "this server is bound to loopback: it answers requests for localhost, 127.0.0.1 or [::1] only"


def bound_to_loopback(listening: socket.socket) -> bool:
    """Whether ``listening`` is bound to a loopback address (only this machine can connect)."""
    return ipaddress.ip_address(listening.getsockname()[0]).is_loopback


def loopback_host(host: str) -> bool:
    """Whether a Host header (a name or address, with any port) names this machine's loopback."""
    name = host.rpartition("]")[0][1:] if host.startswith("[") else host.partition(":")[0]
    if name.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def refusal(scope: dict, loopback: bool) -> tuple[int, str] | None:
    """The status and reason a request is refused with, or None to let it through."""
    headers = dict(scope["headers"])  # a repeated header: its last value, as Starlette's
    host = headers.get(b"host")
    if loopback and host is not None and not loopback_host(host.decode("latin-1")):
        return 421, NOT_LOCAL
    kind = headers.get(b"content-type", b"").decode("latin-1").partition(";")[0].strip().lower()
    if scope["method"] == "POST" and kind in FORM_TYPES:
        return 415, f"Content-Type {kind} is not taken: {NOT_JSON}"
    return None


class BrowserGuard:
    """ASGI middleware: ``refusal``'s requests are answered with their error, the rest pass on;
    ``loopback``: the server is bound to loopback, so the Host must name it."""

    def __init__(self, app: Any, loopback: bool):
        self.app, self.loopback = app, loopback

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        refused = refusal(scope, self.loopback) if scope["type"] == "http" else None
        if refused is None:
            return await self.app(scope, receive, send)
        await error_answer(scope["path"], *refused)(scope, receive, send)
