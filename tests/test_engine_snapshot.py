"""The query engine as a library: a snapshot is one complete version, filters that SQLite or
Python cannot take are FilterErrors, constructing an engine leaves process settings alone, and
rank_similar never post-processes on the texts it ranks."""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest

from indexer.embedding.strategy import Strategy
from indexer.encoders.factory import encoder_for
from indexer.encoders.options import EmbeddingOptions
from indexer.errors import BadInput, FilterError, IndexMoved
from indexer.store import open_index
from search.read.encoding import Encoding
from search.read.engine import SearchEngine
from search.read.similar import rank_similar
from tests.helpers import ROWS, build_faq


def test_snapshot_stays_whole_across_a_reload(tmp_path, tiny_model):
    engine = SearchEngine(build_faq(tmp_path, tiny_model))
    old = engine.snapshot
    plan = old.plan([ROWS[1][1]], k=2)
    before = old.run(plan, old.embed(plan.queries))
    build_faq(tmp_path, tiny_model, layers=(-1, -2), combine="concat")
    assert engine.reload_if_changed()
    assert engine.snapshot is not old
    assert engine.snapshot.encoding.embedder.dimension == 64 == engine.snapshot.index.vectors.dimension
    assert old.encoding.embedder.dimension == 32 == old.index.vectors.dimension
    assert old.run(plan, old.embed(plan.queries)) == before
    assert engine.search(ROWS[1][1], k=1)[0].id == "a2"


def test_a_closed_engine_says_so_when_asked_again(tmp_path, tiny_model):
    # before: sqlite3.ProgrammingError: Cannot operate on a closed database.
    with SearchEngine(build_faq(tmp_path, tiny_model)) as engine:
        assert engine.search(ROWS[1][1], k=1)[0].id == "a2"
    for ask in (
        lambda: engine.search(ROWS[1][1], k=1),
        lambda: engine.search_many([ROWS[1][1]], mode="keyword"),
    ):
        with pytest.raises(BadInput, match="this SearchEngine is closed: open a new one"):
            ask()
    engine.close()  # closing twice is harmless


def test_filters_too_deep_or_too_large_are_filter_errors(tmp_path, tiny_model):
    engine = SearchEngine(build_faq(tmp_path, tiny_model, field="c"))
    for where in (
        "(" * 490 + "c='billing'" + ")" * 490,
        "NOT " * 248 + "c='billing'",
        " OR ".join(["c='billing'"] * 1001),
    ):
        with pytest.raises(FilterError):
            engine.search("bike", where=where)
    assert [h.id for h in engine.search("bike", k=4, where="c = 'billing'")] != []


def test_one_snapshot_serves_many_threads(tmp_path, tiny_model):
    snapshot = SearchEngine(build_faq(tmp_path, tiny_model)).snapshot
    plan = snapshot.plan([ROWS[0][1]], 4, where="category IN ('billing', 'app')")
    vectors = snapshot.embed(plan.queries)

    def filtered(_: int) -> list[str]:
        return [h.id for h in snapshot.run(plan, vectors)[0]]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(filtered, range(400)))
    assert all(sorted(a) == ["a1", "a3", "a4"] for a in answers)


def test_engine_leaves_faiss_threads_alone(tmp_path, tiny_model):
    import faiss

    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(2)
    try:
        SearchEngine(build_faq(tmp_path, tiny_model))
        assert faiss.omp_get_max_threads() == 2
    finally:
        faiss.omp_set_num_threads(before)


def test_rank_similar_refuses_post_processing_without_a_corpus(tiny_model):
    with pytest.raises(BadInput, match="--index"):
        rank_similar("a bike", ["a lock"], Strategy(model=tiny_model, postprocess="center"))


def test_rank_similar_applies_the_given_transform(tmp_path, tiny_model):
    index = open_index(build_faq(tmp_path, tiny_model, postprocess="center"))
    embedder = encoder_for(index.strategy)
    encoding = Encoding(embedder, index.transform)
    hits = rank_similar(ROWS[0][1], [ROWS[0][1], ROWS[1][1]], encoding=encoding)
    vectors = index.transform.apply(embedder.embed([ROWS[0][1], ROWS[1][1]]))
    assert hits[0].score == pytest.approx(1.0, abs=1e-4)
    assert hits[1].score == pytest.approx(float(np.dot(vectors[0], vectors[1])), abs=1e-4)


def test_a_snapshot_never_pairs_its_vectors_with_rows_written_after_it(tmp_path, tiny_model):
    """An upsert commits into the same version: an engine opened before it must not score the
    entry by its old vector while showing its new text (nor the other way round)."""
    from indexer.writing.update import add_to_index
    from tests.helpers import write_csv

    path = build_faq(tmp_path, tiny_model)
    engine = SearchEngine(path)
    stale = engine.snapshot
    question = "Which bikes can I rent for a whole week?"
    change = write_csv(tmp_path / "change.csv", [("a2", question, "stations")], ("id", "text", "category"))
    add_to_index(path, change, id_field="id")

    fresh = SearchEngine(path).search(question, k=4)
    assert fresh[0].id == "a2" and fresh[0].text == question
    found = engine.search(question, k=4)
    assert [(h.id, h.text, round(h.score, 5)) for h in found] == [
        (h.id, h.text, round(h.score, 5)) for h in fresh
    ]
    assert engine.snapshot is not stale
    plan = stale.plan([question], k=4)
    with pytest.raises(IndexMoved):
        stale.run(plan, stale.embed(plan.queries))


def test_the_engine_runs_its_queries_on_the_execution_provider_asked_for(tmp_path, tiny_model):
    path = build_faq(tmp_path, tiny_model)
    with pytest.raises(BadInput, match="no execution provider 'NoSuchExecutionProvider'"):
        SearchEngine(path, options=EmbeddingOptions(provider="NoSuchExecutionProvider"))
    engine = SearchEngine(path, options=EmbeddingOptions(provider="CPUExecutionProvider"))
    assert engine.embedder.decision.provider == "CPUExecutionProvider"
    build_faq(tmp_path, tiny_model, layers=(-1, -2), combine="concat")
    assert engine.reload_if_changed() and engine.embedder.decision.provider == "CPUExecutionProvider"


def test_query_and_serve_take_the_execution_provider(tmp_path, tiny_model):
    from click.testing import CliRunner

    from search.cli import cli
    from search.read.loading import load_engine

    path = build_faq(tmp_path, tiny_model)
    bad = CliRunner().invoke(cli, ["query", str(path), "bike", "--provider", "NoSuchExecutionProvider"])
    assert bad.exit_code == 1 and "no execution provider 'NoSuchExecutionProvider'" in bad.output
    asked = ["--provider", "CPUExecutionProvider"]
    good = CliRunner().invoke(cli, ["query", str(path), ROWS[1][1], "-k", "1", *asked])
    assert good.exit_code == 0 and "a2" in good.output
    with pytest.raises(BadInput, match="no execution provider"):
        load_engine(path, EmbeddingOptions(provider="NoSuchExecutionProvider")).result()
