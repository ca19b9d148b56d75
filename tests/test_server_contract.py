"""The documented error contract at its edges, route by route: every error answer is
``{"error": "..."}`` (on ``/v1/embeddings`` and ``/v1/models`` OpenAI's ``{"error": {"message",
"type", "param", "code"}}``, so OpenAI's clients show the reason) with the status the README and the OpenAPI
schema state (400 bad input, 404, 405, 413, 503 for an index that cannot serve), HEAD and the
page's policy, and `serve` on a port already taken."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.routing import APIRoute  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from search.server import create_app  # noqa: E402
from search.server.errors import OPENAI_PATHS  # noqa: E402
from search.server.page import PAGE_POLICY  # noqa: E402
from tests.helpers import assert_clean_failure, build_faq, run  # noqa: E402

JSON = {"content-type": "application/json"}
# A body each POST route accepts, and one request per route that its validation refuses.
GOOD = {
    "/search": {"query": "bike", "k": 1},
    "/search/batch": {"queries": ["bike"], "k": 1},
    "/similar": {"sentence": "bike", "candidates": ["a bike"]},
    "/v1/embeddings": {"input": "bike"},
    "/encode": {"texts": ["bike"]},
    "/reload": None,
}


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_model) -> Path:
    return build_faq(tmp_path_factory.mktemp("faq"), tiny_model)


@pytest.fixture
def index(built, tmp_path) -> Path:
    """A copy of the built index each test may damage."""
    return Path(shutil.copytree(built, tmp_path / "idx"))


def client_of(index: Path) -> TestClient:
    return TestClient(create_app(index, reload_every=0), raise_server_exceptions=False)


def assert_error(response, status: int) -> None:
    assert response.status_code == status, (response.request.url, response.status_code, response.text)
    answer = response.json()
    assert list(answer) == ["error"]
    message = answer["error"]
    if response.request.url.path in OPENAI_PATHS:
        assert set(message) == {"message", "type", "param", "code"}, answer
        assert message["type"] == ("invalid_request_error" if status < 500 else "server_error")
        message = message["message"]
    assert isinstance(message, str) and message and "\n" not in message


def documented(schema: dict, path: str, method: str) -> set[int]:
    return {int(code) for code in schema["paths"][path][method]["responses"] if code.isdigit()}


def test_every_route_answers_errors_in_the_documented_shape(index):
    with client_of(index) as client:
        schema = client.get("/openapi.json").json()
        routes = [r for r in client.app.routes if isinstance(r, APIRoute) and r.include_in_schema]
        assert {r.path for r in routes} == set(schema["paths"])
        for route in routes:
            for method in {"GET", "POST", "PUT", "DELETE"} - route.methods:
                assert_error(client.request(method, route.path), 405)
            if "POST" in route.methods and route.path in GOOD and GOOD[route.path] is not None:
                for body in (b'{"query": "\xff\xfe"}', b"[" * 100_000 + b"]" * 100_000, b"{"):
                    response = client.post(route.path, content=body, headers=JSON)
                    assert_error(response, 400)
                    assert 400 in documented(schema, route.path, "post")
                big = b'{"query": "' + b"x" * (1 << 21) + b'"}'
                assert_error(client.post(route.path, content=big, headers=JSON), 413)
                assert 413 in documented(schema, route.path, "post")
        assert_error(client.get("/duplicates", params={"min_score": "many"}), 400)
        assert 400 in documented(schema, "/duplicates", "get")
        assert_error(client.get("/no/such/route"), 404)
        assert_error(client.get("/static/no-such-file.js"), 404)


def test_the_openapi_schema_states_the_real_answers(index):
    with client_of(index) as client:
        schema = client.get("/openapi.json").json()
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    error = schema["components"]["schemas"]["Error"]
    assert error["required"] == ["error"] and list(error["properties"]) == ["error"]
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            codes = documented(schema, path, method)
            assert 422 not in codes, (path, method)
            shape = "OpenAIError" if path in OPENAI_PATHS else "Error"
            for code in codes - {200}:
                content = operation["responses"][str(code)]["content"]["application/json"]
                assert content["schema"] == {"$ref": f"#/components/schemas/{shape}"}, (path, method, code)
            if path != "/health":
                assert 503 in codes, (path, method)  # every route that reads the index


def test_a_damaged_or_removed_index_is_a_503(index):
    with client_of(index) as client:
        database = next(index.glob("v-*/meta.db"))
        kept = database.read_bytes()
        database.write_bytes(b"not a database" * 1000)
        for response in (
            client.get("/health"),  # it answers ok only while the index can serve
            client.get("/info"),
            client.get("/fields"),
            client.post("/search", json={"query": "bike", "where": "category = 'billing'"}),
            client.post("/search", json={"query": "bike"}),
        ):
            assert_error(response, 503)
        database.write_bytes(kept)
        assert client.get("/info").status_code == 200
        assert client.get("/health").json() == {"status": "ok"}
        shutil.rmtree(index)
        for response in (
            client.get("/info"),
            client.get("/fields"),
            client.get("/duplicates"),
            client.post("/search", json={"query": "bike"}),
            client.post("/reload"),
            client.post("/v1/embeddings", json=GOOD["/v1/embeddings"]),
            client.post("/encode", json=GOOD["/encode"]),
            client.get("/health"),
        ):
            assert_error(response, 503)
        assert client.head("/health").status_code == 503


def test_a_server_fault_is_a_500_in_each_route_s_shape(index, monkeypatch):
    """What the server did not foresee is a 500 that names no more than the error's type, in the
    shape of the route's clients (OpenAI's on /v1/embeddings)."""

    def broken(*args: object) -> None:
        raise RuntimeError("a fault in the server")

    monkeypatch.setattr("search.server.encode.embeddings_answer", broken)
    monkeypatch.setattr("search.read.similar.rank_vectors", broken)
    with client_of(index) as client:
        for path, body in [("/v1/embeddings", GOOD["/v1/embeddings"]), ("/similar", GOOD["/similar"])]:
            response = client.post(path, json=body)
            assert_error(response, 500)
            assert "RuntimeError" in response.text and "a fault" not in response.text


def test_removed_under_a_server_that_has_not_looked_yet(index):
    """Between reload checks the server answers from its snapshot; whatever it can no longer read
    is a 503, never a 500."""
    with TestClient(create_app(index, reload_every=3600), raise_server_exceptions=False) as client:
        assert client.get("/info").status_code == 200
        shutil.rmtree(index)
        for response in (client.get("/info"), client.post("/search", json={"query": "bike"})):
            assert response.status_code in (200, 503), response.text
            if response.status_code != 200:
                assert_error(response, 503)


def test_a_filter_number_past_64_bits_is_an_answer(index):
    with client_of(index) as client:
        response = client.post("/search", json={"query": "bike", "where": "category > 9223372036854775808"})
        assert response.status_code == 200 and response.json()["hits"] == []


def test_head_and_the_page_policy(index):
    with client_of(index) as client:
        for path in ("/", "/health"):
            assert client.head(path).status_code == 200
        for path in ("/", "/static/index.html", "/static/page.js"):
            response = client.get(path)
            assert response.status_code == 200, path
            assert response.headers["content-security-policy"] == PAGE_POLICY, path


@pytest.mark.slow
def test_serve_on_a_port_in_use_is_one_line_and_exit_1(index):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = run("serve", index, "--port", taken.getsockname()[1])
    assert result.returncode == 1
    assert_clean_failure(result, "cannot listen on 127.0.0.1")


def test_connections_on_the_listening_socket_send_without_delay():
    """Answers go out at once (TCP_NODELAY on each accepted connection, which asyncio sets only on a
    socket that names IPPROTO_TCP): else every answer waits ~40 ms for the client's delayed ACK."""
    import asyncio

    from search.server import listen

    async def accepted_nodelay() -> int:
        loop = asyncio.get_running_loop()
        made: asyncio.Future[int] = loop.create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                accepted = transport.get_extra_info("socket")
                made.set_result(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await loop.create_server(Probe, sock=listen("127.0.0.1", 0))
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            return await asyncio.wait_for(made, 10)
        finally:
            writer.close()
            server.close()

    assert asyncio.run(accepted_nodelay()) != 0
