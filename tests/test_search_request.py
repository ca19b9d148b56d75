"""A search is one ``SearchRequest`` answered in stages; a search whose snapshot moved under it is
embedded again by its own embedding step (the server's batcher), never on the lookup."""

from __future__ import annotations

import pytest

from indexer.errors import BadInput, IndexMoved
from search.read.engine import SearchEngine
from search.read.requests import SearchRequest
from search.read.reranked import RerankOptions
from search.read.snapshot import Snapshot
from tests.helpers import ROWS, build_faq


@pytest.mark.parametrize(
    "request_, said",
    [
        (SearchRequest("bike", k=5, rerank=RerankOptions("x", 4)), r"rerank_depth must be at least k \(5\)"),
        (SearchRequest("bike", k=5, rerank=RerankOptions(depth=8)), r"rerank_depth needs a reranker"),
        (SearchRequest("bike", rerank=RerankOptions("x", weight=1.5)), r"rerank_weight must be in \[0, 1\]"),
        (SearchRequest("bike", rerank=RerankOptions("x", weight=float("nan"))), "rerank_weight must be"),
        (SearchRequest("bike", rerank=RerankOptions(weight=0.5, off=True)), "takes no rerank_weight"),
        (SearchRequest("bike", k=0), "k must be at least 1"),
        (SearchRequest(" ", k=3), "empty query"),
        (SearchRequest("bike", min_score=float("nan")), "finite"),
        # before: a TypeError from inside ('<' not supported, slice indices) or "empty query"
        (SearchRequest("bike", k="3"), "k must be a whole number, not '3'"),
        (SearchRequest("bike", k=2.5), "k must be a whole number, not 2.5"),
        (SearchRequest("bike", k=None), "k must be a whole number, not None"),
        (SearchRequest(123), "a query is text, not int"),
        (SearchRequest([b"bike"]), "a query is text, not bytes"),
        (SearchRequest(["bike", None]), "a query is text, not NoneType"),
        (SearchRequest("bike", min_score="0.5"), "min score must be a number, not '0.5'"),
    ],
)
def test_a_request_that_cannot_be_searched_is_one_line(request_, said):
    with pytest.raises(BadInput, match=said):
        request_.checked()


def test_a_whole_number_of_any_integer_type_is_a_k():
    numpy = pytest.importorskip("numpy")
    assert SearchRequest("bike", k=numpy.int64(3)).checked().k == 3


def test_the_default_depth_is_at_least_k():
    assert SearchRequest("bike", k=5).depth == 50 and SearchRequest("bike", k=80).depth == 80
    assert SearchRequest("bike", k=5, rerank=RerankOptions("x", 7)).depth == 7
    assert SearchRequest("bike", rerank="x").rerank == RerankOptions("x")  # a folder stands for its options
    assert SearchRequest(["a", "b"]).queries == ("a", "b") and SearchRequest("a").queries == ("a",)


def test_the_public_search_and_the_request_give_the_same_hits(tmp_path, tiny_model):
    engine = SearchEngine(build_faq(tmp_path, tiny_model))
    asked = dict(k=2, where="category = 'billing'", min_score=0.1, mode="dense")
    assert engine.search(ROWS[0][1], **asked) == engine.answer(SearchRequest(ROWS[0][1], **asked))[0]
    assert (
        engine.search(ROWS[0][1], 2, "category = 'billing'", 0.1, None, "dense")
        == engine.search_many([ROWS[0][1]], **asked)[0]
    )
    # one string is one query, as a request reads it (before: its characters, "empty query")
    assert engine.search_many(ROWS[0][1], **asked) == [engine.search(ROWS[0][1], **asked)]


def test_a_search_whose_snapshot_moved_is_embedded_again_with_the_new_encoding(
    tmp_path, tiny_model, monkeypatch
):
    engine = SearchEngine(build_faq(tmp_path, tiny_model))
    first = engine.snapshot
    build_faq(tmp_path, tiny_model, postprocess="center")  # the live version embeds otherwise now
    moved = [IndexMoved("an update committed under the search")]
    run = Snapshot.run

    def moving(snapshot: Snapshot, plan, vectors):
        if snapshot is first and moved:
            raise moved.pop()
        return run(snapshot, plan, vectors)

    monkeypatch.setattr(Snapshot, "run", moving)
    embedded = []

    def step(encoding, texts, then, roles="query"):
        embedded.append(encoding)
        return then(encoding.embed(texts, role=roles))

    hits = engine.search_many([ROWS[1][1]], k=2, embed=step)
    assert engine.snapshot is not first and embedded == [first.encoding]
    assert hits == engine.search_many([ROWS[1][1]], k=2)  # the new version's vectors, not the old
