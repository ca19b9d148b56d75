"""``BrowserGuard`` in process: which Host names a loopback server answers, and the form
Content-Types a browser could send cross-site without a preflight, refused on every POST route
(the real `semsearch serve` wiring: tests/test_server_framing.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from search.server import create_app  # noqa: E402
from search.server.origins import BrowserGuard, loopback_host  # noqa: E402
from tests.helpers import build_faq  # noqa: E402

LOCAL = [
    "localhost",
    "LOCALHOST:8000",
    "localhost.",
    "127.0.0.1",
    "127.0.0.1:80",
    "127.9.9.9",
    "[::1]",
    "[::1]:8000",
]
OTHERS = [
    "attacker.example",
    "attacker.example:8000",
    "localhost.attacker.example",
    "10.0.0.1",
    "[::2]:80",
    "",
    ":80",
]


def test_loopback_names_and_addresses_are_told_from_others():
    assert [host for host in LOCAL + OTHERS if loopback_host(host)] == LOCAL


@pytest.fixture(scope="module")
def index(tmp_path_factory, tiny_model):
    return build_faq(tmp_path_factory.mktemp("faq"), tiny_model)


@pytest.fixture
def app(index):
    return create_app(index)  # one a test: a TestClient's exit closes its engine


def test_a_loopback_server_answers_only_requests_for_a_loopback_name(app):
    with TestClient(BrowserGuard(app, loopback=True), base_url="http://localhost:8000") as client:
        assert client.get("/health").status_code == 200
        refused = client.get("/health", headers={"host": "attacker.example"})
        assert refused.status_code == 421 and "loopback" in refused.json()["error"]
    with TestClient(BrowserGuard(app, loopback=False), base_url="http://search.example") as client:
        assert client.get("/health").status_code == 200  # bound elsewhere: any name may reach it


@pytest.mark.parametrize(
    "kind", ["text/plain", "Application/X-WWW-Form-Urlencoded", "multipart/form-data; b=1"]
)
def test_a_form_content_type_is_refused_on_every_post_route(app, kind):
    with TestClient(BrowserGuard(app, loopback=False)) as client:
        for path in ("/search", "/v1/embeddings", "/v1/rerank", "/reload"):
            refused = client.post(path, content=b'{"query": "bike"}', headers={"content-type": kind})
            assert refused.status_code == 415, (path, refused.text)
            error = refused.json()["error"]
            assert "Content-Type: application/json" in (
                error["message"] if path == "/v1/embeddings" else error
            )
        json = client.post("/search", json={"query": "bike", "k": 1})
        assert json.status_code == 200 and json.json()["hits"]
