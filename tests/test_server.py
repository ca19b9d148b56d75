"""The HTTP API: answers, 4xx for every bad request, reload after an update, micro-batching, and
the real `semsearch serve` process bound to localhost."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shutil
import subprocess

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from indexer.writing.update import add_to_index, delete_from_index  # noqa: E402
from search.server import create_app  # noqa: E402
from tests.helpers import ROWS, build_faq, leave_hot_journal, serving, unwritable, write_csv  # noqa: E402


@pytest.fixture
def index(tmp_path, tiny_model, built_once):
    return built_once("faq", functools.partial(build_faq, model=tiny_model), tmp_path / "idx")


def test_endpoints_and_bad_requests(index):
    with TestClient(create_app(index)) as client:
        assert client.get("/health").json() == {"status": "ok"}
        top = client.post("/search", json={"query": ROWS[1][1], "k": 2}).json()["hits"][0]
        assert (top["id"], top["fields"]["category"]) == ("a2", "stations")
        filtered = client.post("/search", json={"query": ROWS[1][1], "k": 5, "where": "category = 'billing'"})
        assert [h["fields"]["category"] for h in filtered.json()["hits"]] == ["billing", "billing"]
        batch = client.post("/search/batch", json={"queries": [ROWS[0][1], ROWS[3][1]], "k": 1}).json()
        assert [r["hits"][0]["id"] for r in batch["results"]] == ["a1", "a4"]
        similar = client.post(
            "/similar", json={"sentence": "x y", "candidates": ["x y", "other words"]}
        ).json()
        assert similar["hits"][0]["text"] == "x y"
        info = client.get("/info").json()
        assert info["entries"] == 4 and info["strategy"]["layers"] == [-2]
        assert client.get("/openapi.json").status_code == 200
        bad = [
            ("/search", {"query": "", "k": 1}),
            ("/search", {"query": "   "}),
            ("/search", {"query": "x", "k": 0}),
            ("/search", {"query": "x", "k": 101}),
            ("/search", {"query": "x" * 2001}),
            ("/search", {"query": "x", "where": "category = 'a' OR 1=1"}),
            ("/search", {"k": 3}),
            ("/search/batch", {"queries": []}),
            ("/search/batch", {"queries": ["x"] * 65}),
            ("/search/batch", {"queries": ["ok", ""]}),
            ("/similar", {"sentence": "x", "candidates": []}),
        ]
        for path, body in bad:
            response = client.post(path, json=body)
            assert response.status_code == 400, (path, body, response.status_code)
            assert list(response.json()) == ["error"]
        not_json = client.post("/search", content=b"not json", headers={"content-type": "application/json"})
        assert not_json.status_code == 400 and not_json.json()["error"].startswith("body: ")
        huge = client.post(
            "/search", content=b"{" + b" " * (1 << 20) + b"}", headers={"content-type": "application/json"}
        )
        assert huge.status_code == 413


def test_picks_up_add_and_delete_without_restart(index, tmp_path):
    app = create_app(index)
    with TestClient(app) as client:
        more = tmp_path / "more.csv"
        more.write_text('id,text,category\nb1,"Do you rent tandems?",riding\n')
        add_to_index(index, more)
        assert client.post("/reload").json()["reloads"] == 1
        assert (
            client.post("/search", json={"query": "Do you rent tandems?", "k": 1}).json()["hits"][0]["id"]
            == "b1"
        )
        delete_from_index(index, ["b1", "a1"])
        client.post("/reload")
        ids = {h["id"] for h in client.post("/search", json={"query": "tandems", "k": 10}).json()["hits"]}
        assert ids == {"a2", "a3", "a4"}


def test_concurrent_queries_are_embedded_together(index):
    app = create_app(index)

    async def burst() -> list[int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            responses = await asyncio.gather(
                *[client.post("/search", json={"query": f"question {i}", "k": 2}) for i in range(24)]
            )
            info = (await client.get("/info")).json()
        return [r.status_code for r in responses] + [info["largest_batch"]]

    *codes, largest = asyncio.run(burst())
    assert codes == [200] * 24
    assert largest > 1


@pytest.mark.slow
def test_serve_binds_localhost_by_default(index):
    with serving(index) as port:
        if shutil.which("ss"):  # the listening socket's local address is loopback only
            listening = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True)
            assert [line.split()[3] for line in listening.stdout.splitlines()] == [f"127.0.0.1:{port}"]


def test_a_search_after_an_update_answers_from_one_generation(index, tmp_path):
    """An upsert commits into the version the server has open, between its reload checks: the
    request is answered from the new generation whole (rows and vectors), not a mix, nor an error."""
    from search.read.engine import SearchEngine
    from tests.helpers import write_csv

    question = "Which bikes can I rent for a whole week?"
    with TestClient(create_app(index, reload_every=3600)) as client:
        assert client.post("/search", json={"query": question, "k": 4}).status_code == 200
        columns = ("id", "text", "category")
        change = write_csv(tmp_path / "change.csv", [("a2", question, "stations")], columns)
        add_to_index(index, change, id_field="id")
        for where in (None, "category = 'stations'"):
            answer = client.post("/search", json={"query": question, "k": 4, "where": where})
            assert answer.status_code == 200, answer.text
            fresh = SearchEngine(index).search(question, k=4, where=where)
            assert [(h["id"], h["text"], round(h["score"], 5)) for h in answer.json()["hits"]] == [
                (h.id, h.text, round(h.score, 5)) for h in fresh
            ]


def test_the_access_log_escapes_what_a_client_sent():
    from search.server.serving import escaped

    assert escaped("POST /search?x=1 HTTP/1.1") == "POST /search?x=1 HTTP/1.1"
    assert escaped('\x1b[2J"\\\x00\u202e\U0001f600\n') == "\\x1b[2J\\x22\\x5c\\x00\\u202e\\U0001f600\\x0a"


@pytest.mark.parametrize("writable", [True, False], ids=["writable", "read-only"])
def test_a_killed_writers_journal_fails_no_request(reachable_tmp, tiny_model, writable):
    """A writer killed mid-transaction leaves a hot journal in the version the server has open:
    every kind of request is answered from the last committed state, whether the server rolls
    the journal back or, unable to write there, reads around it; it then picks up what the next
    writer commits."""
    index = build_faq(reachable_tmp, tiny_model)
    question = ROWS[1][1]
    with TestClient(create_app(index)) as other:  # what the committed state answers
        before = {
            mode: other.post("/search", json={"query": question, "k": 2, "mode": mode}).json()
            for mode in ("dense", "keyword", "hybrid")
        }
        fields = other.get("/fields").json()
    with TestClient(create_app(index, reload_every=3600)) as client:  # asked nothing before the kill
        journal = leave_hot_journal(index)
        with contextlib.nullcontext() if writable else unwritable(reachable_tmp):
            answer = client.post("/search", json={"query": question, "k": 2})  # the default mode
            assert (answer.status_code, answer.json()) == (200, before["hybrid"]), answer.text
            for mode, expected in before.items():
                answer = client.post("/search", json={"query": question, "k": 2, "mode": mode})
                assert (answer.status_code, answer.json()) == (200, expected), answer.text
            batch = client.post("/search/batch", json={"queries": [question], "k": 2, "mode": "hybrid"})
            assert batch.status_code == 200 and batch.json()["results"][0]["hits"] == before["hybrid"]["hits"]
            answer = client.get("/fields")
            assert (answer.status_code, answer.json()) == (200, fields)
            assert client.get("/info").json()["entries"] == len(ROWS)
        assert journal.exists() != writable  # rolled back by the server where it may write
        add_to_index(index, write_csv(reachable_tmp / "new.csv", [("n1", "a brand new question", "app")]))
        assert client.post("/reload").status_code == 200
        top = client.post("/search", json={"query": "a brand new question", "k": 1, "mode": "keyword"})
        assert top.json()["hits"][0]["id"] == "n1"
