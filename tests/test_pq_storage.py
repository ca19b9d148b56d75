"""``--storage pq``: product-quantised codes in memory, candidates re-scored exactly from the full
vectors memory-mapped on disk. Scores are the exact cosines, the ranking matches float32, and
filters, add/delete/compact, duplicates and the size-driven refit keep working."""

from __future__ import annotations

import functools
import mmap
from pathlib import Path

import numpy as np
import pytest

from indexer import Strategy, build_index
from indexer.store import open_index
from indexer.vectors.factory import build_vector_index
from indexer.vectors.reranked import FULL_IDS, FULL_VECTORS, Reranked
from indexer.vectors.tuning import recall_at_10
from indexer.writing.update import add_to_index, compact_index, delete_from_index
from search import SearchEngine
from search.read.duplicates import find_duplicates
from tests.helpers import clustered

QUESTIONS = ("line 7 about topic 7", "topic 3", "a fresh line about tandem bicycles", "ünïcödé 🚲 ∑")


def lines(path: Path, start: int, stop: int) -> Path:
    path.write_text(
        "id,text,topic\n"
        + "".join(f"d{i},line {i} about topic {i % 17},t{i % 5}\n" for i in range(start, stop))
        + ("d0,line 0 about topic 0,t0\n" if start == 0 else ""),  # a duplicate id: the last row wins
        encoding="utf-8",
    )
    return path


@pytest.fixture
def built(tmp_path, tiny_model, monkeypatch, built_once) -> tuple[Path, Path]:
    """The same 600 lines as pq (IVF-PQ: the exact-search threshold lowered to 100) and float32,
    built once for the module's tests, each test given its own copies."""
    import indexer.vectors.factory

    monkeypatch.setattr(indexer.vectors.factory, "EXACT_LIMIT", 100)

    def build(folder: Path, **options: str) -> Path:
        build_index(lines(folder / "c.csv", 0, 600), folder / "idx", Strategy(model=tiny_model), **options)
        return folder / "idx"

    pq = built_once("pq_storage pq", functools.partial(build, storage="pq"), tmp_path / "pq")
    return pq, built_once("pq_storage flat", functools.partial(build, index_kind="flat"), tmp_path / "f32")


def assert_ranks_like(pq: Path, exact: Path, where: str | None = None, k: int = 5) -> None:
    a, b = SearchEngine(pq), SearchEngine(exact)
    for question in QUESTIONS:
        x = a.search(question, k=k, where=where, mode="dense")
        y = b.search(question, k=k, where=where, mode="dense")
        assert [h.id for h in x] == [h.id for h in y]
        np.testing.assert_allclose([h.score for h in x], [h.score for h in y], atol=1e-5)


def test_pq_ranks_like_float32_with_exact_scores(built):
    pq, f32 = built
    live = open_index(pq)
    assert isinstance(live.vectors, Reranked) and live.vectors.kind == "ivf"
    assert live.info()["storage"] == "pq" and 1 <= live.info()["nprobe"] <= live.vectors.nlist
    assert isinstance(live.vectors.vectors.base, mmap.mmap)  # full vectors read from disk, not loaded
    assert str(live.version / FULL_VECTORS) in Path("/proc/self/maps").read_text()
    assert (live.version / FULL_VECTORS).is_file() and (live.version / FULL_IDS).is_file()
    assert_ranks_like(pq, f32)
    assert_ranks_like(pq, f32, where="topic = 't3'", k=10)  # filters: exact within the allowed set


def test_pq_add_delete_replace_compact(built, tmp_path):
    pq, f32 = built
    more = tmp_path / "more.csv"
    more.write_text(
        "id,text,topic\nnew,a fresh line about tandem bicycles,t1\nd7,zebra xylophone quantum,t2\n",
        encoding="utf-8",
    )
    for index in built:
        add_to_index(index, more)
        delete_from_index(index, ["d3", "d8"])
    assert_ranks_like(pq, f32)
    engine = SearchEngine(pq)
    # d7 re-embedded: its new vector, not the old
    top = engine.search("zebra xylophone quantum", k=1, mode="dense")[0]
    assert top.id == "d7" and top.score == pytest.approx(1.0, abs=1e-5)
    assert not {"d3", "d8"} & {h.id for q in QUESTIONS for h in engine.search(q, k=20, mode="dense")}
    assert open_index(pq).vectors.count == open_index(pq).meta["vectors"] == 599  # base + segment
    compact_index(pq)
    compact_index(f32)
    live = open_index(pq)  # the segment merged: the full vectors written again, sorted by id
    assert live.vectors.count == live.meta["vectors"] == 599 and len(live.vectors.ids) == 599
    assert list(live.vectors.ids) == sorted(live.vectors.ids)
    assert_ranks_like(pq, f32)
    delete_from_index(pq, [f"d{i}" for i in range(600) if i not in (3, 8)] + ["new"])
    assert open_index(pq).vectors.count == 0 and SearchEngine(pq).search("topic 3", k=3) == []


def test_pq_refits_by_size_from_the_full_vectors(tmp_path, tiny_model, monkeypatch):
    """Exact-kind pq (PQ codes, no lists) below the threshold; an add past it rebuilds IVF-PQ
    from the full vectors, so nothing is lost to re-encoding."""
    import indexer.vectors.factory

    monkeypatch.setattr(indexer.vectors.factory, "EXACT_LIMIT", 300)
    build_index(lines(tmp_path / "a.csv", 0, 200), tmp_path / "pq", Strategy(model=tiny_model), storage="pq")
    build_index(
        lines(tmp_path / "a.csv", 0, 200), tmp_path / "f32", Strategy(model=tiny_model), index_kind="flat"
    )
    assert open_index(tmp_path / "pq").vectors.kind == "flat"
    assert_ranks_like(tmp_path / "pq", tmp_path / "f32", where="topic IN ('t1', 't4')")
    for index in ("pq", "f32"):
        add_to_index(tmp_path / index, lines(tmp_path / "b.csv", 200, 700))
    assert open_index(tmp_path / "pq").vectors.kind == "ivf"
    assert_ranks_like(tmp_path / "pq", tmp_path / "f32")


def test_pq_duplicates_match_float32(built):
    pq, f32 = built
    a, b = find_duplicates(open_index(pq), 0.95), find_duplicates(open_index(f32), 0.95)
    assert a.total == b.total and a.groups == b.groups


@pytest.mark.parametrize("n", [1, 2, 7])
def test_pq_of_a_handful_of_vectors(n):
    vectors = clustered(n, dimension=48)
    index = build_vector_index(vectors, np.arange(10, 10 + n, dtype=np.int64), "auto", "pq")
    scores, found = index.search(vectors, 3)
    assert found[:, 0].tolist() == list(range(10, 10 + n))
    np.testing.assert_allclose(scores[:, 0], 1.0, atol=1e-5)
    assert (found[:, n:] == -1).all()


@pytest.mark.slow  # trains IVF-PQ on 20,000 vectors: a minute and more on a busy 2-core machine
def test_pq_recall_and_memory_on_clustered_vectors(tmp_path):
    import faiss

    drawn = clustered(20300, dimension=64)
    vectors, queries = drawn[:20000], drawn[20000:]
    ids = np.arange(1, 20001, dtype=np.int64)
    index = build_vector_index(vectors, ids, "ivf", "pq")
    _, rows = faiss.knn(queries, vectors, 10, metric=faiss.METRIC_INNER_PRODUCT)
    _, found = index.search(queries, 10)
    assert recall_at_10(found, ids[rows]) >= 0.95
    index.write(tmp_path / "v.faiss")
    codes = (tmp_path / "v.faiss").stat().st_size
    assert codes / len(vectors) <= 64  # what stays in memory: codes, ids, lists
    assert (tmp_path / FULL_VECTORS).stat().st_size >= vectors.nbytes  # the rest is on disk


@pytest.mark.slow  # the memory bound needs a corpus well past the training sample: 100,000 vectors
def test_a_pq_build_streams_its_full_vectors_to_disk(tmp_path):
    """A pq build from parts never holds the corpus' full vectors in memory: they go to the version
    directory as they come (the codes are trained on a sample), so a 100M-vector build needs the
    disk, not 150 GB of RAM. Shuffled ids (as with ``--also``) still come back sorted on disk."""
    import tracemalloc

    n, dimension = 100_000, 128
    corpus = clustered(n, dimension=dimension)  # made before measuring: the parts are views of it
    tracemalloc.start()
    peak = assert_streamed_to_disk(tmp_path, corpus, part=5_000)
    tracemalloc.stop()
    full = n * dimension * 4
    assert peak < full / 2, f"peak {peak / 1e6:.0f} MB for {full / 1e6:.0f} MB of vectors"


def test_a_small_pq_build_streams_its_full_vectors_to_disk(tmp_path):
    """The streaming of the test above on 600 vectors in parts of 50: shuffled ids come back sorted
    on disk with their own vectors (its memory bound needs the large corpus)."""
    assert_streamed_to_disk(tmp_path, clustered(600, dimension=32), part=50)


def assert_streamed_to_disk(tmp_path: Path, corpus: np.ndarray, part: int) -> int:
    """Build ivf pq from ``corpus`` in parts under shuffled ids into ``tmp_path``, check what is
    on disk, and give the traced memory peak of the build (0 if tracemalloc is off)."""
    import tracemalloc

    from indexer.vectors.factory import build_from_parts

    n, dimension = corpus.shape
    ids = np.random.default_rng(3).permutation(np.arange(1, n + 1, dtype=np.int64))

    def parts():
        for start in range(0, n, part):
            yield corpus[start : start + part], ids[start : start + part]

    index = build_from_parts(parts, n, dimension, "ivf", "pq", directory=tmp_path)
    peak = tracemalloc.get_traced_memory()[1]
    index.write(tmp_path / "v.faiss")
    stored = Reranked.read(tmp_path / "v.faiss")
    assert stored.ids.tolist() == list(range(1, n + 1))
    wanted = np.array([5, int(n * 0.17), n])
    vectors, owners = stored.full(wanted)
    expected = {int(i): v for v, i in zip(*rows_of(parts, wanted), strict=True)}
    for vector, owner in zip(vectors, owners, strict=True):
        np.testing.assert_array_equal(vector, expected[int(owner)])
    scores, found = stored.search(vectors, 1)
    assert found[:, 0].tolist() == owners.tolist() and np.allclose(scores[:, 0], 1.0, atol=1e-5)
    return peak


def rows_of(parts, wanted: np.ndarray) -> tuple[list[np.ndarray], list[int]]:
    """The vectors of these ids, read from the parts."""
    vectors, owners = [], []
    for part, part_ids in parts():
        for row in np.flatnonzero(np.isin(part_ids, wanted)):
            vectors.append(part[row])
            owners.append(int(part_ids[row]))
    return vectors, owners
