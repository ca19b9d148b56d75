"""The query path's rerank stage: a cross-encoder re-orders the first stage's best ``rerank_depth``
entries, in the query, Python and HTTP surfaces, and serves ``/v1/rerank`` and ``/rerank``."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from indexer.errors import BadInput
from search.cli import cli
from search.read.engine import SearchEngine
from search.read.requests import SearchRequest
from search.read.reranked import RerankOptions
from tests.helpers import random_cross_encoder, write_csv

QUESTIONS = [
    "How do I pay for a ride?",
    "Where can I park the bike?",
    "Can I get a refund?",
    "Is there an app?",
    "How do I reset my password?",
    "Which cards do you take?",
    "Can I bring a child seat?",
    "What if the bike breaks down?",
    "How long can I keep a bike?",
    "Do you rent electric bikes?",
    "Can I cancel a trip?",
    "Where do I see my receipts?",
]
CATEGORIES = ["billing", "stations", "billing", "app", "app", "billing"] * 2
QUERY = "how do I pay with a card"


@pytest.fixture(scope="module")
def cross(tmp_path_factory) -> str:
    return random_cross_encoder(tmp_path_factory.mktemp("cross"), seed=3)


@pytest.fixture(scope="module")
def reranker(cross):
    from indexer.encoders.rerankers import reranker_for

    return reranker_for(cross, runtime="torch")  # the ONNX export is the slow tests'


@pytest.fixture(scope="module")
def index(tmp_path_factory, tiny_model):
    from indexer import Strategy, build_index

    directory = tmp_path_factory.mktemp("faq")
    rows = [(f"q{i}", text, CATEGORIES[i]) for i, text in enumerate(QUESTIONS)]
    corpus = write_csv(directory / "faq.csv", rows, ("id", "text", "category"))
    build_index(corpus, directory / "idx", Strategy(model=tiny_model))
    return directory / "idx"


def predicted(cross: str, question: str, texts: list[str]) -> np.ndarray:
    """What sentence-transformers' CrossEncoder says of the pairs: the reference."""
    from sentence_transformers import CrossEncoder

    return CrossEncoder(cross, device="cpu").predict([(question, t) for t in texts])


def test_reranked_order_is_the_first_stages_best_depth_sorted_by_cross_encoder_predict(
    index, reranker, cross
):
    engine = SearchEngine(index, rerank=reranker)
    first = engine.answer(SearchRequest(QUERY, k=6, mode="dense"))[0]
    hits = engine.answer(SearchRequest(QUERY, k=4, mode="dense", rerank=RerankOptions(cross, 6)))[0]
    scores = predicted(cross, QUERY, [h.text for h in first])
    order = np.argsort(-scores, kind="stable")[:4]
    assert [h.id for h in hits] == [first[i].id for i in order]
    assert [h.score for h in hits] == pytest.approx(scores[order].tolist(), abs=1e-4)
    assert [h.first_score for h in hits] == pytest.approx([first[i].score for i in order])
    assert all(h.first_score is None for h in first)
    assert [h.rank for h in hits] == [1, 2, 3, 4]


def fused_copy(cross: str, directory, weight: float) -> str:
    """The reranker at ``cross`` with a fused weight in its ``semsearch.json``, as ``tune`` writes it."""
    import shutil

    folder = directory / f"fused-{weight}"
    shutil.copytree(cross, folder)
    (folder / "semsearch.json").write_text(json.dumps({"reranker": True, "fusion": {"weight": weight}}))
    return str(folder)


@pytest.mark.parametrize("weight", [0.0, 0.4])
def test_a_reranker_with_a_fused_weight_scores_hits_by_both_stages(index, cross, tmp_path, weight):
    """Weight w: a hit's score is w x the reranker's + (1 - w) x the first stage's; at 0 the order
    is the first stage's, so a reranker that did not help cannot rank below it."""
    from indexer.encoders.rerankers import reranker_for

    fused = reranker_for(fused_copy(cross, tmp_path, weight), runtime="torch")
    assert fused.folder.weight == weight and "weight" in fused.folder.describe()
    assert fused.folder.fingerprint != reranker_for(cross, runtime="torch").folder.fingerprint
    engine = SearchEngine(index, rerank=fused)
    first = engine.answer(SearchRequest(QUERY, k=6, mode="dense"))[0]
    asked = RerankOptions(fused.folder.path, 6)
    hits = engine.answer(SearchRequest(QUERY, k=6, mode="dense", rerank=asked))[0]
    own = predicted(cross, QUERY, [h.text for h in first])
    expected = weight * own + (1 - weight) * np.array([h.score for h in first])
    order = np.argsort(-expected, kind="stable")
    assert [h.id for h in hits] == [first[i].id for i in order]
    assert [h.score for h in hits] == pytest.approx(expected[order].tolist(), abs=1e-4)
    assert [h.rerank_score for h in hits] == pytest.approx(own[order].tolist(), abs=1e-4)
    assert [h.first_score for h in hits] == pytest.approx([first[i].score for i in order])
    if weight == 0.0:
        assert [h.id for h in hits] == [h.id for h in first]


def test_a_searchs_rerank_weight_overrides_the_stored_one_in_python_and_http(index, cross, tmp_path):
    """``rerank_weight`` 0 gives the first stage's order and scores, 1 the reranker's, whatever
    weight the reranker's folder stores (0.4 here)."""
    from indexer.encoders.rerankers import reranker_for
    from search.read.loading import load_engine
    from search.server import create_app

    fused = reranker_for(fused_copy(cross, tmp_path, 0.4), runtime="torch")
    engine = SearchEngine(index, rerank=fused)
    first = engine.answer(SearchRequest(QUERY, k=6, mode="dense"))[0]
    own = predicted(cross, QUERY, [h.text for h in first])
    order = np.argsort(-own, kind="stable")
    asked = dict(k=6, mode="dense", rerank_depth=6)
    at_0, at_1 = (engine.search_many([QUERY], **asked, rerank_weight=w)[0] for w in (0, 1.0))
    assert [h.id for h in at_0] == [h.id for h in first]
    assert [h.score for h in at_0] == pytest.approx([h.score for h in first])
    assert [h.id for h in at_1] == [first[i].id for i in order]
    assert [h.score for h in at_1] == pytest.approx(own[order].tolist(), abs=1e-4)
    with TestClient(create_app(index, loading=load_engine(index, rerank=fused))) as served:
        for weight, expected in ((0, at_0), (1, at_1)):
            body = {"query": QUERY, **asked, "rerank_weight": weight}
            hits = served.post("/search", json=body).json()["hits"]
            assert [h["id"] for h in hits] == [h.id for h in expected]
            assert [h["score"] for h in hits] == pytest.approx([h.score for h in expected], abs=1e-4)
        batch = {"queries": [QUERY], **asked, "rerank_weight": 0}
        hits = served.post("/search/batch", json=batch).json()["results"][0]["hits"]
        assert [h["id"] for h in hits] == [h.id for h in first]


@pytest.mark.parametrize("weight", [1.5, -0.1, float("nan")])
def test_a_rerank_weight_out_of_range_is_one_line_on_every_surface(index, client, weight):
    with pytest.raises(BadInput, match=r"rerank_weight must be in \[0, 1\]"):
        SearchEngine(index, rerank=False).search_many([QUERY], rerank="any", rerank_weight=weight)
    body = json.dumps({"query": QUERY, "rerank_weight": weight})  # NaN as JSON's NaN
    bad = client.post("/search", content=body, headers={"content-type": "application/json"})
    assert bad.status_code == 400 and "rerank_weight must be in [0, 1]" in bad.json()["error"]
    flags = ["--rerank", "any", f"--rerank-weight={weight}"]
    said = CliRunner().invoke(cli, ["query", str(index), QUERY, *flags])
    assert said.exit_code == 2 and "--rerank-weight must be in [0, 1]" in said.output


def test_a_rerank_weight_needs_a_reranker_and_the_help_says_what_it_is(index, client):
    alone = CliRunner().invoke(cli, ["query", str(index), QUERY, "--rerank-weight", "0.5"])  # no default
    assert alone.exit_code == 2 and "--rerank-weight needs --rerank MODEL" in alone.output
    off = CliRunner().invoke(cli, ["query", str(index), QUERY, "--no-rerank", "--rerank-weight", "0.5"])
    assert off.exit_code == 2 and "--no-rerank takes no --rerank-weight" in off.output
    assert "--rerank-weight W" in CliRunner().invoke(cli, ["query", "--help"]).output
    bad = client.post("/search", json={"query": QUERY, "rerank": False, "rerank_weight": 0.5})
    assert bad.status_code == 400 and "takes no rerank_weight" in bad.json()["error"]
    strict = client.post("/search", json={"query": QUERY, "rerank_weight": True})
    assert strict.status_code == 400 and "rerank_weight" in strict.json()["error"]


def test_a_fused_weight_out_of_range_is_refused_in_one_line(cross, tmp_path):
    from indexer.encoders.rerankers import reranker_for

    with pytest.raises(BadInput, match="fusion weight must be a number from 0 to 1"):
        reranker_for(fused_copy(cross, tmp_path, 1.5), runtime="torch")


def test_search_reranks_with_the_engines_reranker_and_false_turns_it_off(index, reranker):
    engine = SearchEngine(index, rerank=reranker)
    assert engine.search(QUERY, k=3)[0].first_score is not None
    assert engine.search_many([QUERY], k=3, rerank=None)[0][0].first_score is None
    assert all(h.first_score is None for h in SearchEngine(index).search(QUERY, k=3))


def test_min_score_applies_to_the_rerankers_score(index, reranker, cross):
    engine = SearchEngine(index, rerank=reranker)
    hits = engine.search(QUERY, k=5)
    middle = sorted(h.score for h in hits)[2]
    marked = engine.search(QUERY, k=5, min_score=middle)
    assert [h.answered for h in marked] == [h.score >= middle for h in hits]
    assert any(h.answered for h in marked) and not all(h.answered for h in marked)


def test_a_min_score_outside_the_range_of_the_score_in_use_is_refused_naming_it(index, cross, client):
    """Plain, a hit's score is in [-1, 1]; reranked by a sigmoid, it is the reranker's in [0, 1],
    fused at weight w with the first stage's: in [w - 1, 1]. A min score outside the range of the
    score a search shows is refused naming that range: one line in Python and HTTP (400), a usage
    error in the CLI (exit 2), which knows the score once it knows the reranker."""
    engine = SearchEngine(index, rerank=False)
    with pytest.raises(BadInput, match=r"min score must be in \[0, 1\] \(the reranker's score"):
        engine.search_many([QUERY], rerank=cross, rerank_backend="torch", min_score=2)
    with pytest.raises(BadInput, match=r"min score must be in \[-0\.5, 1\]"):
        engine.search_many([QUERY], rerank=cross, rerank_backend="torch", rerank_weight=0.5, min_score=-0.75)
    engine.search_many([QUERY], rerank=cross, rerank_backend="torch", rerank_weight=0.5, min_score=-0.5)
    with pytest.raises(BadInput, match=r"min score must be in \[-1, 1\]"):
        engine.search(QUERY, min_score=2)
    for body, scale in [
        ({"min_score": -0.1}, "[0, 1]"),
        ({"min_score": 2, "rerank": False}, "[-1, 1]"),
        ({"min_score": -0.75, "rerank_weight": 0.5}, "[-0.5, 1]"),
    ]:
        bad = client.post("/search", json={"query": QUERY, **body})
        assert bad.status_code == 400 and f"min score must be in {scale}" in bad.json()["error"]
    plain = ["query", str(index), QUERY, "--json"]
    reranked = [*plain, "--rerank", cross, "--rerank-backend", "torch"]
    for asked, score, scale in [
        (plain, "2", "[-1, 1]"),
        (reranked, "2", "[0, 1]"),
        (reranked, "-0.1", "[0, 1]"),
        ([*reranked, "--rerank-weight", "0.5"], "-0.75", "[-0.5, 1]"),
    ]:
        said = CliRunner().invoke(cli, [*asked, "--min-score", score])
        assert said.exit_code == 2, said.output
        errors = [line for line in said.output.splitlines() if line.startswith("Error: ")]
        assert len(errors) == 1, said.output
        assert errors[0].startswith(f"Error: --min-score must be in {scale} ("), errors
        assert errors[0].endswith(f"not {float(score)}") and "Traceback" not in said.output
    for asked, score in [(plain, "-1"), (reranked, "0"), ([*reranked, "--rerank-weight", "0.5"], "-0.5")]:
        said = CliRunner().invoke(cli, [*asked, "--min-score", score])
        assert said.exit_code == 0, said.output
        assert all(hit["answered"] for hit in json.loads(said.output)["hits"])


def test_a_reranker_with_no_activation_takes_any_min_score(index, tmp_path):
    """An identity reranker's score is its raw logit: any number is a threshold on it."""
    raw = random_cross_encoder(tmp_path / "raw", activation="identity", seed=3)
    asked = ["query", str(index), QUERY, "--json", "--rerank", raw, "--rerank-backend", "torch"]
    for score in ("1e6", "-1e6"):
        said = CliRunner().invoke(cli, [*asked, "--min-score", score])
        assert said.exit_code == 0, said.output
        assert {hit["answered"] for hit in json.loads(said.output)["hits"]} == {score == "-1e6"}


def test_grouping_picks_each_groups_best_by_the_reranker(index, reranker, cross):
    engine = SearchEngine(index, rerank=reranker)
    pool = engine.answer(SearchRequest(QUERY, k=12, mode="dense", rerank=RerankOptions(cross, 12)))[0]
    grouped = engine.answer(
        SearchRequest(QUERY, k=3, mode="dense", group_by="category", rerank=RerankOptions(cross, 12))
    )[0]
    best: dict[str, str] = {}
    for hit in pool:  # best first by the reranker
        best.setdefault(hit.fields["category"], hit.id)
    assert [h.id for h in grouped] == list(best.values())[:3]
    assert [h.others for h in grouped] == [CATEGORIES.count(h.fields["category"]) - 1 for h in grouped]


def test_a_rule_fitted_on_the_first_stages_score_is_not_applied_to_the_rerankers(
    index, reranker, monkeypatch
):
    from search.read.confidence import Rule
    from search.read.snapshot import Snapshot

    rule = Rule(("score",), (0.0,), (1.0,), (1.0,), 0.0, 0.5, 0.9, 0.9, 0.5, 10, mode="dense")
    monkeypatch.setattr(Snapshot, "rules", {"dense": rule})
    engine = SearchEngine(index, rerank=reranker)
    reranked = engine.search(QUERY, k=3, mode="dense")
    assert all(h.answered is None for h in reranked)
    assert "reranked" in engine.no_rule_note("dense", rerank=engine.rerank)
    assert all(h.answered is not None for h in engine.search_many([QUERY], k=3, mode="dense", rerank=None)[0])


@pytest.fixture(scope="module")
def client(index, reranker):
    from search.read.loading import load_engine
    from search.server import create_app

    with TestClient(create_app(index, loading=load_engine(index, rerank=reranker))) as client:
        yield client


def test_the_server_reranks_searches_and_keeps_the_first_stages_score(client, cross):
    hits = client.post("/search", json={"query": QUERY, "k": 3, "mode": "dense", "rerank_depth": 6}).json()[
        "hits"
    ]
    first = client.post("/search", json={"query": QUERY, "k": 6, "mode": "dense", "rerank": False}).json()[
        "hits"
    ]
    scores = predicted(cross, QUERY, [h["text"] for h in first])
    assert [h["id"] for h in hits] == [first[i]["id"] for i in np.argsort(-scores, kind="stable")[:3]]
    assert all(h["first_score"] is not None for h in hits)
    assert all(h["first_score"] is None for h in first)
    bad = client.post("/search", json={"query": QUERY, "k": 5, "rerank_depth": 3})
    assert bad.status_code == 400 and "rerank_depth must be at least k (5)" in bad.json()["error"]


def test_v1_rerank_answers_in_cohere_shape(client, cross):
    docs = ["Pay with any card.", {"text": "Park at a station."}, "Refunds take a week."]
    answer = client.post(
        "/v1/rerank", json={"query": QUERY, "documents": docs, "top_n": 2, "return_documents": True}
    ).json()
    texts = [d if isinstance(d, str) else d["text"] for d in docs]
    scores = predicted(cross, QUERY, texts)
    order = np.argsort(-scores, kind="stable")[:2].tolist()
    assert [r["index"] for r in answer["results"]] == order
    assert [r["relevance_score"] for r in answer["results"]] == pytest.approx(
        scores[order].tolist(), abs=1e-4
    )
    assert [r["document"] for r in answer["results"]] == [{"text": texts[i]} for i in order]
    assert answer["usage"]["total_tokens"] > 0 and answer["model"]


def test_tei_rerank_answers_in_its_shape_with_sigmoid_and_raw_scores(client, cross):
    texts = ["Pay with any card.", "Park at a station.", "Refunds take a week."]
    ranks = client.post("/rerank", json={"query": QUERY, "texts": texts, "return_text": True}).json()
    raw = client.post("/rerank", json={"query": QUERY, "texts": texts, "raw_scores": True}).json()
    scores = predicted(cross, QUERY, texts)  # the folder's sigmoid: TEI's own score
    order = np.argsort(-scores, kind="stable").tolist()
    assert [r["index"] for r in ranks] == order and [r["text"] for r in ranks] == [texts[i] for i in order]
    assert [r["score"] for r in ranks] == pytest.approx(scores[order].tolist(), abs=1e-4)
    logits = np.log(scores[order]) - np.log1p(-scores[order])
    assert [r["score"] for r in raw] == pytest.approx(logits.tolist(), abs=1e-3)
    assert "text" not in raw[0]


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/rerank", {"query": QUERY, "documents": []}),
        ("/v1/rerank", {"query": QUERY, "documents": [3]}),
        ("/v1/rerank", {"query": "", "documents": ["a"]}),
        ("/v1/rerank", {"query": QUERY, "documents": ["a"], "top_n": 0}),
        ("/v1/rerank", {"query": QUERY, "documents": [" ".join(QUESTIONS * 10)] * 200}),  # too many tokens
        ("/rerank", {"query": QUERY}),
        ("/rerank", {"query": QUERY, "texts": ["\ud800"]}),
        ("/rerank", {"query": QUERY, "texts": ["a"] * 1001}),
    ],
)
def test_bad_rerank_input_is_a_400_in_one_line(client, path, body):
    sent = json.dumps(body)  # a lone surrogate escaped, as JSON can carry it
    answer = client.post(path, content=sent, headers={"content-type": "application/json"})
    assert answer.status_code == 400, answer.text
    message = answer.json()["error"]
    assert isinstance(message, str) and "\n" not in message and "internal" not in message


def test_a_model_not_served_is_a_404_and_a_server_without_a_reranker_says_so(client, index):
    from search.server import create_app

    other = client.post("/v1/rerank", json={"query": QUERY, "documents": ["a"], "model": "another"})
    assert other.status_code == 404 and "not served here" in other.json()["error"]
    with TestClient(create_app(index)) as bare:
        assert bare.post("/rerank", json={"query": QUERY, "texts": ["a"]}).status_code == 404
        refused = bare.post("/search", json={"query": QUERY, "rerank": True})
        assert refused.status_code == 400 and "serve --rerank" in refused.json()["error"]


@pytest.mark.slow  # the reranker's graph is exported to ONNX once
def test_query_reranks_and_shows_both_scores_and_info_shows_the_default_reranker(tmp_path, tiny_model, cross):
    corpus = write_csv(tmp_path / "faq.csv", [(f"q{i}", t) for i, t in enumerate(QUESTIONS)], ("id", "text"))
    built = CliRunner().invoke(
        cli, ["index", str(corpus), "-o", str(tmp_path / "idx"), "--model", tiny_model, "--rerank", cross]
    )
    assert built.exit_code == 0, built.output
    info = json.loads(CliRunner().invoke(cli, ["info", str(tmp_path / "idx"), "--json"]).output)
    assert info["reranker"]["path"] == cross and info["reranker"]["fingerprint"].startswith("sha256:")
    assert cross in CliRunner().invoke(cli, ["info", str(tmp_path / "idx")]).output
    asked = ["query", str(tmp_path / "idx"), QUERY, "-k", "3", "--mode", "dense"]
    shown = CliRunner().invoke(cli, [*asked, "--json"])
    hits = json.loads(shown.output)["hits"]
    scores = predicted(cross, QUERY, [h["text"] for h in hits])
    assert [h["score"] for h in hits] == pytest.approx(scores.tolist(), abs=1e-4)
    assert all(h["first_score"] is not None for h in hits)
    assert "first stage:" in CliRunner().invoke(cli, asked).output
    plain = json.loads(CliRunner().invoke(cli, [*asked, "--json", "--no-rerank"]).output)["hits"]
    assert all(h["first_score"] is None for h in plain)
    at_0 = json.loads(CliRunner().invoke(cli, [*asked, "--json", "--rerank-weight", "0"]).output)["hits"]
    assert [h["id"] for h in at_0] == [h["id"] for h in plain]
    assert [h["score"] for h in at_0] == pytest.approx([h["score"] for h in plain], abs=1e-4)
    under = CliRunner().invoke(cli, [*asked, "--rerank-depth", "2"])
    assert under.exit_code == 2 and "--rerank-depth must be at least k (3)" in under.output


def test_a_server_of_vectors_alone_answers_the_rerank_apis(tiny_model, reranker):
    from concurrent.futures import Future

    from indexer import Strategy
    from search.read.loading import load_encoding
    from search.server import create_app

    loaded: Future = Future()
    loaded.set_result(reranker)
    app = create_app(None, encoding=load_encoding(Strategy(model=tiny_model)), reranking=loaded)
    with TestClient(app) as alone:
        ranks = alone.post("/rerank", json={"query": QUERY, "texts": ["Pay by card.", "Park here."]}).json()
        assert sorted(r["index"] for r in ranks) == [0, 1]


def test_index_refuses_a_folder_that_is_no_reranker_before_building(tmp_path, tiny_model):
    corpus = write_csv(tmp_path / "faq.csv", [("q1", QUESTIONS[0])], ("id", "text"))
    asked = [
        "index",
        str(corpus),
        "-o",
        str(tmp_path / "idx"),
        "--model",
        tiny_model,
        "--rerank",
        str(tmp_path),
    ]
    refused = CliRunner().invoke(cli, asked)
    assert refused.exit_code == 1 and len(refused.output.strip().splitlines()) == 1, refused.output
    assert not (tmp_path / "idx").exists()


def test_an_index_whose_default_reranker_is_gone_says_so_in_one_line(tmp_path, tiny_model, cross):
    import shutil

    from indexer import Strategy, build_index

    moved = shutil.copytree(cross, tmp_path / "cross")
    corpus = write_csv(tmp_path / "faq.csv", [(f"q{i}", t) for i, t in enumerate(QUESTIONS)], ("id", "text"))
    build_index(corpus, tmp_path / "idx", Strategy(model=tiny_model), reranker=moved)
    shutil.rmtree(moved)
    with pytest.raises(BadInput, match="not on this machine: give --rerank MODEL or --no-rerank"):
        SearchEngine(tmp_path / "idx")
    assert SearchEngine(tmp_path / "idx", rerank=False).search(QUERY, k=1)[0].first_score is None


def test_the_servers_searches_score_their_pairs_on_the_model_thread(client, monkeypatch):
    import threading

    from search.server.batching import Pairs

    threads = []
    real = Pairs.embed_tokens

    def recorded(pairs, ids):
        threads.append(threading.current_thread().name)
        return real(pairs, ids)

    monkeypatch.setattr(Pairs, "embed_tokens", recorded)
    answer = client.post("/search/batch", json={"queries": [QUERY, "bike"], "k": 3})
    assert answer.status_code == 200 and all(
        h["first_score"] is not None for r in answer.json()["results"] for h in r["hits"]
    )
    assert threads and all(name.startswith("semsearch-model") for name in threads)


def pass_threads() -> set[threading.Thread]:
    """The threads ONNX rerankers score their passes on (side by side, one per core)."""
    return {t for t in threading.enumerate() if t.name.startswith("semsearch-pass")}


@pytest.fixture
def two_cores(monkeypatch, tmp_path):
    """An ONNX reranker runs two passes at once whatever this machine's cores (its graph exported
    into a cache of the test's own)."""
    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("indexer.encoders.onnx_graph.usable_cores", lambda: 2)


def test_closing_the_engine_ends_its_rerankers_pass_threads(index, cross, two_cores):
    """The ONNX reranker an engine loads scores a search's passes on threads of its own; closing
    the engine ends them, so a process that opens and closes engines keeps no thread of theirs."""
    before = pass_threads()
    with SearchEngine(index, rerank=RerankOptions(cross, backend="onnx")) as engine:
        hits = engine.search(QUERY, k=4, mode="dense")
        assert hits[0].first_score is not None  # reranked, its passes side by side
        started = pass_threads() - before
        assert started
    assert not [t for t in started if t.is_alive()]


def test_a_reranker_handed_to_the_engine_outlives_it(index, cross, two_cores):
    """A reranker the caller loaded is the caller's to close: its pass threads outlive the engine
    that searched with it, and closing it ends them (it scores on after, alike, on one thread)."""
    from indexer.encoders.rerankers import reranker_for

    reranker = reranker_for(cross, runtime="onnx")
    before = pass_threads()
    with SearchEngine(index, rerank=reranker) as engine:
        assert engine.search(QUERY, k=4, mode="dense")[0].first_score is not None
    started = pass_threads() - before
    assert started
    scores = reranker.score(QUERY, QUESTIONS)
    reranker.close()
    assert not [t for t in started if t.is_alive()]
    np.testing.assert_array_equal(reranker.score(QUERY, QUESTIONS), scores)


def test_a_servers_shutdown_ends_its_engines_rerankers_pass_threads(index, cross, two_cores):
    """The engine a server loads (with its reranker) is closed when the server shuts down: the
    reranker's pass threads end with it."""
    from search.read.loading import load_engine
    from search.server.app import create_app

    before = pass_threads()
    loading = load_engine(index, rerank=RerankOptions(cross, backend="onnx"))
    with TestClient(create_app(index, loading=loading)) as client:
        found = client.post("/search", json={"query": QUERY, "k": 4, "mode": "dense"})
        assert found.status_code == 200 and found.json()["hits"][0]["first_score"] is not None
        started = pass_threads() - before
        assert started
    assert not [t for t in started if t.is_alive()]
