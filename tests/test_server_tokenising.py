"""Where the server tokenises: a request of a few short texts (``batching.few``) is tokenised on
the model thread together with the rest of its batch, in one call of the tokenizer, so the event
loop keeps to the HTTP work; its answer, its token count and its errors are those of a request
tokenised at the door."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from search.read.encoding import Encoding  # noqa: E402
from search.read.engine import SearchEngine  # noqa: E402
from search.server import create_app  # noqa: E402
from tests.batcher_helpers import Gate, client_for  # noqa: E402
from tests.helpers import build_faq  # noqa: E402

TEXTS = ["a red bike", "where is my order", "how do refunds work", "the shop opens at nine", "tea"]


@pytest.fixture
def index(tmp_path, tiny_model, built_once):
    return built_once("faq", lambda folder: build_faq(folder, tiny_model), tmp_path / "idx")


def held_burst(app, gate: Gate, first: str, texts: list[str]) -> list[httpx.Response]:
    """``first`` posted alone and held in the model; ``texts`` posted meanwhile, one a request, so
    they queue and meet in the next batch once the model is let go."""

    async def run() -> list[httpx.Response]:
        async with client_for(app) as client:
            held = asyncio.create_task(client.post("/v1/embeddings", json={"input": first}))
            await gate.wait_entered()
            queued = [asyncio.create_task(client.post("/v1/embeddings", json={"input": t})) for t in texts]
            await asyncio.sleep(0.3)  # every request read and queued behind the held pass
            gate.release.set()
            return await asyncio.wait_for(asyncio.gather(held, *queued), 60)

    return asyncio.run(run())


def recorded_tokenize(monkeypatch) -> list[tuple[str, int]]:
    """Each ``Encoding.tokenize`` call as (its thread's name, how many texts)."""
    calls: list[tuple[str, int]] = []
    original = Encoding.tokenize

    def tokenize(encoding, texts, role="query"):
        calls.append((threading.current_thread().name, len(texts)))
        return original(encoding, texts, role)

    monkeypatch.setattr(Encoding, "tokenize", tokenize)
    return calls


def test_one_text_requests_waiting_together_are_tokenised_in_one_call_on_the_model_thread(index, monkeypatch):
    app = create_app(index)
    gate = Gate(monkeypatch)
    calls = recorded_tokenize(monkeypatch)
    responses = held_burst(app, gate, TEXTS[0], TEXTS[1:])
    assert [r.status_code for r in responses] == [200] * len(TEXTS)
    assert calls[1:] == [("semsearch-model_0", len(TEXTS) - 1)]  # after the held one: one call
    assert calls[0][0].startswith("semsearch-model")
    snapshot = SearchEngine(index).snapshot
    vectors = [r.json()["data"][0]["embedding"] for r in responses]
    np.testing.assert_allclose(np.array(vectors), snapshot.embed(TEXTS), atol=1e-5)
    tokens = [len(ids) for ids in snapshot.encoding.tokenize(TEXTS)]
    assert [r.json()["usage"]["prompt_tokens"] for r in responses] == tokens


def test_a_text_without_tokens_fails_its_own_request_not_the_others_of_its_batch(index, monkeypatch):
    app = create_app(index)
    gate = Gate(monkeypatch)
    responses = held_burst(app, gate, TEXTS[0], [TEXTS[1], "[SEP]", TEXTS[2]])
    assert [r.status_code for r in responses] == [200, 200, 400, 200]
    error = responses[2].json()["error"]
    assert "no tokens the model reads" in error["message"] and "\n" not in error["message"]
    assert error["type"] == "invalid_request_error"
    snapshot = SearchEngine(index).snapshot
    vectors = [responses[i].json()["data"][0]["embedding"] for i in (0, 1, 3)]
    np.testing.assert_allclose(np.array(vectors), snapshot.embed([TEXTS[0], *TEXTS[1:3]]), atol=1e-5)
