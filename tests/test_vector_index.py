"""Index kinds: exact below the size limit, IVF above (tuned to a recall target), both updatable,
filtered searches exact within the allowed set, and the vectors memory-mapped when read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from indexer import Strategy, build_index
from indexer.store import open_index
from indexer.update import add_to_index, compact_index, delete_from_index
from indexer.vector_index import RECALL_TARGET, build_vector_index, kind_of, recall_at_10, refit
from search import SearchEngine
from tests.conftest import clustered


def test_ivf_reaches_recall_target_against_exact():
    import faiss

    drawn = clustered(20300)
    vectors, queries = drawn[:20000], drawn[20000:]  # queries: new points from the same clusters
    ids = np.arange(100, 20100, dtype=np.int64)
    assert kind_of(build_vector_index(vectors[:1000], ids[:1000])) == "flat"  # auto: small is exact
    ivf = build_vector_index(vectors, ids, "ivf")
    assert kind_of(ivf) == "ivf" and 1 <= ivf.nprobe <= ivf.nlist
    _, rows = faiss.knn(queries, vectors, 10, metric=faiss.METRIC_INNER_PRODUCT)
    _, found = ivf.search(queries, 10)
    assert recall_at_10(found, ids[rows]) >= RECALL_TARGET - 0.03


def test_ivf_index_end_to_end(tmp_path, tiny_model):
    corpus = tmp_path / "c.csv"
    topics = ["bikes", "billing", "parking", "rain"]
    corpus.write_text(
        "id,text,topic\n"
        + "".join(
            f"d{i},document {i} on {topics[i % 4]} number {i * 7},{topics[i % 4]}\n" for i in range(3000)
        )
    )
    build_index(corpus, tmp_path / "idx", Strategy(model=tiny_model), index_kind="ivf")
    live = open_index(tmp_path / "idx")
    assert kind_of(live.vectors) == "ivf" and live.meta["index_kind"] == "ivf"
    engine = SearchEngine(tmp_path / "idx")
    assert engine.search("document 42 on billing number 294", k=1)[0].id == "d42"
    hits = engine.search("bikes", k=25, where="topic = 'rain' AND id IN ('d3', 'd7', 'd11')")
    assert [h.id for h in hits] and {h.id for h in hits} == {"d3", "d7", "d11"}  # filter: all found
    more = tmp_path / "more.csv"
    more.write_text("id,text,topic\nx1,a brand new document about tandems,bikes\n")
    add_to_index(tmp_path / "idx", more)
    delete_from_index(tmp_path / "idx", ["d42"])
    engine = SearchEngine(tmp_path / "idx")
    assert engine.search("a brand new document about tandems", k=1)[0].id == "x1"
    assert "d42" not in {h.id for h in engine.search("document 42 on billing number 294", k=10)}
    assert open_index(tmp_path / "idx").meta["count"] == 3000


@pytest.mark.parametrize("kind", ["flat", "ivf"])
def test_vectors_are_memory_mapped(tmp_path, tiny_model, kind):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(f"line {i}" for i in range(400)))
    build_index(corpus, tmp_path / "idx", Strategy(model=tiny_model), index_kind=kind)
    live = open_index(tmp_path / "idx")
    assert live.vectors.ntotal == 400
    assert str(live.version / "vectors.faiss") in Path("/proc/self/maps").read_text()


@pytest.mark.parametrize("kind", ["flat", "ivf"])
@pytest.mark.parametrize("storage,max_ratio", [("float16", 0.55), ("sq8", 0.3)])
def test_compressed_storage_keeps_the_ranking(tmp_path, kind, storage, max_ratio):
    import faiss

    drawn = clustered(40300, dimension=64)
    vectors, queries = drawn[:40000], drawn[40000:]
    ids = np.arange(1, 40001, dtype=np.int64)
    index = build_vector_index(vectors, ids, kind, storage)
    _, rows = faiss.knn(queries, vectors, 10, metric=faiss.METRIC_INNER_PRODUCT)
    _, found = index.search(queries, 10)
    assert recall_at_10(found, ids[rows]) >= 0.9
    path, raw = tmp_path / "v.faiss", tmp_path / "raw.faiss"
    faiss.write_index(index, str(path))
    faiss.write_index(build_vector_index(vectors, ids, kind), str(raw))
    assert path.stat().st_size / raw.stat().st_size <= max_ratio
    index.remove_ids(ids[:10])  # updates keep working
    assert index.ntotal == 39990


def test_sq8_index_end_to_end(tmp_path, tiny_model):
    corpus = tmp_path / "c.csv"
    corpus.write_text("id,text\n" + "".join(f"d{i},line {i} about topic {i % 17}\n" for i in range(500)))
    build_index(corpus, tmp_path / "idx", Strategy(model=tiny_model), storage="sq8")
    assert open_index(tmp_path / "idx").meta["storage"] == "sq8"
    more = tmp_path / "more.csv"
    more.write_text("id,text\nnew,a fresh line about tandem bicycles\n")
    add_to_index(tmp_path / "idx", more)
    delete_from_index(tmp_path / "idx", ["d3"])
    engine = SearchEngine(tmp_path / "idx")
    assert engine.search("a fresh line about tandem bicycles", k=1)[0].id == "new"
    assert engine.search("line 7 about topic 7", k=1)[0].id == "d7"


def test_add_and_compact_rechoose_the_kind_by_size(tmp_path, tiny_model, monkeypatch):
    """Built exact below the threshold, add past it -> IVF with tuned probes; delete below it and
    compact -> exact again. A kind the user forced stays."""
    import indexer.vector_index

    monkeypatch.setattr(indexer.vector_index, "EXACT_LIMIT", 300)

    def lines(name: str, start: int, stop: int) -> Path:
        path = tmp_path / name
        path.write_text(
            "id,text\n" + "".join(f"d{i},line {i} about topic {i % 13}\n" for i in range(start, stop))
        )
        return path

    build_index(lines("a.csv", 0, 200), tmp_path / "idx", Strategy(model=tiny_model))
    build_index(lines("a.csv", 0, 200), tmp_path / "forced", Strategy(model=tiny_model), index_kind="flat")
    assert kind_of(open_index(tmp_path / "idx").vectors) == "flat"
    add_to_index(tmp_path / "idx", lines("b.csv", 200, 700))
    add_to_index(tmp_path / "forced", lines("b.csv", 200, 700))
    live = open_index(tmp_path / "idx")
    assert kind_of(live.vectors) == "ivf" and live.vectors.ntotal == 700
    assert 1 <= live.vectors.nprobe < live.vectors.nlist and live.info()["nprobe"] == live.vectors.nprobe
    assert SearchEngine(tmp_path / "idx").search("line 650 about topic 0", k=1)[0].id == "d650"
    assert kind_of(open_index(tmp_path / "forced").vectors) == "flat"
    delete_from_index(tmp_path / "idx", [f"d{i}" for i in range(500)])
    compact_index(tmp_path / "idx")
    live = open_index(tmp_path / "idx")
    assert kind_of(live.vectors) == "flat" and live.vectors.ntotal == 200
    assert SearchEngine(tmp_path / "idx").search("line 650 about topic 0", k=1)[0].id == "d650"


def test_refit_retunes_ivf_when_the_size_has_doubled():
    vectors = clustered(8000)
    ids = np.arange(1, 8001, dtype=np.int64)
    ivf = build_vector_index(vectors[:2000], ids[:2000], "ivf")
    ivf.add_with_ids(vectors[2000:2500], ids[2000:2500])
    same, tuned_for = refit(ivf, "ivf", "float32", 2000)
    assert same is ivf and tuned_for == 2000  # grew by a quarter: kept as it is
    ivf.add_with_ids(vectors[2500:], ids[2500:])
    rebuilt, tuned_for = refit(ivf, "ivf", "float32", 2000)
    assert rebuilt is not ivf and tuned_for == 8000 and rebuilt.ntotal == 8000
    assert rebuilt.nlist > ivf.nlist and 1 <= rebuilt.nprobe <= rebuilt.nlist
    tuned, rebuilt.nprobe = rebuilt.nprobe, rebuilt.nlist
    assert refit(rebuilt, "ivf", "float32", 8000, retune=True) == (rebuilt, 8000)  # compact retunes
    assert rebuilt.nprobe == tuned
    exact, _ = refit(rebuilt, "auto", "float32", 8000)  # 8000 < EXACT_LIMIT: exact again
    assert kind_of(exact) == "flat" and exact.ntotal == 8000
    assert sorted(exact.search(vectors[:1], 1)[1][0].tolist()) == [1]
