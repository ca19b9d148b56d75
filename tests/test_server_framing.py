"""The real `semsearch serve` against a chunked body's framing sent without end (trailers after the
last chunk, a chunk-size line of endless extensions or leading zeros): each is refused once past a
small bound, not swallowed until the deadline; and its access log says the status each request
was actually answered with (499 only for one left unanswered) and the target as the client sent
it, escaped."""

from __future__ import annotations

import json
import re
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from tests.helpers import answering, build_faq  # noqa: E402

pytestmark = pytest.mark.slow
TIMEOUT = 2.0  # --request-timeout here
FLOOD = 8 << 20  # bytes a flooding test sends at most before it reads the answer
# What a client has sent when its answer comes is no measure of what the server read: loopback's
# socket buffers hold megabytes. Past a bound it answers long before FLOOD (else: 408 at the end).
SOON = FLOOD // 2
JSON = {"content-type": "application/json"}
HEAD = (
    b"POST /search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model) -> Iterator[tuple[int, Path]]:
    """`semsearch serve` on the four-row FAQ: its port and the file its stderr goes to."""
    directory = tmp_path_factory.mktemp("faq")
    index, log = build_faq(directory, tiny_model), directory / "stderr.txt"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = ["serve", str(index), "--port", str(port), "--request-timeout", str(TIMEOUT)]
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "search.cli", *command], stdout=subprocess.DEVNULL, stderr=stderr
        )
        try:
            assert answering(port, 120, process), log.read_text()
            yield port, log
            assert process.poll() is None, "the server died"
        finally:
            process.terminate()
            process.wait(timeout=30)


def flood(port: int, start: bytes, filler: bytes) -> tuple[int, int, str]:
    """Send ``start``, then ``filler`` again and again (up to ``FLOOD`` bytes) until the server
    answers; its status code, how many bytes were sent before it did, and its error."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(start)
        try:
            while sent < FLOOD and not select.select([s], [], [], 0)[0]:
                s.sendall(filler)
                sent += len(filler)
        except (BrokenPipeError, ConnectionResetError):
            pass
        reader = s.makefile("rb")
        status, length = reader.readline(), 0
        while (line := reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            length = int(value) if name.lower() == b"content-length" else length
        error = json.loads(reader.read(length))["error"]  # not to its end: a reset may come after
    return int(status.split()[1]), sent, error


def test_trailers_without_end_are_refused_past_a_bound(served):
    port, _ = served
    status, sent, error = flood(port, HEAD + b'd\r\n{"query":"x"}\r\n0\r\n', b"X-T: " + b"a" * 1000 + b"\r\n")
    assert status in (413, 431) and sent < SOON, (status, sent)
    assert "trailers over 16384 bytes" in error, error
    assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200


ENDLESS_LINES = {"extension": (b"d;", b"a" * 4096), "zeros": (b"", b"0" * 4096)}


@pytest.mark.parametrize("start, filler", ENDLESS_LINES.values(), ids=ENDLESS_LINES.keys())
def test_a_chunk_size_line_without_end_is_refused_past_a_small_bound(served, start, filler):
    port, _ = served
    status, sent, error = flood(port, HEAD + start, filler)
    assert status in (400, 413) and sent < SOON, (status, sent)
    assert "chunk-size line or trailers over 16384 bytes" in error, error  # not the whole body's bound


def answer_of(port: int, request: bytes) -> bytes:
    """The status line the server answers ``request`` (sent whole, then nothing) with."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(request)
        return s.makefile("rb").readline()


def logged(log: Path, request: str, status: int) -> bool:
    """Whether the access log has ``request``'s line with ``status``, within a few seconds."""
    line = re.compile(rf'^127\.0\.0\.1:\d+ - "{re.escape(request)} HTTP/1\.1" {status} \d+\.\d ms$', re.M)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if line.search(log.read_text(encoding="utf-8", errors="replace")):
            return True
        time.sleep(0.1)
    return False


def test_the_log_says_the_status_sent_when_the_connection_answered_it(served):
    """A request answered by the connection, not the app (past its deadline: 408; a chunk size
    that is not hex: 400), is logged with that status, not 499."""
    port, log = served
    timed_out = b"POST /search?late HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\n\r\n{"
    assert answer_of(port, timed_out).split()[1] == b"408"
    assert logged(log, "POST /search?late", 408), log.read_text()
    bad_size = HEAD.replace(b"/search", b"/search?badsize") + b"zz\r\n"
    assert answer_of(port, bad_size).split()[1] == b"400"
    assert logged(log, "POST /search?badsize", 400), log.read_text()


def test_the_log_writes_the_target_as_sent(served):
    port, log = served
    assert httpx.get(f"http://127.0.0.1:{port}/search%2fbatch?q=%41").status_code == 405
    assert logged(log, "GET /search%2fbatch?q=%41", 405), log.read_text()


def test_a_page_elsewhere_cannot_post_or_rebind_to_a_loopback_server(served):
    """What a page on another site can send without a CORS preflight (a form's Content-Type) is
    refused 415, and a server bound to loopback answers only requests for a loopback name (a DNS
    rebinding page's requests name its own host): 421."""
    port, _ = served
    url, query = f"http://127.0.0.1:{port}", b'{"query":"apple pay","k":1}'
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        for path in ("/search", "/reload"):
            refused = httpx.post(url + path, content=query, headers={"content-type": kind})
            assert refused.status_code == 415, (kind, path, refused.text)
            assert "application/json" in refused.json()["error"]
    rebound = httpx.post(url + "/search", content=query, headers={"host": "attacker.example", **JSON})
    assert rebound.status_code == 421 and list(rebound.json()) == ["error"], rebound.text
    assert httpx.get(url + "/health", headers={"host": "attacker.example:80"}).status_code == 421
    for host in ("localhost", f"localhost:{port}", "127.0.0.1", "[::1]", f"[::1]:{port}"):
        assert httpx.post(url + "/search", content=query, headers={"host": host, **JSON}).status_code == 200
