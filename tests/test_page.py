"""The search page's server side: `/` and its static files (package data, so a wheel carries
them), the page's security policy, and `/fields`, the facets the page builds its filters from."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from indexer import Strategy, build_index  # noqa: E402
from search.server import create_app  # noqa: E402
from tests.helpers import ROOT  # noqa: E402

PAGE_FILES = {"index.html", "page.css", "page.js"}
ODD = 'kind "x" é 分类'  # a field name with quotes, a space and non-ASCII


@pytest.fixture
def client(tmp_path, tiny_model):
    corpus = tmp_path / "faq.jsonl"
    rows = [
        '{"id": "a", "text": "pay for a ride", "category": "billing", "year": 2020, "%s": "x"}',
        '{"id": "b", "text": "park the bike", "category": "stations", "year": 2024, "%s": "y"}',
        '{"id": "c", "text": "get a refund", "category": "billing", "year": 2021, "%s": "x"}',
    ]
    odd = ODD.replace('"', '\\"')
    corpus.write_text("\n".join(r % odd for r in rows) + "\n", encoding="utf-8")
    build_index(corpus, tmp_path / "idx", Strategy(model=tiny_model))
    with TestClient(create_app(tmp_path / "idx")) as client:
        yield client


def test_page_and_its_files(client):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy and "unsafe-inline" not in policy
    assert "http" not in page.text.replace('href="/docs"', "")  # nothing loaded from elsewhere
    for name, kind in [("page.js", "javascript"), ("page.css", "text/css")]:
        answer = client.get(f"/static/{name}")
        assert answer.status_code == 200 and kind in answer.headers["content-type"]
        assert "http://" not in answer.text and "https://" not in answer.text
    assert client.get("/static/../cli.py").status_code == 404
    assert client.get("/static/nothing.js").status_code == 404
    assert "innerHTML" not in client.get("/static/page.js").text  # stored values go in as text


def test_fields(client):
    fields = client.get("/fields").json()["fields"]
    category = {"type": "text", "values": [["billing", 2], ["stations", 1]], "repeats": True}
    assert fields["category"] == category
    assert fields["year"]["type"] == "integer"
    assert (fields["year"]["min"], fields["year"]["max"]) == (2020, 2024)
    assert fields[ODD]["values"] == [["x", 2], ["y", 1]]
    assert set(fields) == {"id", "text", "category", "year", ODD}
    # the where string the page builds for the odd field is one the API takes
    where = '"' + ODD.replace('"', '""') + "\" = 'x'"
    hits = client.post("/search", json={"query": "ride", "k": 5, "where": where}).json()["hits"]
    assert sorted(h["id"] for h in hits) == ["a", "c"]
    quoted = client.post("/search", json={"query": "ride", "k": 5, "where": "category = 'it''s'"})
    assert quoted.json()["hits"] == []


@pytest.mark.slow
def test_page_files_are_in_the_wheel(tmp_path):
    """A non-editable install has the page: setuptools ships search/static as package data."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("indexer", "search", "semsearch"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = Path(tmp_path / "dist").glob("semsearch-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"search/static/{name}" for name in PAGE_FILES} <= names
    assert "semsearch/__init__.py" in names  # `import semsearch` works from the wheel too


def test_the_page_offers_duplicates_and_the_api_gives_their_texts(tmp_path, tiny_model):
    corpus = tmp_path / "faq.jsonl"
    rows = [
        '{"id": "a", "text": "<b>same</b> é"}',
        '{"id": "b", "text": "<b>same</b> é"}',
        '{"id": "c", "text": "x"}',
    ]
    corpus.write_text("\n".join(rows) + "\n", encoding="utf-8")
    build_index(corpus, tmp_path / "idx", Strategy(model=tiny_model))
    with TestClient(create_app(tmp_path / "idx")) as client:
        page = client.get("/").text
        assert 'id="tab-duplicates"' in page and 'id="duplicates-form"' in page
        body = client.get("/duplicates", params={"min_score": 0.9999}).json()
        assert body["groups"] == [["a", "b"]]
        assert body["texts"] == {"a": "<b>same</b> é", "b": "<b>same</b> é"}
