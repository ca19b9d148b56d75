"""The version directory logic: CURRENT may only name a version inside the index, a writer can
wait for the lock, a failed first build leaves nothing behind, and info() describes the index."""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import re
import threading
from pathlib import Path

import numpy as np
import pytest

from indexer import Strategy, build_index
from indexer.errors import BadInput, IndexDamaged, IndexLocked
from indexer.reading.corpus import Entry
from indexer.store import CURRENT, DATABASE, live_meta, new_version, open_index, writer_lock
from indexer.store.versions import building, prepare_target
from indexer.writing.update import add_to_index, compact_index, delete_from_index, read_ids
from tests.helpers import leave_hot_journal, unwritable


def faq(tmp_path: Path, name: str = "faq.csv", prefix: str = "k") -> Path:
    path = tmp_path / name
    path.write_text(
        "id,text,category\n" + "".join(f"{prefix}{i},question number {i},c{i % 2}\n" for i in range(6)),
        encoding="utf-8",
    )
    return path


@pytest.fixture
def two_indexes(tmp_path, tiny_model) -> tuple[Path, Path]:
    build_index(faq(tmp_path), tmp_path / "idx", Strategy(model=tiny_model))
    build_index(faq(tmp_path, "other.csv", "o"), tmp_path / "other", Strategy(model=tiny_model))
    return tmp_path / "idx", tmp_path / "other"


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


@pytest.mark.parametrize("pointer", ["relative", "absolute", "symlink"])
def test_current_must_name_a_version_inside_the_index(two_indexes, tmp_path, pointer):
    index, other = two_indexes
    foreign = (other / CURRENT).read_text().strip()
    if pointer == "relative":
        name = f"{(index / CURRENT).read_text().strip()}/../../other/{foreign}"
    elif pointer == "absolute":
        name = str(other / foreign)
    else:
        name = "v-20990101T000000-deadbeef"
        os.symlink(other / foreign, index / name)
    (index / CURRENT).write_text(name + "\n")
    before = snapshot(other)
    more = tmp_path / "more.csv"
    more.write_text("id,text\nnew,a new question\n")
    with pytest.raises(IndexDamaged):
        open_index(index)
    with pytest.raises(IndexDamaged):
        delete_from_index(index, ["o1"])
    with pytest.raises(IndexDamaged):
        add_to_index(index, more)
    with pytest.raises(IndexDamaged):
        compact_index(index)
    assert snapshot(other) == before
    assert open_index(other).meta["count"] == 6


def test_writer_waits_for_the_lock_when_asked(tmp_path, tiny_model):
    build_index(faq(tmp_path), tmp_path / "idx", Strategy(model=tiny_model))
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with writer_lock(tmp_path / "idx"):
            taken.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    taken.wait(30)
    try:
        with pytest.raises(IndexLocked):
            delete_from_index(tmp_path / "idx", ["k1"], wait=0.2)
        threading.Timer(0.3, release.set).start()
        report = delete_from_index(tmp_path / "idx", ["k1"], wait=30)
    finally:
        release.set()
        holder.join()
    assert report.deleted == 1


def test_writing_to_a_missing_index_is_one_clear_error(tmp_path):
    with pytest.raises(BadInput, match="no index at"):
        delete_from_index(tmp_path / "nowhere", ["a"])
    with pytest.raises(BadInput, match=f"^no index at {re.escape(str(tmp_path / 'nowhere'))}$"):
        add_to_index(tmp_path / "nowhere", faq(tmp_path))  # as delete, query and info say it
    assert not (tmp_path / "nowhere").exists()


def test_a_lock_that_is_not_a_file_is_named_in_the_error(tmp_path, tiny_model):
    """A ``.lock`` that something else made a folder stops every writer with one line naming it,
    not "cannot write to INDEX: Is a directory" of a folder that is one; the index is unchanged."""
    index = tmp_path / "idx"
    build_index(faq(tmp_path), index, Strategy(model=tiny_model))
    (index / ".lock").unlink()
    (index / ".lock").mkdir()
    said = f"cannot write to {index}: its lock file {index / '.lock'} is a folder"
    with pytest.raises(BadInput, match=f"^{re.escape(said)}"):
        delete_from_index(index, ["k1"])
    assert len(open_index(index).catalog.rowids(["k1"])) == 1


def test_read_ids_from_stdin(monkeypatch):
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"a\n\n b \nc\n"), encoding="utf-8"))
    assert read_ids("-") == ["a", "b", "c"]


def test_failed_first_build_leaves_no_directory(tmp_path, tiny_model):
    bad = tmp_path / "bad.csv"
    bad.write_text("id,text\n1,fine\n")
    target = tmp_path / "new" / "idx"
    with pytest.raises(BadInput):
        build_index(bad, target, Strategy(model=tiny_model, layers=(9,)))  # fails after the directory is made
    assert not target.exists() and not (tmp_path / "new").exists()
    clash = tmp_path / "clash.csv"
    clash.write_text("id,text,Text\n1,a,b\n")
    with pytest.raises(BadInput, match="differ only in case"):
        build_index(clash, target, Strategy(model=tiny_model))
    assert not (tmp_path / "new").exists()
    build_index(faq(tmp_path), tmp_path / "idx", Strategy(model=tiny_model))
    before = snapshot(tmp_path / "idx")
    with pytest.raises(BadInput):
        build_index(bad, tmp_path / "idx", Strategy(model=tiny_model, layers=(9,)))
    assert {k: v for k, v in snapshot(tmp_path / "idx").items() if k != ".lock"} == {
        k: v for k, v in before.items() if k != ".lock"
    }


def test_info_describes_the_index(tmp_path, tiny_model):
    build_index(faq(tmp_path), tmp_path / "idx", Strategy(model=tiny_model), text_fields=["text"])
    info = open_index(tmp_path / "idx").info()
    assert info["entries"] == 6 and info["vectors"] == 6 and info["index_kind"] == "flat"
    assert info["fields"] == {"id": "text", "text": "text", "category": "text"}
    assert info["text_fields"] == ["text"] and info["id_field"] == "id"  # detected, recorded
    assert info["strategy"]["model"] == tiny_model and info["model"] == tiny_model
    assert info["version"] == (tmp_path / "idx" / CURRENT).read_text().strip()
    assert info["size_bytes"] > 0 and "nprobe" not in info and info["storage"] == "float32"


def test_any_writer_removes_a_killed_writers_partial_version(tmp_path, tiny_model):
    """A merge or compact killed mid-write leaves a full-size version directory; the next writer
    (under the lock) removes it."""
    import shutil
    import time

    index = tmp_path / "idx"
    build_index(faq(tmp_path), index, Strategy(model=tiny_model))
    compact_index(index)
    live = (index / CURRENT).read_text().strip()
    writers = (
        lambda: delete_from_index(index, ["k1"]),
        lambda: add_to_index(index, faq(tmp_path, "m.csv", "m")),
    )
    for writer in writers:  # an append, then a merge
        partial = index / f"v-{time.strftime('%Y%m%dT%H%M%S')}-0badf00d"
        shutil.copytree(index / live, partial)  # as a killed compact leaves it: a whole copy
        (partial / "vectors.faiss").write_bytes(b"half")
        writer()
        assert not partial.exists()
        live = (index / CURRENT).read_text().strip()
        assert versions(index) == [live]
        assert open_index(index).meta["count"] >= 5


def versions(index: Path) -> list[str]:
    return sorted(p.name for p in index.iterdir() if p.name.startswith("v-"))


def test_an_index_on_disk_is_its_live_version_once_no_reader_holds_an_older_one(tmp_path, tiny_model):
    """A new version replaces the old one on disk as soon as no reader has the old one open (a
    copy of the index is its current size); a reader that has it open keeps it, whole, until it
    lets go."""
    import gc

    from search.read.engine import SearchEngine

    index = tmp_path / "idx"
    build_index(faq(tmp_path), index, Strategy(model=tiny_model))
    compact_index(index)
    assert versions(index) == [(index / CURRENT).read_text().strip()]
    engine = SearchEngine(index)
    held = engine.snapshot.index.version.name
    compact_index(index)
    live = (index / CURRENT).read_text().strip()
    assert versions(index) == sorted([held, live])
    assert [hit.id for hit in engine.search("question number 3", k=1)] == ["k3"]
    compact_index(index)  # a later writer keeps what a reader still holds too
    assert held in versions(index) and len(versions(index)) == 2
    del engine
    gc.collect()
    assert versions(index) == [(index / CURRENT).read_text().strip()]


@pytest.mark.parametrize("how", ["reload", "close"])
def test_a_reader_lets_go_of_a_version_when_it_reloads_or_closes_not_when_python_collects(
    tmp_path, tiny_model, how
):
    """A reader that moves to a new version (``reload_if_changed``, as a server does after each
    write) or is closed lets go of the old one at once: no old version waits on disk for the
    garbage collector (a running server kept one whole copy of the index per reload)."""
    import gc

    from search.read.engine import SearchEngine

    index = tmp_path / "idx"
    build_index(faq(tmp_path), index, Strategy(model=tiny_model))
    gc.collect()
    gc.disable()  # what a collection now and then would hide
    try:
        with SearchEngine(index) as engine:
            for mode in ("dense", "keyword", "hybrid"):
                assert [hit.id for hit in engine.search("question number 3", k=1, mode=mode)] == ["k3"]
            compact_index(index)
            if how == "reload":
                assert engine.reload_if_changed()
                assert [hit.id for hit in engine.search("question number 3", k=1)] == ["k3"]
                assert versions(index) == [(index / CURRENT).read_text().strip()]
        assert versions(index) == [(index / CURRENT).read_text().strip()]
    finally:
        gc.enable()


def test_a_new_version_is_live_only_after_a_clean_exit_of_its_block(tmp_path, tiny_model):
    """``new_version``: an exception in the block removes the partial version and keeps the live
    one; a clean exit commits it, its meta recording its files and the version before it."""
    import numpy as np

    from indexer.reading.corpus import Entry
    from indexer.store import live_meta, live_version, new_version

    index = tmp_path / "idx"
    build_index(faq(tmp_path), index, Strategy(model=tiny_model))
    before, entries = live_version(index), [Entry("n1", "a new text", {"id": "n1"})]
    vectors = np.ones((1, open_index(index).vectors.dimension), dtype=np.float32)
    with pytest.raises(ValueError, match="stop"), new_version(index, {"id": "text"}) as version:
        version.add(entries, vectors, np.arange(1))
        raise ValueError("stop")
    assert live_version(index) == before and live_meta(index).count == 6
    assert sorted(p.name for p in index.iterdir() if p.name.startswith("v-")) == [before]
    with new_version(index, {"id": "text"}) as version:
        version.add(entries, vectors, np.arange(1))
        version.write(Strategy(model=tiny_model), source={"path": "generated"})
    meta = live_meta(index)
    assert live_version(index) != before and meta.count == 1 and meta.previous == before
    assert "vectors.faiss" in meta.files


def test_a_reader_that_cannot_write_reads_the_last_committed_state(reachable_tmp, tiny_model):
    """A reader that may not write the index (a server run as another user) cannot roll back a
    killed writer's journal: it reads the last committed state from a private copy, and the
    next writer rolls the journal back."""
    index = reachable_tmp / "idx"
    build_index(faq(reachable_tmp), index, Strategy(model=tiny_model))
    journal = leave_hot_journal(index)
    with unwritable(reachable_tmp):
        assert live_meta(index).count == 6
        opened = open_index(index)
        texts = dict(opened.db.execute("select _id, _text from entries"))
        copy = opened.catalog.file
        assert copy != opened.version / DATABASE
        opened.catalog.close()
    assert texts == {f"k{i}": f"question number {i}" for i in range(6)}
    assert journal.exists() and not copy.exists()  # the journal is left for a writer, the copy gone
    assert add_to_index(index, faq(reachable_tmp, "more.csv", "m")).count == 12
    assert not journal.exists()


@pytest.mark.parametrize("first", ["commits", "fails"])
def test_a_second_build_into_a_new_folder_waits_for_the_first(tmp_path, tiny_model, first):
    """Two builds into one new folder: the second says another writer has it (not that the folder
    is no index) and, asked to wait, builds once the first has committed, or failed and removed
    the folder it made."""
    target = tmp_path / "new" / "idx"
    taken, release = threading.Event(), threading.Event()

    def first_build() -> None:
        with contextlib.suppress(RuntimeError), new_version(target, {}) as version:
            taken.set()
            release.wait(30)
            if first == "fails":
                raise RuntimeError("the first build fails")
            entries = [Entry("x", "first build", {})]
            version.add(entries, np.ones((1, 32), dtype=np.float32), np.zeros(1, dtype=np.int64))
            version.write(Strategy(model=tiny_model), source={})

    holder = threading.Thread(target=first_build)
    holder.start()
    taken.wait(30)
    try:
        named = f"another semsearch process is writing to {target} (pid {os.getpid()})"
        with pytest.raises(IndexLocked, match=re.escape(named)):
            build_index(faq(tmp_path), target, Strategy(model=tiny_model))
        threading.Timer(0.3, release.set).start()
        report = build_index(faq(tmp_path), target, Strategy(model=tiny_model), wait=30)
    finally:
        release.set()
        holder.join()
    assert report.entries == 6 and open_index(target).meta["count"] == 6
    assert [p.name for p in target.iterdir() if p.name.startswith("v-")] == [open_index(target).version.name]


def test_a_first_build_interrupted_as_it_takes_its_lock_leaves_no_directory(tmp_path, monkeypatch):
    """Ctrl-C between making the folder and holding its lock (here: as the lock is taken) undoes
    the folder as a failure inside the build does."""

    def interrupted(*_args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("indexer.store.versions._remove_leftovers", interrupted)
    with pytest.raises(KeyboardInterrupt), building(tmp_path / "new" / "idx"):
        pass
    assert not (tmp_path / "new").exists()


def test_an_interrupted_wait_leaves_the_folder_to_the_writer_holding_it(tmp_path, monkeypatch):
    """A build that made the folder but lost the lock to another writer, then is stopped while it
    waits, must not remove the folder under that writer."""
    target = tmp_path / "new" / "idx"
    made = prepare_target
    other: list = []

    def raced(index_dir: Path) -> Path | None:
        top = made(index_dir)
        other.append((index_dir / ".lock").open("a+"))  # another writer takes the lock first
        fcntl.flock(other[0], fcntl.LOCK_EX | fcntl.LOCK_NB)
        return top

    def stopped(_seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("indexer.store.versions.prepare_target", raced)
    monkeypatch.setattr("indexer.store.versions.time.sleep", stopped)
    try:
        with pytest.raises(KeyboardInterrupt), building(target, wait=30):
            pass
        assert (target / ".lock").exists()
    finally:
        other[0].close()
