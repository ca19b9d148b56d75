"""Vectors over HTTP: ``/v1/embeddings`` (OpenAI's shape, read by the ``openai`` client against a
real server) and ``/encode`` give the index's own query vectors (or, served with no index, a
strategy's), through the micro-batcher and its bounds; bad input is a 400 ``Error``."""

from __future__ import annotations

import asyncio
import base64
import functools
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from indexer.embedding.strategy import Strategy  # noqa: E402
from indexer.errors import BadInput  # noqa: E402
from search.read.encoding import encode  # noqa: E402
from search.read.engine import SearchEngine  # noqa: E402
from search.read.loading import load_encoding  # noqa: E402
from search.server import create_app  # noqa: E402
from search.server.schema import MAX_INPUTS, MAX_TEXT  # noqa: E402
from tests.helpers import assert_clean_failure, build_faq, run, serving  # noqa: E402

TEXTS = ["How do I pay for a ride?", "a bike", "Where can I park the bike near the station?"]


@pytest.fixture
def whitened(tmp_path, tiny_model, built_once):
    build = functools.partial(build_faq, model=tiny_model, postprocess="whiten", whiten_dims=3)
    return built_once("faq whitened", build, tmp_path / "idx")


def _floats(answer: dict) -> np.ndarray:
    return np.array([item["embedding"] for item in answer["data"]], dtype=np.float32)


def test_embeddings_and_encode_give_the_index_query_vectors(whitened):
    expected = SearchEngine(whitened).snapshot.embed(TEXTS)
    with TestClient(create_app(whitened)) as client:
        named = {"input": TEXTS, "model": whitened_model(whitened)}
        answer = client.post("/v1/embeddings", json=named).json()
        assert answer["object"] == "list" and answer["model"] == SearchEngine(whitened).strategy.model
        assert [(d["object"], d["index"]) for d in answer["data"]] == [("embedding", i) for i in range(3)]
        assert answer["usage"]["prompt_tokens"] == answer["usage"]["total_tokens"] > len(TEXTS)
        np.testing.assert_allclose(_floats(answer), expected, atol=1e-5)

        packed = client.post("/v1/embeddings", json={"input": TEXTS[0], "encoding_format": "base64"}).json()
        unpacked = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype="<f4")
        np.testing.assert_allclose(unpacked, expected[0], atol=1e-5)

        vectors = client.post("/encode", json={"texts": TEXTS}).json()["vectors"]
        np.testing.assert_allclose(np.array(vectors), expected, atol=1e-5)
        # the search answers the same vectors: the top hit of an entry's own text is that entry
        assert client.post("/search", json={"query": TEXTS[0], "k": 1}).json()["hits"][0]["id"] == "a1"


def whitened_model(index) -> str:
    return SearchEngine(index).strategy.model


def test_embeddings_answer_the_served_model_by_name_path_or_alias_and_404_any_other(whitened):
    model = whitened_model(whitened)
    names = [{"model": model}, {"model": str(Path(model).resolve())}, {"model": Path(model).name}, {}]
    with TestClient(create_app(whitened)) as client:
        for name in names:
            answer = client.post("/v1/embeddings", json={"input": "a bike", **name})
            assert answer.status_code == 200, (name, answer.text[:200])
            assert answer.json()["model"] == model
        others = ("text-embedding-3-small", "m", f"{model}x", "sentence-transformers/all-MiniLM-L6-v2", "")
        for other in others:
            answer = client.post("/v1/embeddings", json={"input": "a bike", "model": other})
            assert answer.status_code == 404, (other, answer.text[:200])
            error = answer.json()["error"]  # OpenAI's shape and code
            assert error["code"] == "model_not_found" and error["type"] == "invalid_request_error"
            assert other in error["message"] and Path(model).name in error["message"]


def test_the_bundled_model_answers_to_its_hub_name():
    from search.server.names import served_names

    assert {"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"} <= served_names("all-MiniLM-L6-v2")
    assert "other/all-MiniLM-L6-v2" not in served_names("all-MiniLM-L6-v2")


def test_bad_encode_requests_are_400(whitened):
    bad = [
        {"input": []},
        {"input": ["x"] * (MAX_INPUTS + 1)},
        {"input": ["x"] * 100_000},
        {"input": ["fine", 3]},
        {"input": [[101, 2023], [101]]},  # token ids
        {"input": [7, 8, 9]},
        {"input": "x" * (MAX_TEXT + 1)},
        {"input": ""},
        {"input": ["fine", "   "]},
        {"input": "x", "encoding_format": "int8"},
        {"input": "x", "dimensions": 7},
        {"input": ["word " * 100] * 200},  # 200 x 102 tokens: past the request's token budget
        {"model": "no input"},
    ]
    with TestClient(create_app(whitened)) as client:
        for body in bad:
            response = client.post("/v1/embeddings", json=body)
            assert response.status_code == 400, (str(body)[:80], response.text[:200])
            error = response.json()["error"]  # OpenAI's shape: its clients show the message
            assert error["type"] == "invalid_request_error" and "\n" not in error["message"]
        for body in [{"texts": []}, {"texts": "one string"}, {"texts": [None]}, {"texts": ["ok", ""]}]:
            response = client.post("/encode", json=body)
            assert response.status_code == 400, (body, response.text)
            assert isinstance(response.json()["error"], str)
        schema = client.get("/openapi.json").json()["paths"]
        assert set(schema["/v1/embeddings"]["post"]["responses"]) == {"200", "400", "404", "413", "503"}


def test_concurrent_requests_share_batches(whitened):
    app = create_app(whitened)

    async def burst() -> tuple[list[np.ndarray], int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            responses = await asyncio.gather(
                *[client.post("/v1/embeddings", json={"input": [f"text {i}"]}) for i in range(24)]
            )
            info = (await client.get("/info")).json()
        return [_floats(r.json())[0] for r in responses], info["largest_batch"]

    vectors, largest = asyncio.run(burst())
    assert largest > 1
    expected = SearchEngine(whitened).snapshot.embed([f"text {i}" for i in range(24)])
    np.testing.assert_allclose(np.array(vectors), expected, atol=1e-5)


def test_served_without_an_index_it_encodes_a_strategy(tiny_model):
    strategy = Strategy(model=tiny_model, pooling="cls", layers=(-1,))
    with TestClient(create_app(None, encoding=load_encoding(strategy))) as client:
        info = client.get("/info").json()
        assert info["strategy"]["pooling"] == "cls" and info["index"] is None
        assert info["dimension"] == 32 and "pooling=cls" in info["description"]
        answer = client.post("/v1/embeddings", json={"input": TEXTS, "model": tiny_model}).json()
        np.testing.assert_allclose(_floats(answer), encode(TEXTS, strategy), atol=1e-5)
        assert client.post("/search", json={"query": "x"}).status_code == 404
        assert client.get("/health").json() == {"status": "ok"}
    with pytest.raises(BadInput, match="post-processing"):
        create_app(None, encoding=load_encoding(Strategy(model=tiny_model, postprocess="whiten")))


@pytest.mark.slow
def test_openai_client_against_a_real_server_equals_encode_and_the_index(tmp_path):
    """``semsearch serve --model ...`` (no index) read by the ``openai`` client, floats and base64
    (its default): the vectors of ``semsearch encode`` and the query vectors of an index of the
    same strategy, to 1e-5; its bad inputs come back as the client's BadRequestError, the reason in
its message."""
    openai = pytest.importorskip("openai")
    from indexer.embedding.strategy import DEFAULT_MODEL

    index = build_faq(tmp_path, DEFAULT_MODEL)
    expected = SearchEngine(index).snapshot.embed(TEXTS)
    cli = run("encode", "--model", DEFAULT_MODEL, stdin="\n".join(TEXTS))
    assert cli.returncode == 0, cli.stderr
    np.testing.assert_allclose(
        [json.loads(line)["vector"] for line in cli.stdout.splitlines()], expected, atol=1e-5
    )
    with serving(None, "--model", DEFAULT_MODEL) as port:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        for encoding_format in ("float", openai.NOT_GIVEN):  # not given: base64, decoded by the client
            answer = client.embeddings.create(
                model=DEFAULT_MODEL, input=TEXTS, encoding_format=encoding_format
            )
            np.testing.assert_allclose([d.embedding for d in answer.data], expected, atol=1e-5)
        packed = client.embeddings.create(model=DEFAULT_MODEL, input=TEXTS, encoding_format="base64")
        unpacked = [np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in packed.data]
        np.testing.assert_allclose(unpacked, expected, atol=1e-5)
        single = client.embeddings.create(model=DEFAULT_MODEL, input=TEXTS[1])
        np.testing.assert_allclose(single.data[0].embedding, expected[1], atol=1e-5)
        assert answer.usage.prompt_tokens > 0
        for bad, reason in (([], "input: "), ([""], "input.0: "), (["x"] * 100_000, "input: ")):
            with pytest.raises(openai.BadRequestError, match=f"Error code: 400 - {reason}"):
                client.embeddings.create(model=DEFAULT_MODEL, input=bad)
        with pytest.raises(openai.APIStatusError, match="Error code: 413 - request body over") as raised:
            client.embeddings.create(model=DEFAULT_MODEL, input=["x " * 9000] * 100)
        assert raised.value.status_code == 413 and raised.value.type == "invalid_request_error"
        info = httpx.get(f"http://127.0.0.1:{port}/info").json()
        assert info["description"] == SearchEngine(index).strategy.describe()


@pytest.mark.slow
def test_serve_without_an_index_needs_a_strategy_and_an_index_keeps_its_own(whitened, tiny_model):
    assert_clean_failure(run("serve"), "give INDEX_DIR to search it, or --model")
    assert_clean_failure(run("serve", whitened, "--pooling", "cls"), "drop the strategy options")
    assert_clean_failure(run("serve", "--model", tiny_model, "--postprocess", "whiten"), "post-processing")
