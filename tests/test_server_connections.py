"""Who a connection counts for under the per-client cap of ``Guarded`` (on h11's protocol and on
httptools'): an IP address, an IPv6 host by its /64, an IPv4-mapped address as its IPv4 one, and a
proxy named by ``--forwarded-allow-ips`` as no one (it speaks for many clients); and a request head
past ``MAX_HEAD`` refused on either. Driven in memory, one protocol per connection as uvicorn makes
them; the real server (on the protocol ``serve`` picks) over sockets: ``test_server_limits.py``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("uvicorn")

from uvicorn.config import Config  # noqa: E402
from uvicorn.server import ServerState  # noqa: E402

from search.server.connections import MAX_HEAD, GuardedH11, client_of, proxy_networks  # noqa: E402

PROTOCOLS = ["h11", "httptools"]


def guarded_protocol(name: str) -> type:
    """The guarded protocol on ``name``'s parser (httptools' skipped where it is not installed)."""
    if name == "h11":
        return GuardedH11
    pytest.importorskip("httptools")
    from search.server.llhttp import GuardedHttpTools

    return GuardedHttpTools


class Transport:
    """The few things a protocol asks of its transport, with what it was sent."""

    def __init__(self, peer: tuple) -> None:
        self.peer, self.sent, self.closed = peer, b"", False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": self.peer, "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def write(self, data: bytes) -> None:
        self.sent += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


async def admitted(base: type, peers: list[tuple], proxies: str | None = None, share: int = 2) -> list[bool]:
    """Whether each connection, from ``peers`` in order (all kept open), is taken."""

    async def app(scope: dict, receive: Any, send: Any) -> None:
        raise AssertionError("no request is sent")

    guarded = type("Guarded", (base,), {"max_client_connections": share, "proxies": proxy_networks(proxies)})
    config, state = Config(app), ServerState()
    config.load()
    taken = []
    for peer in peers:
        transport = Transport(peer)
        guarded(config, state, {}).connection_made(transport)  # type: ignore[arg-type]
        taken.append(not transport.closed)
        assert transport.closed == transport.sent.startswith(b"HTTP/1.1 503")
    for protocol in list(state.connections):
        protocol._disarm()
    return taken


@pytest.mark.parametrize("parser", PROTOCOLS)
def test_one_client_is_one_address_or_one_ipv6_64(parser):
    base = guarded_protocol(parser)
    v4, other = ("10.0.0.1", 5000), ("10.0.0.2", 5000)
    assert asyncio.run(admitted(base, [v4, v4, v4, other, other])) == [True, True, False, True, True]
    same_host = [("2001:db8::1", 1, 0, 0), ("2001:db8::ffff:1", 2, 0, 0), ("2001:db8::9", 3, 0, 0)]
    other_host = ("2001:db8:0:1::1", 4, 0, 0)
    assert asyncio.run(admitted(base, [*same_host, other_host])) == [True, True, False, True]
    assert client_of(("::ffff:10.0.0.1", 1, 0, 0)) == client_of(v4) == "10.0.0.1"
    assert client_of("/run/semsearch.sock") is None and client_of(None) is None  # a Unix socket


@pytest.mark.parametrize("parser", PROTOCOLS)
def test_a_trusted_proxy_counts_toward_the_total_alone(parser):
    base = guarded_protocol(parser)
    proxy = ("127.0.0.1", 1)
    assert asyncio.run(admitted(base, [proxy] * 5, "127.0.0.1")) == [True] * 5
    assert asyncio.run(admitted(base, [proxy] * 3, "10.0.0.0/8, 127.0.0.0/8")) == [True] * 3
    assert asyncio.run(admitted(base, [proxy] * 3, "*")) == [True] * 3
    assert asyncio.run(admitted(base, [proxy] * 3, "10.0.0.1,/run/proxy.sock")) == [True, True, False]


async def head_answer(base: type, head: bytes) -> tuple[bytes, bool]:
    """What a guarded connection answers to ``head`` sent in pieces of 1 kB, and whether it closed."""

    async def app(scope: dict, receive: Any, send: Any) -> None:
        raise AssertionError("no request gets this far")

    config = Config(app)
    config.load()
    protocol = base(config, ServerState(), {})
    transport = Transport(("10.0.0.1", 5000))
    protocol.connection_made(transport)
    for at in range(0, len(head), 1024):
        if transport.closed:
            break
        protocol.data_received(head[at : at + 1024])
    protocol._disarm()
    return transport.sent, transport.closed


@pytest.mark.parametrize("parser", PROTOCOLS)
def test_a_request_head_past_the_limit_is_refused_before_it_ends(parser):
    """llhttp bounds no head: without the guard a client could send headers for as long as its
    deadline lasts, all held in memory."""
    filler = b"X-Filler: " + b"a" * 32 + b"\r\n"
    head = b"GET /health HTTP/1.1\r\n" + filler * (2 * MAX_HEAD // len(filler))
    sent, closed = asyncio.run(head_answer(guarded_protocol(parser), head))
    assert closed and sent.startswith((b"HTTP/1.1 431", b"HTTP/1.1 400")), sent[:80]
    assert b'"error"' in sent
