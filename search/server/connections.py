"""What guards the server's connections and bodies: the body limit (``BodyLimit``), the request
deadline, head limit and connection caps of ``Guarded`` on uvicorn's HTTP/1.1 protocols
(``llhttp.GuardedHttpTools`` where ``httptools`` is installed, else ``GuardedH11``: ``protocol``), and
``while_connected``, which cancels a request's work when its client hangs up."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import h11
from fastapi import Request
from uvicorn.protocols.http.h11_impl import H11Protocol

from search.server.errors import error_answer, error_body

MAX_BODY = 1 << 20  # bytes in a request body, counted as they arrive
# Connections (``serve``): a client has REQUEST_TIMEOUT s from connecting or from its previous
# answer to send a whole request (a 1 MiB body at 100 kB/s fits), an idle keep-alive connection is
# closed after KEEP_ALIVE s, and past MAX_CONNECTIONS open at once, or MAX_CLIENT_CONNECTIONS of
# one client's, a new one is refused (503): one client cannot take every slot.
REQUEST_TIMEOUT = 10.0
KEEP_ALIVE = 5.0
MAX_CONNECTIONS = 256
MAX_CLIENT_CONNECTIONS = 64
MAX_HEAD = 16 * 1024  # bytes of a request's line and headers (h11's own limit; httptools has none)
# The status a connection answered a request with itself (past its deadline, unreadable HTTP, a
# chunked body's framing past its bound), set in the request's scope for the access log.
ANSWERED = "semsearch.answered"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

T = TypeVar("T")


class BodyTooLarge(Exception):
    """A request body over the server's limit."""


async def read_body(scope: dict, receive: Callable, limit: int = MAX_BODY) -> bytes | None:
    """The request's body, whole, or None if its client left first; ``BodyTooLarge`` past
    ``limit`` bytes, told by its content-length or counted as it arrives (a chunked body has no
    content-length to trust), so no more than ``limit`` bytes of it are ever held."""
    too_large = BodyTooLarge(f"request body over {limit} bytes")
    for name, value in scope["headers"]:
        if name == b"content-length" and (not value.isdigit() or int(value) > limit):
            raise too_large
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > limit:
            raise too_large
        more = message.get("more_body", False)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class BodyLimit:
    """ASGI middleware: refuses a body over ``limit`` bytes with 413 (``read_body``); the app
    gets the body whole."""

    def __init__(self, app: Any, limit: int = MAX_BODY):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        try:
            body = await read_body(scope, receive, self.limit)
        except BodyTooLarge as exc:
            return await error_answer(scope["path"], 413, str(exc))(scope, None, send)
        if body is None:
            return None
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: the disconnect, whenever it comes
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)


def _address(peer: Any) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address of a peer name (an IPv4-mapped IPv6 one as IPv4); None for a Unix socket."""
    try:
        address = ipaddress.ip_address(peer[0]) if isinstance(peer, tuple) and peer else None
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def client_of(peer: Any) -> str | None:
    """Whose a connection from ``peer`` (its peer name) is, for the per-client cap: its IP address,
    an IPv6 one by its /64 network (what one host is given); None for a Unix socket."""
    address = _address(peer)
    if isinstance(address, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((int(address) >> 64 << 64, 64)))
    return None if address is None else str(address)


def proxy_networks(allowed: str | None) -> tuple[Network, ...]:
    """The networks ``--forwarded-allow-ips`` names (uvicorn's list: addresses, networks or ``*``);
    an item that is neither (a Unix socket's path) names none."""
    networks: list[Network] = []
    for item in (allowed or "").split(","):
        if item.strip() == "*":
            return (ipaddress.IPv4Network("0.0.0.0/0"), ipaddress.IPv6Network("::/0"))
        with contextlib.suppress(ValueError):
            networks.append(ipaddress.ip_network(item.strip(), strict=False))
    return tuple(networks)


class Guarded:
    """The bounds uvicorn's HTTP/1.1 protocols lack, mixed into each: a connection past
    ``max_connections``, or past ``max_client_connections`` of its client's (``client_of``; a proxy
    in ``proxies`` speaks for many clients and counts toward the total alone), is answered 503 and
    closed before anything is read, and a client has ``request_timeout`` seconds from connecting
    (or from its previous answer) to send a whole request, head and body: past that the connection
    is closed, with a 408 if a request was begun. (uvicorn's keep-alive timeout starts only after a
    first answer and stops at the first byte of the next request, so an idle or slowloris
    connection was held forever.) HTTP that cannot be read is a 400 in the one error shape."""

    request_timeout = REQUEST_TIMEOUT
    max_connections = MAX_CONNECTIONS
    max_client_connections = MAX_CLIENT_CONNECTIONS
    proxies: tuple[Network, ...] = ()
    connections: set
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    cycle: Any
    scope: Any

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        self.deadline: asyncio.TimerHandle | None = None
        self.refused = False
        self.held_for: str | None = None  # the client this connection counts for; None: no one's

    def connection_made(self, transport: asyncio.Transport) -> None:
        peer = transport.get_extra_info("peername")
        address = _address(peer)
        proxy = address is not None and any(address in network for network in self.proxies)
        client = None if proxy else client_of(peer)
        if len(self.connections) >= self.max_connections:
            self._refuse(transport, f"too many connections: at most {self.max_connections} at once")
        elif client is not None and self._held_by(client) >= self.max_client_connections:
            limit = self.max_client_connections
            self._refuse(transport, f"too many connections from one client: at most {limit} at once")
        else:
            self.held_for = client
            super().connection_made(transport)  # type: ignore[misc]
            self._rearm()

    def _held_by(self, client: str) -> int:
        """The open connections of ``client`` (one pass over at most ``max_connections``)."""
        return sum(1 for other in self.connections if getattr(other, "held_for", None) == client)

    def _refuse(self, transport: asyncio.Transport, message: str) -> None:
        self.refused = True
        transport.write(raw_error(503, message))
        transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.refused:
            return
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # type: ignore[misc]
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._disarm()
        self._follow()

    def send_400_response(self, msg: str) -> None:
        """HTTP that cannot be read: the one error shape too."""
        self.answer(400, msg)

    def answer(self, status: int, message: str) -> None:
        """Answer the request being received with an error and close the connection; its status
        goes in the request's scope (``ANSWERED``) once its head was read, for the access log."""
        path = self.begun()[1]
        if path is not None:
            self.scope[ANSWERED] = status
        self.transport.write(raw_error(status, message, path or ""))
        self.transport.close()

    def receiving(self) -> bool:
        """Whether a request is awaited or being received (not being answered)."""
        raise NotImplementedError

    def begun(self) -> tuple[bool, str | None]:
        """Whether a request's first byte came, and its path once its head was read."""
        raise NotImplementedError

    def _follow(self) -> None:
        """The deadline runs while a request is being received (or awaited), not while answered."""
        if self.transport.is_closing() or not self.receiving():
            self._disarm()
        elif self.deadline is None:
            self._rearm()

    def _rearm(self) -> None:
        self._disarm()
        self.deadline = self.loop.call_later(self.request_timeout, self._expire)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _expire(self) -> None:
        self.deadline = None
        if self.transport.is_closing():
            return
        if self.begun()[0] and not (self.cycle is not None and self.cycle.response_started):
            self.answer(408, f"request not received within {self.request_timeout:g} s")
        self.transport.close()


class GuardedH11(Guarded, H11Protocol):
    """``Guarded`` on uvicorn's h11 protocol (pure Python; h11 bounds the head itself)."""

    def receiving(self) -> bool:
        return self.conn.their_state in (h11.IDLE, h11.SEND_BODY)

    def begun(self) -> tuple[bool, str | None]:
        head_read = self.conn.their_state is h11.SEND_BODY
        return head_read or bool(self.conn.trailing_data[0]), self.scope["path"] if head_read else None


def raw_error(status: int, message: str, path: str = "") -> bytes:
    """A whole HTTP/1.1 error answer in the one shape (``path``'s, when its head was read), for a
    connection about to be closed."""
    body = json.dumps(error_body(path, status, message)).encode()
    reasons = {400: "Bad Request", 408: "Request Timeout", 413: "Content Too Large"}
    reason = {**reasons, 431: "Request Header Fields Too Large", 503: "Service Unavailable"}[status]
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class ClientGone(Exception):
    """The client hung up before its answer was ready."""


async def _disconnected(receive: Callable[[], Awaitable[dict]]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def while_connected(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result, or ClientGone as soon as the client disconnects: the work is then
    cancelled, which drops its texts from the batcher's queue."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
    if not task.done() or task.cancelled():  # cancelled, not yet unwound: it ends on its own
        raise ClientGone
    return task.result()
