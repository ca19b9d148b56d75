"""Odd input never reaches the internal-error handler: every bad request is a 4xx with one body
shape, ``{"error": "..."}``; /similar ranks with the index's fitted post-processing; /docs works
offline."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from search.server import create_app  # noqa: E402
from search.server.batching import MAX_REQUEST_TOKENS, Batched, MicroBatcher  # noqa: E402
from tests.helpers import ROWS, build_faq, long_sentences, random_cross_encoder  # noqa: E402


@pytest.fixture(scope="module")
def client(tmp_path_factory, tiny_model):
    index = build_faq(tmp_path_factory.mktemp("faq"), tiny_model, field="c")
    with TestClient(create_app(index), raise_server_exceptions=False) as client:
        yield client


ODD = {
    "huge k": ("/search", b'{"query": "bike", "k": 1e400}'),
    "lone surrogate in query": ("/search", b'{"query": "bike \\ud800"}'),
    "lone surrogate in a batch": ("/search/batch", b'{"queries": ["ok", "\\udfff"]}'),
    "lone surrogate in where": ("/search", b'{"query": "bike", "where": "c = \'\\ud800\'"}'),
    "lone surrogate in candidates": ("/similar", b'{"sentence": "a", "candidates": ["\\ud800"]}'),
    "490 nested parentheses": (
        "/search",
        json.dumps({"query": "bike", "where": "(" * 490 + "c='a'" + ")" * 490}).encode(),
    ),
    "248 NOTs": ("/search", json.dumps({"query": "bike", "where": "NOT " * 248 + "c='a'"}).encode()),
    "not json": ("/search", b"not json"),
    "empty query": ("/search", b'{"query": ""}'),
    "zero-width query": ("/search", b'{"query": "\\u200b"}'),
    "BOM-only query in a batch": ("/search/batch", b'{"queries": ["ok", "\\ufeff"]}'),
    "control-only sentence": ("/similar", b'{"sentence": "\\u0001\\u0002", "candidates": ["a"]}'),
    "NUL to embed": ("/v1/embeddings", b'{"input": ["ok", "\\u0000"]}'),
    "zero-width to encode": ("/encode", b'{"texts": ["\\u200b\\u200c"]}'),
    "k as text": ("/search", b'{"query": "bike", "k": "many"}'),
}


@pytest.mark.parametrize("path, body", ODD.values(), ids=ODD.keys())
def test_odd_input_is_a_4xx_with_an_error(client, path, body):
    response = client.post(path, content=body, headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500, response.text
    answer = response.json()
    assert list(answer) == ["error"] and answer["error"]
    # /v1/embeddings answers in OpenAI's shape ({"error": {"message", ...}}), the others a string
    message = answer["error"]["message"] if path == "/v1/embeddings" else answer["error"]
    assert isinstance(message, str) and message and "internal" not in message
    assert client.get("/health").status_code == 200


def test_validation_errors_name_the_field(client):
    response = client.post("/search", json={"query": "bike", "k": 0})
    assert response.status_code == 400
    assert response.json()["error"].startswith("k: ")


LOOSE = {
    "k as true": ("/search", {"query": "bike", "k": True}, "k"),
    "k as a numeral": ("/search", {"query": "bike", "k": "2"}, "k"),
    "batch k as a numeral": ("/search/batch", {"queries": ["bike"], "k": "2"}, "k"),
    "rerank_depth as a numeral": ("/search", {"query": "bike", "rerank_depth": "20"}, "rerank_depth"),
    "rerank as 0": ("/search", {"query": "bike", "rerank": 0}, "rerank"),
    "rerank as text": ("/search", {"query": "bike", "rerank": "false"}, "rerank"),
    "min_score as a numeral": ("/search", {"query": "bike", "min_score": "0.5"}, "min_score"),
    "similar k as true": ("/similar", {"sentence": "a", "candidates": ["b"], "k": True}, "k"),
    "dimensions as true": ("/v1/embeddings", {"input": "bike", "dimensions": True}, "dimensions"),
    "dimensions as a numeral": ("/v1/embeddings", {"input": "bike", "dimensions": "8"}, "dimensions"),
    "top_n as true": ("/v1/rerank", {"query": "q", "documents": ["a", "b"], "top_n": True}, "top_n"),
    "top_n as a numeral": ("/v1/rerank", {"query": "q", "documents": ["a", "b"], "top_n": "2"}, "top_n"),
    "return_documents as 1": (
        "/v1/rerank",
        {"query": "q", "documents": ["a"], "return_documents": 1},
        "return_documents",
    ),
    "v2 top_n as true": ("/v2/rerank", {"query": "q", "documents": ["a", "b"], "top_n": True}, "top_n"),
    "v2 max_tokens_per_doc as a numeral": (
        "/v2/rerank",
        {"query": "q", "documents": ["a"], "max_tokens_per_doc": "64"},
        "max_tokens_per_doc",
    ),
    "raw_scores as text": ("/rerank", {"query": "q", "texts": ["a"], "raw_scores": "yes"}, "raw_scores"),
    "return_text as 1": ("/rerank", {"query": "q", "texts": ["a"], "return_text": 1}, "return_text"),
}


@pytest.mark.parametrize("path, body, field", LOOSE.values(), ids=LOOSE.keys())
def test_numbers_and_flags_are_taken_only_as_their_json_types(client, path, body, field):
    """``true`` is no count and ``"2"`` no number: the schema's types are held, not coerced."""
    response = client.post(path, json=body)
    assert response.status_code == 400, response.text
    answer = response.json()["error"]
    message = answer["message"] if path == "/v1/embeddings" else answer
    assert message.startswith(f"{field}: ") and "\n" not in message, message


def test_an_integral_number_is_a_count_as_json_schema_says(client):
    answer = client.post(
        "/search", content=b'{"query": "bike", "k": 2.0}', headers={"content-type": "application/json"}
    )
    assert answer.status_code == 200 and len(answer.json()["hits"]) == 2, answer.text
    message = client.post("/search", json={"query": "bike", "k": True}).json()["error"]
    assert message == "k: Input should be a JSON integer, not true"


@pytest.mark.parametrize("value", [b"NaN", b"Infinity", b"-Infinity", b'"nan"'])
@pytest.mark.parametrize(
    "path, key", [("/search", b'"query": "bike"'), ("/search/batch", b'"queries": ["bike"]')]
)
def test_a_min_score_that_is_not_a_number_names_the_field_and_its_range(client, path, key, value):
    body = b"{" + key + b', "min_score": ' + value + b"}"
    response = client.post(path, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    message = response.json()["error"]
    assert message.startswith("min_score: ") and "[-1, 1]" in message and "--" not in message, message


def test_work_per_request_is_bounded(client):
    candidates = long_sentences(300, 300)
    response = client.post("/similar", json={"sentence": "lock", "candidates": candidates})
    assert response.status_code == 400
    assert str(MAX_REQUEST_TOKENS) in response.json()["error"]


@pytest.fixture(scope="module")
def reranking(tmp_path_factory, tiny_model):
    """A server over the FAQ whose searches rerank with a tiny random cross-encoder."""
    from indexer.encoders.rerankers import reranker_for
    from search.read.loading import load_engine

    index = build_faq(tmp_path_factory.mktemp("faq"), tiny_model)
    cross = reranker_for(random_cross_encoder(tmp_path_factory.mktemp("cross"), seed=3), runtime="torch")
    with TestClient(create_app(index, loading=load_engine(index, None, cross))) as client:
        yield client


def test_reranking_past_the_pairs_bound_is_refused_before_any_model_work(reranking, monkeypatch):
    """64 queries at depth 1000 were 64,000 cross-encoder pairs for one request: queries x depth
    past ``MAX_REQUEST_PAIRS`` is a 400 in one line naming the count and the bound, and neither
    the queries are embedded nor any pair scored."""
    from search.server.schema import MAX_BATCH, MAX_K, MAX_REQUEST_PAIRS

    worked: list[str] = []
    monkeypatch.setattr(MicroBatcher, "run", lambda *a, **k: worked.append("embedded"))
    monkeypatch.setattr(Batched, "score_pairs", lambda *a, **k: worked.append("scored"))
    queries = [f"bike {i}" for i in range(MAX_BATCH)]
    for deep, depth in [
        ({"rerank_depth": 1000}, 1000),
        ({"rerank_depth": MAX_REQUEST_PAIRS // MAX_BATCH + 1}, MAX_REQUEST_PAIRS // MAX_BATCH + 1),
        ({"k": MAX_K}, MAX_K),  # the default depth is k past RERANK_DEPTH
    ]:
        response = reranking.post("/search/batch", json={"queries": queries, **deep})
        assert response.status_code == 400, response.text
        message = response.json()["error"]
        assert "\n" not in message and f"{MAX_BATCH * depth} pairs" in message, message
        assert f"at most {MAX_REQUEST_PAIRS}" in message, message
    assert worked == []


def test_reranking_at_the_pairs_bound_is_answered(reranking):
    """A full batch at the default depth (``RERANK_DEPTH``) is just at the bound, and one search
    at the deepest depth is under it: both are answered, as is a full batch not reranked."""
    from search.read.hybrid import MAX_RERANK_DEPTH, RERANK_DEPTH
    from search.server.schema import MAX_BATCH, MAX_CANDIDATES, MAX_K, MAX_REQUEST_PAIRS

    assert MAX_BATCH * RERANK_DEPTH == MAX_REQUEST_PAIRS
    assert MAX_CANDIDATES <= MAX_REQUEST_PAIRS  # the rerank routes' documents: one pair each
    queries = [ROWS[i % len(ROWS)][1] for i in range(MAX_BATCH)]
    batch = reranking.post("/search/batch", json={"queries": queries, "k": 2})
    assert batch.status_code == 200, batch.text
    assert all(r["hits"][0]["first_score"] is not None for r in batch.json()["results"])
    deep = reranking.post("/search", json={"query": "bike", "rerank_depth": MAX_RERANK_DEPTH})
    assert deep.status_code == 200, deep.text
    plain = {"queries": queries, "k": MAX_K, "rerank": False}
    assert reranking.post("/search/batch", json=plain).status_code == 200


def test_docs_load_nothing_from_outside(client):
    page = client.get("/docs")
    assert page.status_code == 200
    assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert assets and all(url.startswith("/") for url in assets), assets
    for url in assets:
        assert client.get(url).status_code == 200, url
    assert "https://" not in page.text


def test_similar_uses_the_index_transform(tmp_path, tiny_model):
    index = build_faq(tmp_path, tiny_model, postprocess="center")
    with TestClient(create_app(index)) as client:
        one = client.post("/similar", json={"sentence": ROWS[0][1], "candidates": [ROWS[0][1]]}).json()
        assert one["hits"][0]["score"] == pytest.approx(1.0, abs=1e-4)
        two = client.post("/similar", json={"sentence": ROWS[0][1], "candidates": [ROWS[1][1], ROWS[2][1]]})
        assert [-1.0 < h["score"] < 1.0 for h in two.json()["hits"]] == [True, True]
