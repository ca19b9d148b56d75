"""Who a connection counts for under the per-client cap of ``GuardedH11``: an IP address, an IPv6
host by its /64, an IPv4-mapped address as its IPv4 one, and a proxy named by
``--forwarded-allow-ips`` as no one (it speaks for many clients). Driven in memory, one protocol
per connection as uvicorn makes them; the real server over sockets: ``test_server_limits.py``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("uvicorn")

from uvicorn.config import Config  # noqa: E402
from uvicorn.server import ServerState  # noqa: E402

from search.server.connections import GuardedH11, client_of, proxy_networks  # noqa: E402


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


async def admitted(peers: list[tuple], proxies: str | None = None, share: int = 2) -> list[bool]:
    """Whether each connection, from ``peers`` in order (all kept open), is taken."""

    async def app(scope: dict, receive: Any, send: Any) -> None:
        raise AssertionError("no request is sent")

    guarded = type(
        "Guarded", (GuardedH11,), {"max_client_connections": share, "proxies": proxy_networks(proxies)}
    )
    config, state = Config(app), ServerState()
    taken = []
    for peer in peers:
        transport = Transport(peer)
        guarded(config, state, {}).connection_made(transport)  # type: ignore[arg-type]
        taken.append(not transport.closed)
        assert transport.closed == transport.sent.startswith(b"HTTP/1.1 503")
    for protocol in list(state.connections):
        protocol._disarm()
    return taken


def test_one_client_is_one_address_or_one_ipv6_64():
    v4, other = ("10.0.0.1", 5000), ("10.0.0.2", 5000)
    assert asyncio.run(admitted([v4, v4, v4, other, other])) == [True, True, False, True, True]
    same_host = [("2001:db8::1", 1, 0, 0), ("2001:db8::ffff:1", 2, 0, 0), ("2001:db8::9", 3, 0, 0)]
    assert asyncio.run(admitted([*same_host, ("2001:db8:0:1::1", 4, 0, 0)])) == [True, True, False, True]
    assert client_of(("::ffff:10.0.0.1", 1, 0, 0)) == client_of(v4) == "10.0.0.1"
    assert client_of("/run/semsearch.sock") is None and client_of(None) is None  # a Unix socket


def test_a_trusted_proxy_counts_toward_the_total_alone():
    proxy = ("127.0.0.1", 1)
    assert asyncio.run(admitted([proxy] * 5, "127.0.0.1")) == [True] * 5
    assert asyncio.run(admitted([proxy] * 3, "10.0.0.0/8, 127.0.0.0/8")) == [True] * 3
    assert asyncio.run(admitted([proxy] * 3, "*")) == [True] * 3
    assert asyncio.run(admitted([proxy] * 3, "10.0.0.1,/run/proxy.sock")) == [True, True, False]
