"""The rerank routes as their clients call them: ``/v2/rerank`` in Cohere v2's shape (what
``cohere.ClientV2`` sends and parses) beside ``/v1/rerank``, both read by the real ``cohere``
clients in process; and the names a server gives its models (``serve --served-model-name``), in
``/v1/models``, the answers' ``model``, ``/info``, and the 404 a request naming another gets."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from click.testing import CliRunner  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from indexer.embedding.strategy import Strategy  # noqa: E402
from search.cli import cli  # noqa: E402
from search.read.loading import load_encoding  # noqa: E402
from search.server import create_app  # noqa: E402
from search.server.names import ServedNames  # noqa: E402
from tests.helpers import build_faq, random_cross_encoder, serving  # noqa: E402

QUERY = "how do I pay with a card"
DOCS = ["Pay with any card.", "Park at a station.", "Refunds take a week.", "Cards are taken at the kiosk."]


@pytest.fixture(scope="module")
def cross(tmp_path_factory) -> str:
    return random_cross_encoder(tmp_path_factory.mktemp("cross"), seed=3)


@pytest.fixture(scope="module")
def loaded(cross) -> Future:
    from indexer.encoders.rerankers import reranker_for

    done: Future = Future()
    done.set_result(reranker_for(cross, runtime="torch"))
    return done


def alone(tiny_model: str, loaded: Future, names: ServedNames | None = None) -> TestClient:
    """A server of vectors alone (the tiny model) with the reranker, named ``names``."""
    encoding = load_encoding(Strategy(model=tiny_model))
    return TestClient(create_app(None, encoding=encoding, reranking=loaded, names=names or ServedNames()))


@pytest.fixture(scope="module")
def client(tiny_model, loaded):
    with alone(tiny_model, loaded) as client:
        yield client


def test_v2_rerank_answers_in_cohere_v2_shape_with_v1s_ranking(client, cross):
    v1 = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS, "top_n": 3}).json()
    body = {
        "model": Path(cross).name,
        "query": QUERY,
        "documents": DOCS,
        "top_n": 3,
        "max_tokens_per_doc": 512,
    }
    v2 = client.post("/v2/rerank", json=body)
    assert v2.status_code == 200, v2.text
    answer = v2.json()
    assert set(answer) == {"id", "results", "meta"} and isinstance(answer["id"], str) and answer["id"]
    assert answer["results"] == [
        {"index": r["index"], "relevance_score": r["relevance_score"]} for r in v1["results"]
    ]
    meta = answer["meta"]
    assert meta["api_version"] == {"version": "2"} and meta["billed_units"] == {"search_units": 1}
    assert meta["tokens"] == {"input_tokens": v1["usage"]["total_tokens"], "output_tokens": 0}
    again = client.post("/v2/rerank", json={"query": QUERY, "documents": DOCS}).json()
    assert len(again["results"]) == len(DOCS) and again["id"] != answer["id"]


def test_v2_rerank_scores_each_document_cut_to_max_tokens_per_doc(client, cross):
    """Cohere v2's ``max_tokens_per_doc``: each document is scored as its first so many tokens of
    the reranker's tokenizer (cut in the text, at the tokens' offsets as transformers gives
    them); a shorter document as it is."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(cross)
    docs = [*DOCS, "pay"]
    cut = []
    for doc in docs:
        ends = [
            end
            for _, end in tokenizer(doc, add_special_tokens=False, return_offsets_mapping=True)[
                "offset_mapping"
            ]
        ]
        cut.append(doc[: ends[2]] if len(ends) > 3 else doc)
    assert cut[0] != docs[0] and cut[-1] == docs[-1]
    v1 = client.post("/v1/rerank", json={"query": QUERY, "documents": cut}).json()
    v2 = client.post("/v2/rerank", json={"query": QUERY, "documents": docs, "max_tokens_per_doc": 3}).json()
    assert v2["results"] == [
        {"index": r["index"], "relevance_score": r["relevance_score"]} for r in v1["results"]
    ]
    assert v2["meta"]["tokens"]["input_tokens"] == v1["usage"]["total_tokens"]
    whole = client.post(
        "/v2/rerank", json={"query": QUERY, "documents": docs, "max_tokens_per_doc": 4096}
    ).json()
    assert whole["results"] != v2["results"]


@pytest.mark.parametrize(
    "body",
    [
        {"query": QUERY, "documents": [{"text": "objects are v1's"}]},
        {"query": QUERY, "documents": []},
        {"query": QUERY, "documents": ["a"] * 1001},
        {"query": "", "documents": ["a"]},
        {"query": QUERY, "documents": ["a"], "top_n": 0},
        {"query": QUERY, "documents": ["a"], "max_tokens_per_doc": 0},
        {"query": QUERY, "documents": [" ".join(DOCS * 40)] * 200},  # past the request's token budget
        {"documents": ["a"]},
    ],
)
def test_bad_v2_rerank_input_is_a_400_in_one_line(client, body):
    answer = client.post("/v2/rerank", json=body)
    assert answer.status_code == 400, answer.text
    message = answer.json()["error"]
    assert isinstance(message, str) and "\n" not in message and "internal" not in message


RERANKED = {
    "/v1/rerank": ("query", "documents"),
    "/v2/rerank": ("query", "documents"),
    "/rerank": ("query", "texts"),
}


@pytest.mark.parametrize("path", RERANKED)
def test_blank_text_to_rerank_is_a_400_as_it_is_to_search(client, path):
    """A blank query or document (spaces, zero-width characters alone) is refused as /search and
    /v1/embeddings refuse one, by the same check."""
    query, documents = RERANKED[path]
    bodies = [
        body
        for blank in ("   ", "\u200b")
        for body in ({query: blank, documents: DOCS}, {query: QUERY, documents: [DOCS[0], blank]})
    ]
    if path == "/v1/rerank":
        bodies.append({query: QUERY, documents: [DOCS[0], {"text": " \t"}]})
    for body in bodies:
        answer = client.post(path, json=body)
        assert answer.status_code == 400 and "empty" in answer.json()["error"], (body, answer.text)


def test_an_empty_model_name_is_not_the_served_one(client):
    """A request may leave ``model`` out; ``"model": ""`` names no model served here: a 404."""
    for path in ("/v1/rerank", "/v2/rerank"):
        answer = client.post(path, json={"model": "", "query": QUERY, "documents": DOCS})
        assert answer.status_code == 404 and "is not served here" in answer.json()["error"], answer.text
        assert client.post(path, json={"query": QUERY, "documents": DOCS}).status_code == 200
    answer = client.post("/v1/embeddings", json={"model": "", "input": ["a"]})
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "model_not_found", answer.text


@pytest.mark.parametrize("document", ["", 7, {"text": ""}, {"words": "a"}, {"text": 5}])
def test_a_bad_v1_document_is_one_plain_line(client, document):
    """A document that is neither a string nor ``{"text": ...}`` of text is a 400 naming its place
    in plain words, not the validator's internals."""
    answer = client.post("/v1/rerank", json={"query": QUERY, "documents": ["a", document]})
    assert answer.status_code == 400, answer.text
    message = answer.json()["error"]
    assert message.startswith("documents.1") and ";" not in message, message
    assert not any(leak in message for leak in ("function", "constrained", "RerankDocument", "[")), message


def test_v2_rerank_of_a_model_not_served_or_on_a_server_without_a_reranker_is_a_404(client, tiny_model):
    other = client.post("/v2/rerank", json={"model": "rerank-v3.5", "query": QUERY, "documents": ["a"]})
    assert other.status_code == 404 and "'rerank-v3.5' is not served here" in other.json()["error"]
    with TestClient(create_app(None, encoding=load_encoding(Strategy(model=tiny_model)))) as bare:
        refused = bare.post("/v2/rerank", json={"query": QUERY, "documents": ["a"]})
        assert refused.status_code == 404 and "serve --rerank" in refused.json()["error"]


@pytest.mark.filterwarnings("ignore:You should not use the .timeout. argument")  # the client always sets one
def test_the_cohere_clients_reach_their_routes(client, cross):
    """``cohere.ClientV2`` posts to /v2/rerank and ``cohere.Client`` to /v1/rerank; both parse
    the answers into the ranking the server gave (the test client is their HTTP client)."""
    cohere = pytest.importorskip("cohere")
    v1 = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS, "top_n": 2}).json()
    expected = [(r["index"], pytest.approx(r["relevance_score"])) for r in v1["results"]]
    base = str(client.base_url)
    v2 = cohere.ClientV2(api_key="unused", base_url=base, httpx_client=client)
    ranked = v2.rerank(model=Path(cross).name, query=QUERY, documents=DOCS, top_n=2)
    assert [(r.index, r.relevance_score) for r in ranked.results] == expected
    assert ranked.id and ranked.meta.billed_units.search_units == 1
    old = cohere.Client(api_key="unused", base_url=base, httpx_client=client)
    shown = old.rerank(query=QUERY, documents=DOCS, top_n=2, return_documents=True)
    assert [(r.index, r.relevance_score) for r in shown.results] == expected
    assert [r.document.text for r in shown.results] == [DOCS[i] for i, _ in expected]
    with pytest.raises(cohere.errors.NotFoundError):
        v2.rerank(model="rerank-v3.5", query=QUERY, documents=DOCS)


def test_served_names_are_what_the_server_answers_to_and_answers_with(tiny_model, loaded, cross):
    names = ServedNames(model="my-embedder", reranker="my-reranker")
    with alone(tiny_model, loaded, names) as named:
        listed = named.get("/v1/models").json()
        assert listed["object"] == "list"
        assert [(m["id"], m["object"]) for m in listed["data"]] == [
            ("my-embedder", "model"),
            ("my-reranker", "model"),
        ]
        for asked in ({"model": "my-embedder"}, {}):
            answer = named.post("/v1/embeddings", json={"input": "a bike", **asked})
            assert answer.status_code == 200 and answer.json()["model"] == "my-embedder", answer.text
        for other in (tiny_model, Path(tiny_model).name, "text-embedding-3-small", ""):
            answer = named.post("/v1/embeddings", json={"input": "a bike", "model": other})
            assert answer.status_code == 404, answer.text
            error = answer.json()["error"]
            assert error["code"] == "model_not_found" and "'my-embedder'" in error["message"]
        ranked = named.post("/v1/rerank", json={"model": "my-reranker", "query": QUERY, "documents": DOCS})
        assert ranked.status_code == 200 and ranked.json()["model"] == "my-reranker"
        assert named.post(
            "/v2/rerank", json={"model": "my-reranker", "query": QUERY, "documents": DOCS}
        ).is_success
        refused = named.post(
            "/v1/rerank", json={"model": Path(cross).name, "query": QUERY, "documents": DOCS}
        )
        assert refused.status_code == 404 and "'my-reranker'" in refused.json()["error"]
        info = named.get("/info").json()
        assert (info["served_model_name"], info["served_reranker_name"]) == ("my-embedder", "my-reranker")


def test_unnamed_models_are_listed_by_what_they_answer_to(tiny_model, loaded, cross):
    with alone(tiny_model, loaded) as unnamed:
        listed = [m["id"] for m in unnamed.get("/v1/models").json()["data"]]
        model = unnamed.post("/v1/embeddings", json={"input": "a bike"}).json()["model"]
        assert listed == [model, Path(cross).name] and model == tiny_model
        info = unnamed.get("/info").json()
        assert (info["served_model_name"], info["served_reranker_name"]) == (model, Path(cross).name)


def test_an_index_server_names_its_model(tmp_path, tiny_model):
    index = build_faq(tmp_path, tiny_model)
    with TestClient(create_app(index, names=ServedNames(model="faq-embedder"))) as client:
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["faq-embedder"]
        answer = client.post("/v1/embeddings", json={"input": "a bike", "model": "faq-embedder"})
        assert answer.json()["model"] == "faq-embedder"
        info = client.get("/info").json()
        assert info["served_model_name"] == "faq-embedder" and info["served_reranker_name"] is None


def test_serve_refuses_an_empty_served_name():
    for option in ("--served-model-name", "--served-reranker-name"):
        refused = CliRunner().invoke(cli, ["serve", "--model", "m", option, " "])
        assert refused.exit_code == 2 and "must not be empty" in refused.output, refused.output


@pytest.mark.slow
def test_serve_names_its_models_on_the_wire(tiny_model, cross):
    options = ("--model", tiny_model, "--rerank", cross)
    names = ("--served-model-name", "pedalo-embed", "--served-reranker-name", "pedalo-rerank")
    with serving(None, *options, *names) as port:
        listed = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()
        assert [m["id"] for m in listed["data"]] == ["pedalo-embed", "pedalo-rerank"]
