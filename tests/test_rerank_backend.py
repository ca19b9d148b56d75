"""What runs a search's reranker (``rerank_backend``: onnx, onnx-int8 or torch) asked in Python, on
the CLI (``--rerank-backend``, ``serve`` included) and over HTTP: each reranker loaded once per
(folder, runtime), int8 scores near the fp32 ones, a bad name one line naming the option."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from indexer.errors import BadInput
from search.cli import cli
from search.read.engine import SearchEngine
from search.read.reranked import RerankOptions
from tests.helpers import random_cross_encoder, write_csv

pytest.importorskip("onnxruntime")

TEXTS = [
    "pay for a ride with a card",
    "where to park the bike",
    "get a refund for a trip",
    "the app shows your receipts",
    "reset your password on the account page",
    "we take every major card",
    "child seats on every bike",
    "call us when a bike breaks down",
]
QUERY = "how do I pay with a card"
SEARCH = {"k": 4, "mode": "dense", "rerank_depth": 6}


@pytest.fixture(scope="module", autouse=True)
def own_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One cache for the module (each graph exported once), none of the user's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SEMSEARCH_CACHE", str(tmp_path_factory.getbasetemp() / "rerank-backend-cache"))
        yield


@pytest.fixture(scope="module")
def cross(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny random reranker whose score is its logit (no sigmoid to flatten int8's difference)."""
    return random_cross_encoder(tmp_path_factory.mktemp("cross"), "bert", "identity")


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, tiny_model: str):
    from indexer import Strategy, build_index

    directory = tmp_path_factory.mktemp("faq")
    corpus = write_csv(directory / "faq.csv", [(f"q{i}", t) for i, t in enumerate(TEXTS)], ("id", "text"))
    build_index(corpus, directory / "idx", Strategy(model=tiny_model))
    return directory / "idx"


@pytest.fixture(scope="module")
def searched(index, cross) -> dict[str, list]:
    """Each runtime's hits for QUERY in Python, from one engine that has no reranker of its own."""
    engine = SearchEngine(index, rerank=False)
    return {
        backend: engine.search_many([QUERY], rerank=cross, rerank_backend=backend, **SEARCH)[0]
        for backend in ("onnx", "onnx-int8")
    }


def runtimes(engine: SearchEngine) -> list:
    """The rerankers ``engine`` loaded, each once (one may be kept under two keys: asked by no
    runtime and by the one it runs on)."""
    return list({id(reranker): reranker for reranker in engine.rerankers.values()}.values())


def scores(hits) -> list[float]:
    return [hit["score"] if isinstance(hit, dict) else hit.score for hit in hits]


def test_int8_reranks_the_same_candidates_near_fp32_and_each_runtime_loads_once(index, cross, searched):
    fp32, int8 = searched["onnx"], searched["onnx-int8"]
    first = SearchEngine(index, rerank=False).search_many([QUERY], k=6, mode="dense")[0]
    assert {h.id for h in int8} <= {h.id for h in first} and {h.id for h in fp32} <= {h.id for h in first}
    assert scores(int8) == sorted(scores(int8), reverse=True)  # a ranking: best first
    own = dict(zip([h.id for h in fp32], scores(fp32), strict=True))
    shared = [h for h in int8 if h.id in own]
    spread = max(own.values()) - min(own.values())
    assert len(shared) >= 3
    apart = np.abs(np.array([h.score - own[h.id] for h in shared]))  # a tiny random net: coarse int8
    assert apart.mean() <= 0.1 * spread and apart.max() <= 0.25 * spread, (scores(int8), own)
    assert scores(int8) != scores(fp32)  # int8 weights: the scores move, a little

    engine = SearchEngine(index, rerank=RerankOptions(cross, backend="onnx-int8"))  # the engine's own runtime
    (loaded,) = runtimes(engine)
    assert loaded.runtime == "onnx-int8"
    again = engine.search_many([QUERY], **SEARCH)[0]
    assert scores(again) == pytest.approx(scores(int8), abs=1e-6)
    on_fp32 = [engine.search_many([QUERY], rerank_backend="onnx", **SEARCH)[0] for _ in range(2)]
    assert scores(on_fp32[1]) == pytest.approx(scores(fp32), abs=1e-6)
    assert sorted(r.runtime for r in runtimes(engine)) == ["onnx", "onnx-int8"]  # once each
    assert (
        engine.reranker(cross) is loaded
        and engine.reranker(cross, RerankOptions(backend="onnx-int8")) is loaded
    )


def test_a_bad_backend_is_one_line_naming_the_option_in_python(index, cross):
    with pytest.raises(BadInput, match=r"rerank_backend must be torch, onnx or onnx-int8, not 'fast'"):
        SearchEngine(index, rerank=False).search_many([QUERY], rerank=cross, rerank_backend="fast")
    with pytest.raises(BadInput, match=r"rerank_backend needs a reranker \(rerank\)"):
        SearchEngine(index, rerank=False).search_many([QUERY], rerank_backend="onnx")


def test_the_cli_reranks_on_the_backend_asked_and_refuses_a_bad_one_in_one_line(index, cross, searched):
    flags = ["--mode", "dense", "-k", "4", "--rerank-depth", "6", "--rerank", cross, "--json"]
    said = CliRunner().invoke(cli, ["query", str(index), QUERY, *flags, "--rerank-backend", "onnx-int8"])
    assert said.exit_code == 0, said.output
    hits = json.loads(said.stdout)["hits"]
    assert [h["id"] for h in hits] == [h.id for h in searched["onnx-int8"]]
    assert scores(hits) == pytest.approx(scores(searched["onnx-int8"]), abs=1e-6)
    bad = CliRunner().invoke(cli, ["query", str(index), QUERY, *flags, "--rerank-backend", "fast"])
    assert bad.exit_code == 2 and "--rerank-backend" in bad.output and "Traceback" not in bad.output
    alone = CliRunner().invoke(cli, ["query", str(index), QUERY, "--rerank-backend", "onnx"])
    assert alone.exit_code == 2 and "--rerank-backend needs --rerank MODEL" in alone.output


def test_serve_takes_the_backend_alone_of_the_rerank_options():
    """A server's searches say their depth and weight themselves; the runtime is how it loads."""
    served = CliRunner().invoke(cli, ["serve", "--help"]).output
    assert "--rerank-backend" in served and "--rerank-depth" not in served and "--rerank-weight" not in served
    indexed = CliRunner().invoke(cli, ["index", "--help"]).output
    assert "--rerank " in indexed and "--rerank-backend" not in indexed


def test_the_server_reranks_on_the_backend_a_search_asks(index, cross, searched):
    from search.read.loading import load_engine
    from search.server import create_app

    loading = load_engine(index, rerank=RerankOptions(cross))
    with TestClient(create_app(index, loading=loading)) as client:
        for backend, expected in searched.items():
            for _ in range(2):  # the second is answered by the reranker the first loaded
                body = {"query": QUERY, **SEARCH, "rerank_backend": backend}
                hits = client.post("/search", json=body).json()["hits"]
                assert scores(hits) == pytest.approx(scores(expected), abs=1e-6)
        batch = {"queries": [QUERY, QUERY], **SEARCH, "rerank_backend": "onnx-int8"}
        for result in client.post("/search/batch", json=batch).json()["results"]:
            assert scores(result["hits"]) == pytest.approx(scores(searched["onnx-int8"]), abs=1e-6)
        bad = client.post("/search", json={"query": QUERY, "rerank_backend": "fast"})
        assert bad.status_code == 400 and bad.json()["error"].startswith("rerank_backend: ")
        schema = client.get("/openapi.json").json()["components"]["schemas"]["SearchRequest"]
        field = schema["properties"]["rerank_backend"]
        assert {"enum": ["torch", "onnx", "onnx-int8"], "type": "string"} in field["anyOf"]
        assert {"type": "null"} in field["anyOf"] and "onnx-int8" in field["description"]
    assert sorted(r.runtime for r in runtimes(loading.result())) == ["onnx", "onnx-int8"]


@pytest.mark.parametrize("indexed", [True, False], ids=["index", "reranker-alone"])
def test_serve_with_rerank_backend_serves_that_runtime(index, cross, tiny_model, monkeypatch, indexed):
    """``semsearch serve --rerank X --rerank-backend onnx-int8`` reranks searches and answers
    /v1/rerank with the int8 reranker (with an index, and serving vectors and a reranker alone)."""
    import search.server
    from indexer.encoders.rerankers import reranker_for

    apps = []
    monkeypatch.setattr(search.server, "listen", lambda host, port: None)
    monkeypatch.setattr(search.server, "serve", lambda app, listening, **options: apps.append(app))
    what = [str(index)] if indexed else ["--model", tiny_model]
    said = CliRunner().invoke(cli, ["serve", *what, "--rerank", cross, "--rerank-backend", "onnx-int8"])
    assert said.exit_code == 0, said.output
    int8 = reranker_for(cross, runtime="onnx-int8").score(QUERY, TEXTS[:3])
    fp32 = reranker_for(cross, runtime="onnx").score(QUERY, TEXTS[:3])
    with TestClient(apps[0]) as client:
        answer = client.post("/v1/rerank", json={"query": QUERY, "documents": TEXTS[:3]}).json()
        given = {r["index"]: r["relevance_score"] for r in answer["results"]}
        assert [given[i] for i in range(3)] == pytest.approx(int8.tolist(), abs=1e-6)
        assert not np.allclose([given[i] for i in range(3)], fp32, rtol=0, atol=1e-7)
