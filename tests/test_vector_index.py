"""Index kinds: exact below the size limit, IVF above (tuned to a recall target), both updatable,
filtered searches exact within the allowed set, and the vectors memory-mapped when read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from indexer import Strategy, build_index
from indexer.store import open_index
from indexer.vectors.factory import (
    STORAGES,
    build_vector_index,
    open_vectors,
    read_vectors,
    refit,
    side_files,
    write_segment,
)
from indexer.vectors.faiss_index import FaissIndex
from indexer.vectors.reranked import Reranked
from indexer.vectors.segments import Manifest, Segments, segment_name
from indexer.vectors.tuning import RECALL_TARGET, recall_at_10
from indexer.writing.update import add_to_index, compact_index, delete_from_index
from search import SearchEngine
from tests.helpers import ROOT, clustered, heavy_imports


def test_ivf_reaches_recall_target_against_exact():
    import faiss

    drawn = clustered(20300)
    vectors, queries = drawn[:20000], drawn[20000:]  # queries: new points from the same clusters
    ids = np.arange(100, 20100, dtype=np.int64)
    assert build_vector_index(vectors[:1000], ids[:1000]).kind == "flat"  # auto: small is exact
    ivf = build_vector_index(vectors, ids, "ivf")
    assert ivf.kind == "ivf" and 1 <= ivf.nprobe <= ivf.nlist
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
    assert live.vectors.kind == "ivf" and live.meta["index_kind"] == "ivf"
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
    assert live.vectors.count == 400
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
    index.write(path)
    build_vector_index(vectors, ids, kind).write(raw)
    assert path.stat().st_size / raw.stat().st_size <= max_ratio
    index.remove(ids[:10])  # updates keep working
    assert index.count == 39990


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
    import indexer.vectors.factory

    monkeypatch.setattr(indexer.vectors.factory, "EXACT_LIMIT", 300)

    def lines(name: str, start: int, stop: int) -> Path:
        path = tmp_path / name
        path.write_text(
            "id,text\n" + "".join(f"d{i},line {i} about topic {i % 13}\n" for i in range(start, stop))
        )
        return path

    build_index(lines("a.csv", 0, 200), tmp_path / "idx", Strategy(model=tiny_model))
    build_index(lines("a.csv", 0, 200), tmp_path / "forced", Strategy(model=tiny_model), index_kind="flat")
    assert open_index(tmp_path / "idx").vectors.kind == "flat"
    add_to_index(tmp_path / "idx", lines("b.csv", 200, 700))
    add_to_index(tmp_path / "forced", lines("b.csv", 200, 700))
    live = open_index(tmp_path / "idx")
    assert live.vectors.kind == "ivf" and live.vectors.count == 700
    assert 1 <= live.vectors.nprobe < live.vectors.nlist and live.info()["nprobe"] == live.vectors.nprobe
    assert SearchEngine(tmp_path / "idx").search("line 650 about topic 0", k=1)[0].id == "d650"
    assert open_index(tmp_path / "forced").vectors.kind == "flat"
    delete_from_index(tmp_path / "idx", [f"d{i}" for i in range(500)])
    compact_index(tmp_path / "idx")
    live = open_index(tmp_path / "idx")
    assert live.vectors.kind == "flat" and live.vectors.count == 200
    assert SearchEngine(tmp_path / "idx").search("line 650 about topic 0", k=1)[0].id == "d650"


def test_refit_retunes_ivf_when_the_size_has_doubled():
    vectors = clustered(8000)
    ids = np.arange(1, 8001, dtype=np.int64)
    ivf = build_vector_index(vectors[:2000], ids[:2000], "ivf")
    ivf.add(vectors[2000:2500], ids[2000:2500])
    same, tuned_for = refit(ivf, "ivf", "float32", 2000)
    assert same is ivf and tuned_for == 2000  # grew by a quarter: kept as it is
    ivf.add(vectors[2500:], ids[2500:])
    rebuilt, tuned_for = refit(ivf, "ivf", "float32", 2000)
    assert rebuilt is not ivf and tuned_for == 8000 and rebuilt.count == 8000
    assert rebuilt.nlist > ivf.nlist and 1 <= rebuilt.nprobe <= rebuilt.nlist
    tuned, rebuilt.nprobe = rebuilt.nprobe, rebuilt.nlist
    assert refit(rebuilt, "ivf", "float32", 8000, retune=True) == (rebuilt, 8000)  # compact retunes
    assert rebuilt.nprobe == tuned
    exact, _ = refit(rebuilt, "auto", "float32", 8000)  # 8000 < EXACT_LIMIT: exact again
    assert exact.kind == "flat" and exact.count == 8000
    assert sorted(exact.search(vectors[:1], 1)[1][0].tolist()) == [1]


def test_faiss_is_imported_only_by_the_vector_index_package():
    """FAISS, and the module that wraps it, are imported inside ``indexer/vectors/`` alone: the
    rest sees the protocol, the factory, the per-entry view and the package's exports."""
    package = ROOT / "indexer" / "vectors"
    sealed = ("faiss", "indexer.vectors.faiss_index")
    outside = [
        path
        for folder in ("indexer", "search", "semsearch")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if package not in path.parents
    ]
    assert outside and [hit for path in outside for hit in heavy_imports(path, sealed)] == []
    inside = [hit for path in sorted(package.glob("*.py")) for hit in heavy_imports(path, sealed)]
    assert any(hit.endswith(" faiss") for hit in inside)  # the scan sees what it looks for
    assert any(hit.endswith(" indexer.vectors.faiss_index") for hit in inside)


def test_the_import_scan_sees_every_form_of_a_module_import(tmp_path, monkeypatch):
    forms = [
        "import indexer.vectors.faiss_index",
        "from indexer.vectors.faiss_index import FaissIndex",
        "from indexer.vectors import faiss_index",
        "from ..vectors import faiss_index",
        "from ..vectors.faiss_index import PairIndex",
    ]
    monkeypatch.setattr("tests.helpers.ROOT", tmp_path)
    (tmp_path / "indexer" / "store").mkdir(parents=True)
    for i, form in enumerate(forms):
        (tmp_path / "indexer" / "store" / f"m{i}.py").write_text(f"def f():\n    {form}\n")
    (tmp_path / "indexer" / "store" / "fine.py").write_text("from indexer.vectors import unit_length\n")
    found = [
        hit
        for path in sorted((tmp_path / "indexer" / "store").glob("*.py"))
        for hit in heavy_imports(path, ("indexer.vectors.faiss_index",))
    ]
    assert [hit.split(":")[0] for hit in found] == [f"indexer/store/m{i}.py" for i in range(len(forms))]


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("kind", ["flat", "ivf"])
def test_the_factory_opens_each_stored_kind_as_its_implementation(tmp_path, storage, kind):
    """What a version's meta records (storage, and the kind in the file) decides the class that
    reads it back; segments or tombstones make a ``Segments`` view over that base."""
    vectors = clustered(600)
    ids = np.arange(1, 601, dtype=np.int64)
    build_vector_index(vectors[:500], ids[:500], kind, storage).write(tmp_path / "vectors.faiss")
    stored = read_vectors(tmp_path / "vectors.faiss", mmap=True, storage=storage)
    assert type(stored) is (Reranked if storage == "pq" else FaissIndex)
    assert (stored.kind, stored.count, stored.dimension) == (kind, 500, 32)
    assert stored.search(vectors[7:8], 1, allowed=ids[5:9])[1][0].tolist() == [8]
    assert set(side_files(storage)) <= {p.name for p in tmp_path.iterdir()}
    write_segment(tmp_path / segment_name(1), vectors[500:], ids[500:])
    tombstones = np.array([[3, 1]], dtype=np.int64)  # row 3 buried by generation 1
    view = open_vectors(
        tmp_path, "vectors.faiss", Manifest(((1, 100),), 1, 1), tombstones, 599, mmap=True, storage=storage
    )
    assert type(view) is Segments and type(view.base) is type(stored) and view.kind == kind
    assert view.part_shapes() == [(32, 500), (32, 100)] and view.count == 599
    assert 3 not in view.stored()[1] and view.search(vectors[550:551], 1)[1][0].tolist() == [551]


@pytest.mark.slow
def test_the_cli_lists_kinds_and_storages_without_numpy():
    """``semsearch --help`` names every storage (the factory's registry) yet loads no numpy or
    FAISS: the implementations are imported when an index is built or opened."""
    import subprocess
    import sys

    probe = (
        "import sys, search.cli; print(sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'faiss'}))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
