"""Updates that cost the change, not the index: an ``add`` writes one segment into the live
version, a ``delete`` writes tombstones, both commit in one SQLite transaction; searches merge
the base and the segments (filters, also-vectors, pq storage, duplicates); the merge policy and
``compact`` fold them into a new version; killed writers and merges leave a working index."""

from __future__ import annotations

import functools
import os
import signal
import sqlite3
from pathlib import Path

import pytest

from indexer import Strategy, build_index
from indexer.embedding.fields import FieldScoring
from indexer.errors import IndexMoved
from indexer.store import CURRENT, DATABASE, MAX_SEGMENTS, VECTORS, open_index
from indexer.vectors.segments import segment_name
from indexer.writing.update import add_to_index, compact_index, delete_from_index
from search import SearchEngine
from search.read.duplicates import find_duplicates
from tests.helpers import BASE, base_index, kill_during, rowids, whole_run, write_csv


@pytest.fixture
def index(tmp_path, tiny_model, built_once) -> Path:
    return built_once("base flat", functools.partial(base_index, model=tiny_model), tmp_path / "idx")


def live_ids(index_dir: Path) -> list[int]:
    """The FAISS ids of every live vector, repeats kept (one per vector)."""
    return sorted(open_index(index_dir).vectors.stored()[1].tolist())


def version_files(index_dir: Path) -> dict[str, int]:
    version = index_dir / (index_dir / CURRENT).read_text().strip()
    return {f.name: f.stat().st_mtime_ns for f in version.iterdir()}


def test_add_writes_one_segment_into_the_live_version(index, tmp_path):
    before, files = (index / CURRENT).read_text(), version_files(index)
    update = [("e1", "a completely new text", "billing"), ("n1", "a brand new entry", "app")]
    report = add_to_index(index, write_csv(tmp_path / "u.csv", update))
    assert (report.added, report.updated, report.count) == (1, 1, len(BASE) + 1)
    assert (index / CURRENT).read_text() == before  # no new version: nothing copied
    after = version_files(index)
    assert after[VECTORS] == files[VECTORS]  # the base vectors untouched
    assert set(after) - set(files) == {segment_name(1)}
    live = open_index(index)
    assert live.manifest.segments == ((1, 2),) and live.meta["vectors"] == len(BASE) + 1
    assert live_ids(index) == sorted(rowids(index).values())  # e1's old vector hidden, one each
    engine = SearchEngine(index)
    top = engine.search("a completely new text", k=1)[0]
    assert (top.id, top.score) == ("e1", pytest.approx(1.0, abs=1e-4))
    assert engine.search("a brand new entry", k=1)[0].id == "n1"
    old = engine.search(BASE[1][1], k=len(BASE) + 1)
    assert [h.id for h in old].count("e1") == 1 and old[0].id != "e1"  # only its new vector is live


def test_delete_writes_tombstones_and_filters_see_live_entries_only(index, tmp_path):
    before = (index / CURRENT).read_text()
    add_to_index(index, write_csv(tmp_path / "u.csv", [("n1", "entry about billing again", "billing")]))
    report = delete_from_index(index, ["e1", "n1"])
    assert (report.deleted, report.count) == (2, len(BASE) - 1)
    assert (index / CURRENT).read_text() == before
    engine = SearchEngine(index)
    everything = engine.search("billing", k=100)
    assert len(everything) == len(BASE) - 1 and not {"e1", "n1"} & {h.id for h in everything}
    billing = engine.search("billing", k=100, where="category = 'billing'")
    assert {h.id for h in billing} == {f"e{i}" for i, t in enumerate(BASE) if t[2] == "billing"} - {"e1"}
    assert live_ids(index) == sorted(rowids(index).values())


def test_reader_reloads_when_an_update_commits(index, tmp_path):
    engine = SearchEngine(index)
    assert not engine.reload_if_changed()
    add_to_index(index, write_csv(tmp_path / "u.csv", [("n1", "a brand new entry", "app")]))
    assert engine.reload_if_changed()
    assert engine.search("a brand new entry", k=1)[0].id == "n1"
    stale = engine.snapshot
    delete_from_index(index, ["n1"])  # a snapshot taken before the delete never shows the gone row
    plan = stale.plan(["a brand new entry"], k=5)
    with pytest.raises(IndexMoved):
        stale.run(plan, stale.embed(plan.queries))
    assert "n1" not in {h.id for h in engine.search("a brand new entry", k=5)}


def test_merge_policy_and_compact_fold_segments_into_a_new_version(index, tmp_path):
    versions = set()
    for i in range(MAX_SEGMENTS + 1):
        add_to_index(index, write_csv(tmp_path / "u.csv", [(f"n{i}", f"new entry number {i}", "app")]))
        versions.add((index / CURRENT).read_text())
        segments = open_index(index).manifest.segments
        assert len(segments) == (i + 1 if i < MAX_SEGMENTS else 0)
    assert len(versions) == 2  # appended eight times, then merged into a new version
    delete_from_index(index, ["e0"])
    assert len(open_index(index).tombstones) == 1
    top = {q: SearchEngine(index).search(q, k=3) for q in ("new entry number 3", "bikes")}
    compact_index(index)
    live = open_index(index)
    assert (live.manifest.segments, len(live.tombstones)) == ((), 0)
    assert not any(n.startswith("segment-") for n in version_files(index))
    assert {q: SearchEngine(index).search(q, k=3) for q in top} == top  # same answers, merged
    assert live_ids(index) == sorted(rowids(index).values())


def test_also_vectors_pq_and_duplicates_across_segments(tmp_path, tiny_model):
    rows = [(f"e{i}", f"entry number {i} about {t}", t) for i, t in enumerate(["bikes", "app"] * 20)]
    corpus = write_csv(tmp_path / "base.csv", rows)
    also, pq = tmp_path / "also", tmp_path / "pq"
    build_index(corpus, also, Strategy(model=tiny_model), also=FieldScoring(("category",)))
    build_index(corpus, pq, Strategy(model=tiny_model), storage="pq")
    twin = write_csv(tmp_path / "u.csv", [("twin", rows[3][1], "app"), ("e5", "replaced text", "app")])
    for index_dir in (also, pq):
        add_to_index(index_dir, twin)
        assert open_index(index_dir).manifest.segments  # appended, not merged
        engine = SearchEngine(index_dir)
        hits = engine.search(rows[3][1], k=2, where="category = 'app'")
        assert {h.id for h in hits} == {"e3", "twin"}
        assert engine.search("replaced text", k=1)[0].id == "e5"
        assert "e5" not in {h.id for h in engine.search(rows[5][1], k=3)}  # its old vectors hidden
        assert ["e3", "twin"] in find_duplicates(open_index(index_dir), 0.99).groups
    assert len(live_ids(also)) == 2 * (len(rows) + 1)  # text + also vector each


def test_killed_writer_leaves_an_orphan_segment_and_a_hot_journal_that_are_recovered(index, tmp_path):
    version = index / (index / CURRENT).read_text().strip()
    (version / segment_name(1)).write_bytes(b"half a segment")  # killed before its commit
    pid = os.fork()
    if pid == 0:  # a writer killed inside its SQLite transaction, pages already in the file
        db = sqlite3.connect(version / DATABASE)
        db.execute("pragma cache_size = 1")
        db.execute("begin immediate")
        db.execute("update entries set _text = 'torn ' || _text")
        db.execute("create table filler (x)")
        db.executemany("insert into filler values (?)", [("x" * 1000,)] * 2000)
        os.kill(os.getpid(), signal.SIGKILL)
    os.waitpid(pid, 0)
    assert (version / f"{DATABASE}-journal").exists()
    assert SearchEngine(index).search(BASE[4][1], k=1)[0].text == BASE[4][1]  # rolled back
    add_to_index(index, write_csv(tmp_path / "u.csv", [("n1", "a brand new entry", "app")]))
    assert SearchEngine(index).search("a brand new entry", k=1)[0].id == "n1"  # orphan replaced


@pytest.mark.slow
@pytest.mark.parametrize("operation", ["add", "compact"])
def test_sigkill_during_segment_write_or_merge_leaves_last_complete_state(index, tmp_path, operation):
    extra = write_csv(tmp_path / "x.csv", [(f"x{i}", f"extra entry {i} about app", "app") for i in range(6)])
    add_to_index(index, extra)  # a segment and tombstones for the merge to fold
    delete_from_index(index, ["e0"])
    states = {len(BASE) + 5, len(BASE) + 6}
    small = write_csv(tmp_path / "s.csv", [("s0", "one more entry about parking", "parking")])
    command = ["add", str(index), str(small)] if operation == "add" else ["compact", str(index)]
    if operation == "add":  # kills spread over one whole run's time, however fast this machine is
        took = whole_run(command)
        delays = tuple(took * share for share in (0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95))
    else:
        delays = (0.5, 1.5, "writing", "writing")
    killed = 0
    for when in delays:
        if open_index(index).meta["count"] != len(BASE) + 5:  # the last add finished: undo it
            delete_from_index(index, ["s0"])
        killed += kill_during(command, index, when)
        live = open_index(index)  # counts of the rows, base, segments and tombstones agree
        assert live.meta["count"] in states
        assert SearchEngine(index).search("extra entry 3 about app", k=1)[0].id == "x3"
        assert "e0" not in {h.id for h in SearchEngine(index).search(BASE[0][1], k=5)}
    assert killed >= 2


def test_server_duplicates_follow_a_new_generation(index, tmp_path):
    from fastapi.testclient import TestClient

    from search.server import create_app

    with TestClient(create_app(index)) as client:
        ask = lambda: client.get("/duplicates", params={"min_score": 0.999}).json()["groups"]  # noqa: E731
        assert ask() == []
        add_to_index(index, write_csv(tmp_path / "u.csv", [("twin", BASE[3][1], "app")]))
        client.post("/reload")
        assert ask() == [["e3", "twin"]]
