"""The micro-batcher under cancellation and reloads: it outlives any one request, and a request
embeds with the embedder of the version it started on."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from indexer.embedding.batching import Batching  # noqa: E402
from indexer.embedding.strategy import Strategy  # noqa: E402
from indexer.encoders.options import EmbeddingOptions  # noqa: E402
from search.read.encoding import Encoding  # noqa: E402
from search.server import create_app  # noqa: E402
from search.server.batching import MicroBatcher  # noqa: E402
from tests.batcher_helpers import Gate, client_for  # noqa: E402
from tests.helpers import ROWS, build_faq  # noqa: E402


def test_batcher_survives_a_cancelled_request(tmp_path, tiny_model, monkeypatch):
    app = create_app(build_faq(tmp_path, tiny_model))
    gate = Gate(monkeypatch)

    async def run() -> int:
        async with client_for(app) as client:
            first = asyncio.create_task(client.post("/search", json={"query": ROWS[0][1]}))
            await gate.wait_entered()
            first.cancel()  # the client gives up while its query is being embedded
            await asyncio.gather(first, return_exceptions=True)
            gate.release.set()
            response = await asyncio.wait_for(client.post("/search", json={"query": ROWS[1][1]}), 60)
            return response.status_code

    assert asyncio.run(run()) == 200


def test_request_in_flight_during_a_reload_sees_one_version(tmp_path, tiny_model, monkeypatch):
    index = build_faq(tmp_path, tiny_model)
    app = create_app(index)
    gate = Gate(monkeypatch)
    second_queued = asyncio.Event()
    queue = MicroBatcher.run

    async def queued(batcher: MicroBatcher, encoding, texts, after, roles="query", waits=False):
        """The batcher is handed a request's texts once it holds its snapshot."""
        if texts == [ROWS[1][1]]:
            second_queued.set()
        return await queue(batcher, encoding, texts, after, roles, waits)

    monkeypatch.setattr(MicroBatcher, "run", queued)

    async def run() -> list[int]:
        async with client_for(app) as client:
            first = asyncio.create_task(client.post("/search", json={"query": ROWS[0][1]}))
            await gate.wait_entered()  # the worker is busy: the next query waits in the queue
            second = asyncio.create_task(client.post("/search", json={"query": ROWS[1][1]}))
            await asyncio.wait_for(second_queued.wait(), 60)  # queued on the old version
            # the new version has another strategy and dimension (two layers concatenated)
            await asyncio.to_thread(build_faq, tmp_path, tiny_model, layers=(-1, -2), combine="concat")
            assert (await client.post("/reload")).json()["reloads"] == 1
            gate.release.set()
            responses = await asyncio.gather(first, second)
            third = await client.post("/search", json={"query": ROWS[2][1], "k": 1})
            dimension = (await client.get("/info")).json()["dimension"]
            return [r.status_code for r in [*responses, third]] + [dimension]

    assert asyncio.run(run()) == [200, 200, 200, 64]


def test_a_request_an_update_commits_under_is_answered_on_the_new_generation(
    tmp_path, tiny_model, monkeypatch
):
    """The server's search runs the engine's pipeline: a lookup that finds its snapshot moved
    (an add committed while its query was embedded) is redone on the reloaded index, never
    answered with one generation's vectors and another's rows."""
    from indexer.writing.update import add_to_index
    from tests.helpers import write_csv

    index = build_faq(tmp_path, tiny_model)
    app = create_app(index, reload_every=3600)
    gate = Gate(monkeypatch)
    question = "Which bikes can I rent for a whole week?"

    async def run() -> tuple[int, list[str], int]:
        async with client_for(app) as client:
            asked = asyncio.create_task(client.post("/search", json={"query": question, "k": 2}))
            await gate.wait_entered()
            change = write_csv(tmp_path / "change.csv", [("a5", question, "stations")])
            await asyncio.to_thread(add_to_index, index, change, id_field="id")
            gate.release.set()
            response = await asyncio.wait_for(asked, 60)
            reloads = (await client.get("/info")).json()["reloads"]
            return response.status_code, [hit["id"] for hit in response.json()["hits"]], reloads

    status, ids, reloads = asyncio.run(run())
    assert status == 200 and ids[0] == "a5" and reloads == 1


def stub_embedder(batching: Batching) -> SimpleNamespace:
    """What the batcher reads of an encoder: its batching rule and its tokenizer's max_length."""
    tokens = SimpleNamespace(max_length=128)
    return SimpleNamespace(decision=SimpleNamespace(batching=batching), tokens=tokens)


class Recorder:
    """A stand-in encoding that records each pass; a pass that starts with "hold" waits for
    ``gate``. A text's tokens are its characters (so a pass's texts can be read back)."""

    strategy = Strategy(max_length=128)
    embedder = stub_embedder(Batching(32, 32 * 1024))
    embeds = True  # ``Encoding.embeds``: it runs its model

    def __init__(self, name: str, calls: list, gate: threading.Event):
        self.name, self.calls, self.gate = name, calls, gate

    def tokenize(self, texts, role="query"):
        return [[ord(c) for c in text] for text in texts]

    def embed_tokens(self, ids):
        texts = ["".join(map(chr, text)) for text in ids]
        self.calls.append((self.name, texts))
        if texts[0] == "hold":
            self.gate.wait(60)
        return np.zeros((len(texts), 1), dtype=np.float32)


def test_batcher_drops_work_nobody_waits_for_and_keeps_embedders_apart():
    calls: list = []
    gate = threading.Event()
    a, b = Recorder("a", calls, gate), Recorder("b", calls, gate)
    batcher = MicroBatcher(64)

    async def run() -> None:
        hold = asyncio.ensure_future(batcher.embed(a, ["hold"]))
        while not calls:  # the worker is busy with "hold": the next three wait in the queue
            await asyncio.sleep(0.01)
        gone = asyncio.ensure_future(batcher.embed(a, ["gone"]))
        kept_a = asyncio.ensure_future(batcher.embed(a, ["a1"]))
        kept_b = asyncio.ensure_future(batcher.embed(b, ["b1"]))
        await asyncio.sleep(0)
        gone.cancel()
        gate.set()
        await asyncio.gather(hold, kept_a, kept_b)

    asyncio.run(run())
    assert calls == [("a", ["hold"]), ("a", ["a1"]), ("b", ["b1"])]
    assert batcher.dropped == 1


def test_batcher_restarts_a_worker_that_ended():
    calls: list = []
    embedder = Recorder("a", calls, threading.Event())
    batcher = MicroBatcher(64)

    async def run() -> None:
        await batcher.embed(embedder, ["first"])
        batcher.task.cancel()
        await asyncio.gather(batcher.task, return_exceptions=True)
        await asyncio.wait_for(batcher.embed(embedder, ["second"]), 60)

    asyncio.run(run())
    assert calls == [("a", ["first"]), ("a", ["second"])]


def test_long_requests_take_turns_and_stop_when_cancelled():
    calls: list = []
    gate = threading.Event()
    embedder = Recorder("a", calls, gate)
    batcher = MicroBatcher(64)
    long = [str(i % 10) * 128 for i in range(64)]  # 64 x 128 tokens: two parts of 4096

    async def run() -> None:
        hold = asyncio.ensure_future(batcher.embed(embedder, ["hold"]))
        while not calls:
            await asyncio.sleep(0.01)
        big = asyncio.ensure_future(batcher.embed(embedder, long))
        small = asyncio.ensure_future(batcher.embed(embedder, ["small"]))
        await asyncio.sleep(0)
        gate.set()
        assert len(await big) == 64
        await asyncio.gather(hold, small)
        # a request cancelled while its first part is embedded never queues the second
        gate.clear()
        gone = asyncio.ensure_future(batcher.embed(embedder, ["hold", *long[1:]]))
        while len(calls) < 4:
            await asyncio.sleep(0.01)
        gone.cancel()
        gate.set()
        await batcher.embed(embedder, ["after"])

    asyncio.run(run())
    assert (
        [texts for _, texts in calls]
        == [  # a batch goes to the encoder whole: its passes are the encoder's (by token counts)
            ["hold"],
            [*long[:32], "small"],
            long[32:],
            ["hold", *long[1:32]],
            ["after"],
        ]
    )


def test_a_batch_costs_one_hop_for_its_lookups_not_one_per_request(tmp_path, tiny_model, monkeypatch):
    """The hops off the event loop are what batching saves: a batch's lookups (FAISS, SQLite) run
    together on the lookup thread, not one thread-pool hop per request."""
    import search.read.engine
    import search.server.batching

    app = create_app(build_faq(tmp_path, tiny_model), reload_every=3600)
    hops: list[str] = []
    lookups: list[str] = []
    to_thread = asyncio.to_thread
    lookup = search.read.engine.Snapshot.run

    async def counted(function, *args, **kwargs):
        hops.append(getattr(function, "__name__", "?"))
        return await to_thread(function, *args, **kwargs)

    def recorded(self, *args, **kwargs):
        lookups.append(threading.current_thread().name)
        return lookup(self, *args, **kwargs)

    monkeypatch.setattr(search.server.batching.asyncio, "to_thread", counted)
    monkeypatch.setattr(search.read.engine.Snapshot, "run", recorded)

    async def burst() -> list[int]:
        async with client_for(app) as client:
            responses = await asyncio.gather(
                *[client.post("/search", json={"query": f"question {i}", "k": 2}) for i in range(24)]
            )
        return [r.status_code for r in responses]

    assert asyncio.run(burst()) == [200] * 24
    assert hops == []
    assert len(lookups) == 24 and {name.split("_")[0] for name in lookups} == {"semsearch-lookup"}


def test_a_batch_takes_what_waits_up_to_the_encoders_token_budget():
    """Jobs join a batch while its rows stay within ``max_batch`` and its tokens within the
    encoder's budget; the job that would pass it starts the next batch, in queue order."""
    calls: list = []
    gate = threading.Event()
    embedder = Recorder("a", calls, gate)
    embedder.embedder = stub_embedder(Batching(32, 100))
    batcher = MicroBatcher(64)
    texts = ["x" * 40, "y" * 40, "z" * 40, "w" * 10]

    async def run() -> None:
        hold = asyncio.ensure_future(batcher.embed(embedder, ["hold"]))
        while not calls:
            await asyncio.sleep(0.01)
        waiting = [asyncio.ensure_future(batcher.embed(embedder, [text])) for text in texts]
        await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(hold, *waiting)

    asyncio.run(run())
    assert [texts for _, texts in calls] == [["hold"], ["x" * 40, "y" * 40], ["z" * 40, "w" * 10]]


def test_a_request_is_bounded_by_the_tokens_the_model_reads(tmp_path, tiny_model):
    """The budget counts real tokens (prefix and special tokens included), not characters: long
    words cost what the tokenizer makes of them."""
    from search.server.batching import MAX_REQUEST_TOKENS

    app = create_app(build_faq(tmp_path, tiny_model))
    encoding = Encoding.load(Strategy(model=tiny_model))
    fits = ["bike " * 100] * 150  # 500 characters, ~102 tokens each: 15,300 tokens
    assert sum(map(len, encoding.tokenize(fits))) <= MAX_REQUEST_TOKENS < sum(map(len, fits))
    over = ["bike " * 100] * 170

    async def run() -> list:
        async with client_for(app) as client:
            answers = [await client.post("/encode", json={"texts": texts}) for texts in (fits, over)]
        return [(a.status_code, a.json()) for a in answers]

    (ok, vectors), (refused, error) = asyncio.run(run())
    assert ok == 200 and len(vectors["vectors"]) == 150
    assert refused == 400 and f"at most {MAX_REQUEST_TOKENS}" in error["error"]
    assert f"{sum(map(len, encoding.tokenize(over)))} tokens" in error["error"]


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_token_ids_embed_as_their_texts_through_each_runtime_s_own_loop(tiny_model, backend, monkeypatch):
    """What the server hands the model (token ids) gives ``embed``'s vectors; on torch it goes
    through the device loop (a GPU's), not the CPU's ONNX-shaped loop."""
    import indexer.encoders.torch_encoder as torch_encoder

    on_cpu = EmbeddingOptions(device="cpu")
    encoding = Encoding.load(Strategy(model=tiny_model, backend=backend), options=on_cpu)
    texts = ["How do I pay for a ride?", "a bike", "Where can I park the bike near the station?"]
    passes = []
    loop = torch_encoder.embed
    monkeypatch.setattr(torch_encoder, "embed", lambda *a, **k: passes.append(1) or loop(*a, **k))
    vectors = encoding.embed_tokens(encoding.tokenize(texts, "passage"))
    assert bool(passes) == (backend == "torch")
    np.testing.assert_allclose(vectors, encoding.embed(texts, role="passage"), atol=1e-5)


def test_lookups_search_faiss_with_the_one_thread_the_server_configures():
    """``configure_threads`` gives FAISS one OpenMP thread; OpenMP counts its threads per calling
    thread, so the lookup thread that searches must hold the setting too (else each search wakes
    a second OpenMP thread that spins on the cores the model needs)."""
    import faiss

    from search.read.engine import configure_threads

    configure_threads()
    batcher = MicroBatcher(64)
    embedder = Recorder("a", [], threading.Event())
    threads = asyncio.run(batcher.run(embedder, ["q"], lambda vectors: faiss.omp_get_max_threads()))
    assert faiss.omp_get_max_threads() == 1 and threads == 1


def test_concurrent_reranked_searches_meet_in_one_batch_of_the_reranker(tmp_path, tiny_model, monkeypatch):
    """A reranked search's lookup waits for its pairs on a thread of its own: while one search's
    pairs are scored, the others' first stages run and their pairs queue, so the next pass of the
    reranker holds pairs of several searches (on one lookup thread each search's pairs went alone)."""
    from search.read.loading import load_engine
    from search.server.batching import Batched, Pairs
    from tests.helpers import random_cross_encoder

    index = build_faq(tmp_path, tiny_model)
    cross = random_cross_encoder(tmp_path / "cross", seed=3)
    app = create_app(index, reload_every=3600, loading=load_engine(index, None, cross))
    searches, depth = 6, len(ROWS)  # every entry a candidate
    handed = threading.Semaphore(0)  # one release per search whose lookup hands its pairs over
    passes: list[int] = []
    score_pairs, embed_tokens = Batched.score_pairs, Pairs.embed_tokens

    def counted(self, pairs):
        handed.release()
        return score_pairs(self, pairs)

    def held(self, ids):
        """The first pass waits until every other search's pairs are queued behind it."""
        if not passes:
            for _ in range(searches):
                assert handed.acquire(timeout=20)
            behind = searches - len(ids) // depth
            for _ in range(2000):  # handed over, then queued by the event loop
                if app.state.batcher.queue.qsize() >= behind:
                    break
                threading.Event().wait(0.01)
        passes.append(len(ids))
        return embed_tokens(self, ids)

    monkeypatch.setattr(Batched, "score_pairs", counted)
    monkeypatch.setattr(Pairs, "embed_tokens", held)

    async def burst() -> list[int]:
        async with client_for(app) as client:
            body = {"k": 3, "rerank_depth": depth}
            asked = [
                client.post("/search", json={**body, "query": f"{ROWS[i % depth][1]} {i}"})
                for i in range(searches)
            ]
            return [answer.status_code for answer in await asyncio.gather(*asked)]

    assert asyncio.run(burst()) == [200] * searches
    # every pair scored once, in at most two passes: the one held, then all the others' at once
    assert sum(passes) == searches * depth and len(passes) <= 2
