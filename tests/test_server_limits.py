"""The real `semsearch serve` against connections that hold it without asking anything: idle
ones, slowloris heads, trickled bodies (each closed past its deadline), more connections than
its limit (refused at once with a 503 in the error shape), and one client holding more than its
share (refused past it, so another client still gets in). Timeouts are set short here, the
connection counts are small and all on loopback (a second client is a second loopback address)."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from tests.helpers import answering, build_faq, serving  # noqa: E402

pytestmark = pytest.mark.slow
TIMEOUT = 1.0  # --request-timeout and --keep-alive in these tests
LIMIT = 24  # --max-connections


@pytest.fixture(scope="module")
def index(tmp_path_factory, tiny_model):
    return build_faq(tmp_path_factory.mktemp("faq"), tiny_model)


@pytest.fixture(scope="module")
def port(index):
    options = [
        "--request-timeout",
        str(TIMEOUT),
        "--keep-alive",
        str(TIMEOUT),
        "--max-connections",
        str(LIMIT),
    ]
    with serving(index, *options) as port:
        yield port


def closed_by_server(connection: socket.socket, within: float, trickle: bytes = b"") -> tuple[bool, bytes]:
    """Wait up to ``within`` s for the server to close ``connection`` (sending ``trickle`` a byte
    every 0.2 s meanwhile, as a slowloris client does); whether it did, and what it answered."""
    connection.settimeout(0.2)
    answer, deadline, sent = b"", time.monotonic() + within, 0
    while time.monotonic() < deadline:
        try:
            if sent < len(trickle):
                connection.sendall(trickle[sent : sent + 1])
                sent += 1
            data = connection.recv(4096)
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return True, answer
        if not data:
            return True, answer
        answer += data
    return False, answer


def hold(port: int, count: int, first: bytes = b"") -> list[socket.socket]:
    connections = [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]
    for connection in connections:
        if first:
            connection.sendall(first)
    return connections


def answered(port: int, source: str = "127.0.0.1") -> socket.socket:
    """A connection the server has taken and answered once (kept open, as HTTP/1.1 keeps it)."""
    connection = socket.create_connection(("127.0.0.1", port), source_address=(source, 0))
    connection.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    answer = b""
    while not (b"\r\n\r\n" in answer and answer.endswith(b"}")):
        data = connection.recv(4096)
        assert data, f"closed before answering: {answer!r}"
        answer += data
    assert answer.startswith(b"HTTP/1.1 200"), answer
    return connection


def test_idle_slow_head_and_slow_body_connections_are_closed(port):
    kinds = {
        "idle": (hold(port, 6), b""),
        "slowloris head": (hold(port, 6, b"GET /health HTTP/1.1\r\n"), b"X-a: b\r\n" * 100),
        "slow body": (
            hold(
                port,
                6,
                b"POST /search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: 1000\r\n\r\n{",
            ),
            b" " * 100,
        ),
    }
    outcomes: dict[str, list[tuple[bool, bytes]]] = {kind: [] for kind in kinds}

    def watch(kind: str, connection: socket.socket, trickle: bytes) -> None:
        with connection:
            outcomes[kind].append(closed_by_server(connection, 8 * TIMEOUT, trickle))

    threads = [
        threading.Thread(target=watch, args=(kind, c, trickle))
        for kind, (connections, trickle) in kinds.items()
        for c in connections
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for kind, results in outcomes.items():
        assert all(closed for closed, _ in results), f"{kind}: left open"
    for _, answer in outcomes["slowloris head"] + outcomes["slow body"]:
        assert answer.startswith(b"HTTP/1.1 408") and answer.endswith(b"}"), answer
    assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200


def test_a_body_answered_before_it_ends_is_not_read_as_the_next_request(port):
    """A body over the limit is refused (413) from its content-length, before it is sent; what the
    client sends of it after that is neither a second request nor a head past the limit (431):
    the one answer stands, and a client that stalls is closed at its deadline."""
    with socket.create_connection(("127.0.0.1", port)) as connection:
        head = b"POST /search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        connection.sendall(head + b"Content-Length: %d\r\n\r\n" % (4 << 20))
        answer = b""
        while not (b"\r\n\r\n" in answer and answer.endswith(b"}")):
            data = connection.recv(4096)
            assert data, answer
            answer += data
        assert answer.startswith(b"HTTP/1.1 413"), answer
        connection.sendall(b" " * (64 << 10))
        closed, rest = closed_by_server(connection, 8 * TIMEOUT)
    assert closed and rest == b"", rest[:200]


def test_past_the_connection_limit_a_connection_is_refused_with_503(port):
    held = hold(port, LIMIT - 1)
    held.append(answered(port))  # connections are taken in order: once the last is answered, all are
    try:
        with socket.create_connection(("127.0.0.1", port)) as extra:
            closed, answer = closed_by_server(extra, 5)
        assert closed and answer.startswith(b"HTTP/1.1 503"), answer
        body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
        assert list(body) == ["error"] and "connections" in body["error"]
    finally:
        for connection in held:
            connection.close()
    assert answering(port, 10), "the held ones are gone: the server must take new ones again"


def test_http_that_cannot_be_read_is_a_400_in_the_error_shape(port):
    with socket.create_connection(("127.0.0.1", port)) as connection:
        connection.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        closed, answer = closed_by_server(connection, 5)
    assert closed and answer.startswith(b"HTTP/1.1 400"), answer
    assert list(json.loads(answer.split(b"\r\n\r\n", 1)[1])) == ["error"]


def second_client() -> str:
    """A second loopback address to connect from (Linux has all of 127.0.0.0/8)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.2", 0))
        except OSError as exc:
            pytest.skip(f"no second loopback address here: {exc}")
    return "127.0.0.2"


def test_one_client_holding_slow_connections_does_not_keep_another_out(index):
    """One address opens every slot the server has with slow requests (heads never finished) and
    keeps reconnecting: past its share it is refused, and a second address is still answered."""
    other = second_client()
    total = 80  # over the default share of one client (64), the whole --max-connections here
    with serving(index, "--max-connections", str(total), "--request-timeout", "60") as port:
        held = hold(port, total, b"POST /search HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        try:
            extra = hold(port, 5, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")  # it reconnects
            for connection in extra:
                closed, answer = closed_by_server(connection, 5)
                assert closed and answer.startswith(b"HTTP/1.1 503"), answer
                assert "one client" in json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
            held.extend(extra)
            held.append(answered(port, other))  # the second client gets in, and is answered
        finally:
            for connection in held:
                connection.close()
