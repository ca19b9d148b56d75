"""Running the app: the listening socket (bound before the index loads, so a port in use is told
at once), uvicorn with ``Guarded``'s connection bounds on its fastest HTTP/1.1 protocol
(``protocol``) and event loop (uvloop where installed), and the access log."""

from __future__ import annotations

import logging
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from uvicorn.protocols.utils import get_client_addr

from indexer.errors import BadInput
from search.server.connections import (
    ANSWERED,
    KEEP_ALIVE,
    MAX_CLIENT_CONNECTIONS,
    MAX_CONNECTIONS,
    REQUEST_TIMEOUT,
    Guarded,
    GuardedH11,
    proxy_networks,
)
from search.server.origins import BrowserGuard, bound_to_loopback

ACCESS = logging.getLogger("semsearch.access")


def protocol() -> type[Guarded]:
    """The guarded protocol ``serve`` runs: httptools' where it is installed, else h11's (here,
    not in ``connections``, which ``llhttp`` builds on)."""
    try:
        from search.server.llhttp import GuardedHttpTools
    except ImportError:  # no httptools (uvicorn imports it with its protocol)
        return GuardedH11
    return GuardedHttpTools


def listen(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound here so that a port in use (or a host that cannot be
    bound) is one line of BadInput, not uvicorn's log line and exit 3 (a strategy conflict's)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say so (else each answer
    # waits ~40 ms for a delayed ACK)
    listening = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind((host, port))
    except OSError as exc:
        listening.close()
        raise BadInput(
            f"cannot listen on {host}:{port}: {exc.strerror or exc} (another server there? choose --port)"
        ) from None
    return listening


def escaped(text: str) -> str:
    """``text`` with every character but printable ASCII, and ``"`` and ``\\``, written as an
    escape (``\\x1b``): what a client sends cannot move a terminal's cursor or forge a log line."""
    return "".join(char if " " <= char <= "~" and char not in '"\\' else _escape(char) for char in text)


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def target(scope: dict) -> str:
    """The request's path and query as the client sent them (``%2f`` stays ``%2f``)."""
    raw = scope.get("raw_path")
    path = scope["root_path"] + scope["path"] if raw is None else raw.decode("latin-1")
    query = scope.get("query_string", b"").decode("latin-1")
    return f"{path}?{query}" if query else path


class AccessLog:
    """ASGI middleware: one line on ``ACCESS`` a request once it is answered, uvicorn's access
    format and the time from its arrival to its last byte sent:
    ``127.0.0.1:50312 - "POST /search HTTP/1.1" 200 4.2 ms`` (the status the connection sent when
    it answered itself, ``ANSWERED``; 499: the client left unanswered). The client (a forwarding
    header's, when trusted), method, target as sent and version are ``escaped``."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = 499

        async def sending(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            if status == 499:
                status = scope.get(ANSWERED, status)
            ACCESS.info(
                '%s - "%s %s HTTP/%s" %d %.1f ms',
                escaped(get_client_addr(scope)),
                escaped(scope["method"]),
                escaped(target(scope)),
                escaped(scope["http_version"]),
                status,
                (time.perf_counter() - start) * 1000,
            )


def _log_to_stderr() -> None:
    """``ACCESS``'s lines, bare, on stderr (uvicorn's own logging stays at warnings)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    ACCESS.handlers[:] = [handler]
    ACCESS.setLevel(logging.INFO)
    ACCESS.propagate = False


def serve(
    app: FastAPI,
    listening: socket.socket,
    *,
    request_timeout: float = REQUEST_TIMEOUT,
    keep_alive: float = KEEP_ALIVE,
    max_connections: int = MAX_CONNECTIONS,
    max_client_connections: int = MAX_CLIENT_CONNECTIONS,
    access_log: bool = True,
    forwarded_allow_ips: str | None = None,
) -> None:
    """Run ``app`` on the ``listen`` socket until interrupted, with the connection bounds of
    ``Guarded`` and uvicorn's keep-alive timeout; ``access_log``: a line a request on stderr.
    ``forwarded_allow_ips``: the proxies (uvicorn's list: addresses, networks, ``*``) whose
    ``X-Forwarded-For``/``-Proto`` are believed; None: no one's (uvicorn would believe 127.0.0.1's).
    A proxy's connections count toward ``max_connections`` alone, not as one client's. What a
    page elsewhere could send through a browser is refused (``BrowserGuard``)."""
    import uvicorn

    if access_log:
        _log_to_stderr()
    bounds = {
        "request_timeout": request_timeout,
        "max_connections": max_connections,
        "max_client_connections": max_client_connections,
        "proxies": proxy_networks(forwarded_allow_ips),
    }
    guarded = BrowserGuard(app, loopback=bound_to_loopback(listening))
    config = uvicorn.Config(
        AccessLog(guarded) if access_log else guarded,
        http=type("Guarded", (protocol(),), bounds),
        loop="auto",  # uvloop where installed
        timeout_keep_alive=keep_alive,
        log_level="warning",
        proxy_headers=forwarded_allow_ips is not None,
        forwarded_allow_ips=forwarded_allow_ips,
    )
    uvicorn.Server(config).run(sockets=[listening])
