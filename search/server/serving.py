"""Running the app: the listening socket (bound before the index loads, so a port in use is told
at once) and uvicorn with ``GuardedH11``'s connection bounds."""

from __future__ import annotations

import socket

from fastapi import FastAPI

from indexer.errors import BadInput
from search.server.connections import KEEP_ALIVE, MAX_CONNECTIONS, REQUEST_TIMEOUT, GuardedH11


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

def serve(
    app: FastAPI,
    listening: socket.socket,
    *,
    request_timeout: float = REQUEST_TIMEOUT,
    keep_alive: float = KEEP_ALIVE,
    max_connections: int = MAX_CONNECTIONS,
) -> None:
    """Run ``app`` on the ``listen`` socket until interrupted, with the connection bounds of
    GuardedH11 and uvicorn's keep-alive timeout."""
    import uvicorn

    bounds = {"request_timeout": request_timeout, "max_connections": max_connections}
    config = uvicorn.Config(
        app,
        http=type("Guarded", (GuardedH11,), bounds),
        timeout_keep_alive=keep_alive,
        log_level="warning",
    )
    uvicorn.Server(config).run(sockets=[listening])
