"""Duplicate entries: range-search pairs (an entry is its best chunk), groups, the pair cap, the
CLI and the HTTP endpoint, and bad thresholds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from indexer import Strategy, build_index
from indexer.errors import BadInput
from indexer.store import open_index
from search.read.duplicates import components, find_duplicates, range_pairs
from tests.helpers import assert_clean_failure, run

ROWS = [
    ("a", "How do I reset my password?"),
    ("b", "How do I reset my password?"),
    ("c", "How do I reset my password?"),
    ("d", "Where can I park my bicycle?"),
    ("e", "Where can I park my bicycle?"),
    ("f", "Is there a mobile app for Android?"),
]


@pytest.fixture(scope="module")
def index(tmp_path_factory, tiny_model) -> Path:
    root = tmp_path_factory.mktemp("dups")
    corpus = root / "faq.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in ROWS))
    build_index(corpus, root / "idx", Strategy(model=tiny_model))
    return root / "idx"


def unit(rows: list[list[float]]) -> np.ndarray:
    vectors = np.array(rows, dtype=np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_an_entry_is_its_best_chunk_and_never_its_own_duplicate():
    vectors = unit([[1, 0, 0], [0, 1, 0], [1, 0.05, 0], [0, 0, 1], [0, 1, 0.5]])
    owners = np.array([1, 1, 2, 3, 3])  # entry 1 has two chunks, as does entry 3
    pairs, scores = range_pairs(vectors, owners, 0.8)
    found = {tuple(p): s for p, s in zip(pairs.tolist(), scores.tolist(), strict=True)}
    assert set(found) == {(1, 2), (1, 3)}  # chunks of one entry (1, 1) are no pair
    assert found[(1, 2)] == pytest.approx(float(vectors[0] @ vectors[2]))
    assert found[(1, 3)] == pytest.approx(float(vectors[1] @ vectors[4]))


def test_range_pairs_match_a_naive_matrix_product():
    rng = np.random.default_rng(0)
    vectors = unit((rng.normal(size=(300, 8)) + np.repeat(rng.normal(size=(30, 8)) * 3, 10, axis=0)).tolist())
    owners = np.arange(300)
    pairs, _ = range_pairs(vectors, owners, 0.9)
    similarity = vectors @ vectors.T
    naive = {(i, j) for i, j in zip(*np.nonzero(similarity >= 0.9), strict=True) if i < j}
    assert {tuple(p) for p in pairs.tolist()} == naive and naive


def test_approximate_search_finds_near_copies():
    rng = np.random.default_rng(1)
    originals = rng.normal(size=(2000, 16))
    copies = originals[:100] + rng.normal(size=(100, 16)) * 0.05  # cosine ~0.999 to their twin
    vectors = unit(np.concatenate([originals, copies]).tolist())
    pairs, _ = range_pairs(vectors, np.arange(len(vectors)), 0.98, exact=False)
    exact, _ = range_pairs(vectors, np.arange(len(vectors)), 0.98, exact=True)
    assert {(i, 2000 + i) for i in range(100)} <= {tuple(p) for p in pairs.tolist()}
    assert {tuple(p) for p in pairs.tolist()} <= {tuple(p) for p in exact.tolist()}


def test_groups_are_connected_components():
    assert components(np.array([[1, 2], [2, 3], [7, 9]])) == [[1, 2, 3], [7, 9]]
    assert components(np.zeros((0, 2), dtype=np.int64)) == []


def test_find_duplicates_lists_pairs_and_groups(index):
    found = find_duplicates(open_index(index), 0.999)
    assert found.groups == [["a", "b", "c"], ["d", "e"]]
    assert found.total == 4 and not found.truncated
    assert {frozenset(p[:2]) for p in found.pairs} == {
        frozenset(p) for p in [("a", "b"), ("a", "c"), ("b", "c"), ("d", "e")]
    }
    capped = find_duplicates(open_index(index), 0.999, limit=1)
    assert len(capped.pairs) == 1 and capped.truncated and capped.groups == found.groups


@pytest.mark.parametrize("score", [0, -0.5, 1.5, math.nan, "0.9", None])  # the last two: a TypeError before
def test_min_score_must_be_a_positive_cosine(index, score):
    with pytest.raises(BadInput, match="min score"):
        find_duplicates(open_index(index), score)


@pytest.mark.parametrize("score", ["0", "-0.5", "2"])
def test_a_min_score_that_is_no_positive_cosine_is_a_usage_error(index, score):
    """The CLI knows its score is a cosine: exit 2, one line naming its range, before the index opens."""
    from click.testing import CliRunner

    from search.cli import cli

    said = CliRunner().invoke(cli, ["duplicates", str(index / "missing"), "--min-score", score])
    assert said.exit_code == 2, said.output
    errors = [line for line in said.output.splitlines() if line.startswith("Error: ")]
    assert errors == [f"Error: --min-score must be a cosine in (0, 1], not {float(score)}"], said.output


@pytest.mark.parametrize("limit", [-1, "3", 2.5])  # the last two: a TypeError before
def test_limit_must_be_a_whole_number_from_0(index, limit):
    with pytest.raises(BadInput, match=f"limit must be a whole number, 0 or more, not {limit!r}"):
        find_duplicates(open_index(index), 0.9, limit=limit)


@pytest.mark.slow
def test_cli_duplicates(index):
    result = run("duplicates", index, "--min-score", "0.999", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["groups"] == [["a", "b", "c"], ["d", "e"]]
    table = run("duplicates", index, "--min-score", "0.999", "--limit", "1")
    assert "4 pairs in 2 groups" in table.stdout and "3 more pairs" in table.stdout
    out_of_range = run("duplicates", index, "--min-score", "2")
    assert_clean_failure(out_of_range, "--min-score must be a cosine in (0, 1]")
    assert out_of_range.returncode == 2


def test_http_duplicates(index):
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from search.server import create_app

    with TestClient(create_app(index)) as client:
        body = client.get("/duplicates", params={"min_score": 0.999, "limit": 2}).json()
        assert body["total_pairs"] == 4 and len(body["pairs"]) == 2 and body["truncated"]
        assert body["groups"] == [["a", "b", "c"], ["d", "e"]]
        assert client.get("/duplicates", params={"min_score": 2}).status_code == 400
        assert client.get("/duplicates", params={"limit": 100000}).status_code == 400


def test_an_empty_index_has_no_duplicates(tmp_path, tiny_model):
    from indexer.writing.update import delete_from_index

    corpus = tmp_path / "one.jsonl"
    corpus.write_text(json.dumps({"id": "ü1", "text": "Ünïcode question ✓"}) + "\n")
    build_index(corpus, tmp_path / "idx", Strategy(model=tiny_model))
    assert find_duplicates(open_index(tmp_path / "idx"), 0.5).pairs == []  # one entry: no pair
    delete_from_index(tmp_path / "idx", ["ü1"])
    found = find_duplicates(open_index(tmp_path / "idx"), 0.5)
    assert (found.pairs, found.groups, found.total) == ([], [], 0)


def test_http_duplicates_scan_once_per_version_however_many_ask(index, tmp_path, monkeypatch):
    """A scan can take seconds on a large index: concurrent and repeated requests share one scan
    per index version and question, so a client cannot keep the cores busy by asking again."""
    pytest.importorskip("httpx")
    import shutil
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from fastapi.testclient import TestClient

    import search.server.scans
    from indexer.writing.update import delete_from_index
    from search.server import create_app

    scans: list[float] = []
    original = search.server.scans.find_duplicates
    running = threading.Lock()

    def slow_scan(*args, **kwargs):
        assert running.acquire(blocking=False), "two scans ran at once"
        try:
            scans.append(args[1])
            time.sleep(0.3)
            return original(*args, **kwargs)
        finally:
            running.release()

    monkeypatch.setattr(search.server.scans, "find_duplicates", slow_scan)
    index = shutil.copytree(index, tmp_path / "idx")  # this test deletes: a copy, not the module's
    with TestClient(create_app(index)) as client:
        ask = lambda score: client.get("/duplicates", params={"min_score": score}).json()  # noqa: E731
        with ThreadPoolExecutor(6) as pool:
            bodies = list(pool.map(ask, [0.999] * 6))
        assert scans == [0.999] and all(b == bodies[0] for b in bodies)
        ask(0.5)
        assert scans == [0.999, 0.5]
        delete_from_index(index, ["e"])
        client.post("/reload")
        assert ask(0.999)["groups"] == [["a", "b", "c"]] and len(scans) == 3


@pytest.mark.parametrize("exact", [True, False])
def test_a_min_score_that_pairs_everything_is_refused_in_bounded_memory(exact):
    """Every pair of 4,000 positive vectors is above 0.0001: the scan must give up after holding a
    bounded share of them, not after FAISS has returned all 16 million (about 200 MB per block)."""
    import tracemalloc

    vectors = unit(np.random.default_rng(0).uniform(0.1, 1, size=(4000, 8)).tolist())
    tracemalloc.start()
    try:
        with pytest.raises(BadInput, match="raise the min score"):
            range_pairs(vectors, np.arange(4000), 0.0001, exact=exact)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"{peak >> 20} MB"


def test_a_stopped_scan_ends_between_blocks():
    """A scan nobody waits for any more (a server's client hung up) stops at the next block."""
    from search.read.duplicates import ScanStopped

    vectors = unit(np.random.default_rng(0).normal(size=(3000, 8)).tolist())
    blocks = []

    def stop() -> bool:
        blocks.append(1)
        return len(blocks) > 2

    with pytest.raises(ScanStopped):
        range_pairs(vectors, np.arange(3000), 0.99, stop=stop, block=100)
    assert len(blocks) == 3


def test_clients_that_hang_up_never_run_two_scans_at_once(index, monkeypatch):
    """A client that hangs up cancels its request, not the scan's thread: the next scan waits for
    that thread to end (which it does at its next step, nobody waiting), so N hung-up requests
    never run more than one scan at a time."""
    pytest.importorskip("httpx")
    import asyncio
    import threading
    import time

    import search.server.scans
    from search.read.duplicates import ScanStopped
    from search.server import create_app

    original = search.server.scans.find_duplicates
    guard = threading.Lock()
    running, most, steps = [0], [0], []

    def slow_scan(*args, stop=None, **kwargs):
        with guard:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            for _ in range(40):  # 0.4 s in steps, as a real scan asks between its blocks
                if stop is not None and stop():
                    raise ScanStopped
                steps.append(1)
                time.sleep(0.01)
            return original(*args, **kwargs)
        finally:
            with guard:
                running[0] -= 1

    monkeypatch.setattr(search.server.scans, "find_duplicates", slow_scan)
    app = create_app(index)

    async def ask(score: float, hang_up_after: float | None) -> list[dict]:
        replies: list[dict] = []
        asked = False

        async def receive() -> dict:
            nonlocal asked
            if not asked:
                asked = True
                return {"type": "http.request", "body": b"", "more_body": False}
            if hang_up_after is None:
                await asyncio.Event().wait()  # a client that stays
            await asyncio.sleep(hang_up_after)
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            replies.append(message)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": "/duplicates",
            "raw_path": b"/duplicates",
            "root_path": "",
            "query_string": f"min_score={score}".encode(),
            "headers": [(b"host", b"test")],
            "client": ("127.0.0.1", 1),
            "server": ("test", 80),
        }
        await app(scope, receive, send)
        return replies

    async def hostile() -> list[dict]:
        quitters = []
        for n in range(5):  # one after another, each hanging up 50 ms after it asked
            quitters.append(asyncio.ensure_future(ask(0.5 + n / 10, 0.05)))
            await asyncio.sleep(0.1)
        await asyncio.gather(*quitters)
        return await ask(0.999, None)

    replies = asyncio.run(hostile())
    deadline = time.monotonic() + 10
    while running[0] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert most[0] == 1, f"{most[0]} scans ran at once"
    expected = find_duplicates(open_index(index), 0.999).total
    assert replies[0]["status"] == 200 and json.loads(replies[1]["body"])["total_pairs"] == expected > 0
    assert len(steps) < 5 * 40 + 40, "the abandoned scans ran to their end"
