"""Damage is noticed before it is trusted: every file a version needs is checked on each open
(present, the size it was written with, headers that agree), ``info --check`` verifies the
checksums recorded at commit and says which file is damaged (exit 5), and no writer starts on a
damaged index."""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from indexer import Strategy, build_index
from indexer.catalog import Catalog
from indexer.errors import IndexDamaged
from indexer.store import DATABASE, VECTORS, open_index
from indexer.store.meta import IndexMeta
from indexer.vectors.factory import STORAGES
from indexer.vectors.faiss_index import FaissIndex
from indexer.vectors.reranked import FULL_IDS, FULL_VECTORS
from indexer.vectors.segments import segment_name
from indexer.writing.update import add_to_index, compact_index, delete_from_index
from search import SearchEngine
from search.cli import cli
from tests.helpers import BASE, base_index, write_csv


@pytest.fixture
def index(tmp_path, tiny_model, built_once) -> Path:
    return built_once("base flat", functools.partial(base_index, model=tiny_model), tmp_path / "idx")


@pytest.fixture
def pq_index(tmp_path, tiny_model, built_once) -> Path:
    pq = functools.partial(base_index, model=tiny_model, storage="pq")
    return built_once("base pq", pq, tmp_path / "pq")


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def more(tmp_path: Path) -> Path:
    return write_csv(tmp_path / "more.csv", [("n1", "a brand new entry about trams", "app")])


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def info(index_dir: Path, *options: str):
    return CliRunner().invoke(cli, ["info", str(index_dir), *options])


def assert_damaged(result, name: str) -> None:
    """Exit 5, one line naming the damaged file, no Python error."""
    assert result.exit_code == 5, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and name in lines[0] and "unexpected" not in lines[0], result.output


@pytest.mark.parametrize("name", [FULL_IDS, FULL_VECTORS])
def test_pq_index_missing_or_truncated_full_vectors_is_damaged(pq_index, name):
    """pq is chosen by the stored storage kind: without its full vectors it is damaged, it never
    answers from the codes alone."""
    version = open_index(pq_index).version
    (version / name).unlink()
    assert_damaged(info(pq_index), name)
    with pytest.raises(IndexDamaged, match=name):
        SearchEngine(pq_index)


def test_truncated_pq_full_vectors_is_damaged(pq_index):
    truncate(open_index(pq_index).version / FULL_VECTORS, 0.9)
    assert_damaged(info(pq_index), FULL_VECTORS)
    with pytest.raises(IndexDamaged, match=FULL_VECTORS):
        SearchEngine(pq_index)


def test_truncated_vectors_are_noticed_by_info_and_no_writer_starts(index, tmp_path):
    truncate(open_index(index).version / VECTORS, 0.9)
    before = snapshot(index)
    assert_damaged(info(index), VECTORS)
    with pytest.raises(IndexDamaged, match=VECTORS):
        add_to_index(index, more(tmp_path))
    with pytest.raises(IndexDamaged, match=VECTORS):
        delete_from_index(index, ["e1"])
    with pytest.raises(IndexDamaged, match=VECTORS):
        compact_index(index)
    assert {k: v for k, v in snapshot(index).items() if k != ".lock"} == {
        k: v for k, v in before.items() if k != ".lock"
    }


def test_truncated_segment_is_noticed_by_info_and_no_writer_starts(index, tmp_path):
    add_to_index(index, more(tmp_path))
    live = open_index(index)
    segment = segment_name(live.manifest.segments[0][0])
    truncate(live.version / segment, 0.8)
    assert_damaged(info(index), segment)
    with pytest.raises(IndexDamaged, match=segment):
        delete_from_index(index, ["e1"])
    with pytest.raises(IndexDamaged, match=segment):
        add_to_index(index, write_csv(tmp_path / "m2.csv", [("n2", "another one", "app")]))


def test_check_finds_a_changed_byte_that_sizes_cannot(index, tmp_path):
    """Same size, other content: the cheap checks of every open pass, ``info --check`` compares
    the checksum recorded at commit and names the file; a merging writer checks it too."""
    assert info(index, "--check").exit_code == 0
    assert "check:" in info(index, "--check").output
    path = open_index(index).version / VECTORS
    data = bytearray(path.read_bytes())
    data[-40] ^= 0xFF
    path.write_bytes(bytes(data))
    assert info(index).exit_code == 0
    assert_damaged(info(index, "--check"), VECTORS)
    with pytest.raises(IndexDamaged, match=VECTORS):
        compact_index(index)


def test_the_held_graph_is_summed_beside_the_writing(tmp_path, tiny_model, monkeypatch):
    """A build sums its held graph's files (the bulk of a version's bytes) in a thread while the
    vector index and SQLite are written, and records the same sizes and checksums as at the commit:
    ``info --check`` passes, and names a graph file changed after."""
    import threading

    import indexer.store.integrity

    summed = []
    records = indexer.store.integrity.records

    def spied(version, names):
        names = list(names)
        summed.append((threading.current_thread() is threading.main_thread(), names))
        return records(version, names)

    monkeypatch.setattr(indexer.store.integrity, "records", spied)
    build_index(write_csv(tmp_path / "base.csv", BASE), tmp_path / "idx", Strategy(model=tiny_model))
    stored = open_index(tmp_path / "idx")
    graph = f"{stored.meta['graph']}.onnx.data"
    assert [(main, graph in names) for main, names in summed] == [(False, True)]
    assert stored.meta["files"] == records(stored.version, list(stored.meta["files"]))
    assert info(tmp_path / "idx", "--check").exit_code == 0
    data = bytearray((stored.version / graph).read_bytes())
    data[-40] ^= 0xFF
    (stored.version / graph).unlink()  # a hard link of the cache's: changed alone
    (stored.version / graph).write_bytes(bytes(data))
    assert_damaged(info(tmp_path / "idx", "--check"), graph)


def test_check_covers_segments_and_the_database(index, tmp_path):
    add_to_index(index, more(tmp_path))
    result = info(index, "--check")
    assert result.exit_code == 0, result.output
    live = open_index(index)
    segment = live.version / segment_name(live.manifest.segments[0][0])
    data = bytearray(segment.read_bytes())
    data[-20] ^= 0xFF
    segment.write_bytes(bytes(data))
    assert_damaged(info(index, "--check"), segment.name)
    data[-20] ^= 0xFF
    segment.write_bytes(bytes(data))
    database = live.version / DATABASE
    pages = bytearray(database.read_bytes())
    pages[-4096:-4000] = b"\xa5" * 96  # the last page's b-tree header and cell pointers
    database.write_bytes(bytes(pages))
    assert_damaged(info(index, "--check"), DATABASE)


@pytest.mark.parametrize("pointer", [b"\xff\xfe not utf-8\n", b"v-" + b"9" * 5000 + b"\n", b"\x00" * 64])
def test_a_garbled_current_is_damage(index, tmp_path, pointer):
    (index / "CURRENT").write_bytes(pointer)
    assert_damaged(info(index), "CURRENT")
    with pytest.raises(IndexDamaged):
        SearchEngine(index)
    with pytest.raises(IndexDamaged):
        add_to_index(index, more(tmp_path))


MALFORMED = [
    ("count", '"many"'),
    ("vectors", "-1"),
    ("dimension", "null"),
    ("segments", '"none"'),
    ("segments", "[[1]]"),
    ("generation", "1.5"),
    ("hidden", '"0"'),
    ("storage", '"float8"'),
    ("index_kind", "7"),
    ("strategy", "[1, 2]"),
    ("strategy", '{"pooling": 3, "layers": "x"}'),
    ("files", '{"vectors.faiss": "big"}'),
    ("source", '"a file"'),
    ("nprobe", '"eight"'),
    ("vector_kind", '"hnsw"'),
]
"""Meta values not of the type they were written with (key, JSON text)."""


@pytest.mark.parametrize(("key", "value"), MALFORMED)
def test_malformed_meta_values_are_damage(index, key, value):
    import sqlite3

    with sqlite3.connect(open_index(index).version / DATABASE) as db:
        db.execute("insert or replace into meta (key, value) values (?, ?)", (key, value))
    assert_damaged(info(index), key)
    with pytest.raises(IndexDamaged, match=key):
        SearchEngine(index)


@pytest.mark.parametrize(("key", "value"), MALFORMED)
def test_index_meta_names_the_malformed_key(index, key, value):
    meta = dict(open_index(index).meta)
    with pytest.raises(IndexDamaged, match=f"malformed meta in meta.db: {re.escape(key)}"):
        IndexMeta.parse({**meta, key: json.loads(value)}, index)


def on_disk(meta: IndexMeta) -> dict:
    """The keys and JSON values ``Catalog.write_meta`` stores for ``meta``."""
    return {key: json.loads(json.dumps(value)) for key, value in meta.to_dict().items()}


@pytest.mark.parametrize("storage", STORAGES)
def test_every_meta_round_trips_through_index_meta_unchanged(tmp_path, tiny_model, storage):
    """What each writer stores (a build, an append with its segment list, a merge with the
    previous version's name) parses to an ``IndexMeta`` that serialises to the same keys and JSON
    values; so does an index written before the optional keys existed, which stays without them."""
    index = tmp_path / "idx"
    build_index(write_csv(tmp_path / "base.csv", BASE), index, Strategy(model=tiny_model), storage=storage)
    stored = []
    for change in (lambda: None, lambda: add_to_index(index, more(tmp_path)), lambda: compact_index(index)):
        change()
        stored.append(Catalog(open_index(index).version / DATABASE).read_meta())
        assert on_disk(IndexMeta.parse(stored[-1], index)) == stored[-1]
    assert "segments" in stored[1] and stored[2]["previous"] and stored[0].get("storage") == storage
    legacy = {
        k: v for k, v in stored[0].items() if k not in ("storage", "tuned_for", "vector_kind", "nprobe")
    }
    meta = IndexMeta.parse(legacy, index)
    assert on_disk(meta) == legacy and meta.storage_name == "float32" and "storage" not in meta


def test_ivf_on_too_few_rows_is_bad_input(tmp_path, tiny_model):
    corpus = write_csv(tmp_path / "few.csv", BASE[:6])
    for storage in ("float32", "pq"):
        result = CliRunner().invoke(
            cli,
            ["index", str(corpus), "-o", str(tmp_path / "idx"), "--model", tiny_model]
            + ["--index-kind", "ivf", "--storage", storage],
        )
        assert result.exit_code == 1, result.output
        assert "ivf" in result.output and "unexpected" not in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1, result.output
        assert not (tmp_path / "idx").exists()


def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def faiss_no_space(*args, **kwargs):
    raise RuntimeError(
        "Error in faiss::write_index: write error in x.faiss: 0 != 4096 (No space left on device)"
    )


def unchanged(index: Path, before: dict[str, bytes]) -> bool:
    return {k: v for k, v in snapshot(index).items() if k != ".lock"} == {
        k: v for k, v in before.items() if k != ".lock"
    }


@pytest.mark.parametrize("failure", [no_space, faiss_no_space])
def test_a_full_disk_during_add_or_compact_is_one_line_and_changes_nothing(
    index, tmp_path, monkeypatch, failure
):
    import indexer.store.changes

    add_to_index(index, more(tmp_path))  # a segment to compact
    before = snapshot(index)
    with monkeypatch.context() as patch:
        patch.setattr(indexer.store.changes, "write_segment", failure)
        result = CliRunner().invoke(
            cli, ["add", str(index), str(write_csv(tmp_path / "m.csv", [("x", "y z", "a")]))]
        )
    assert result.exit_code == 1 and result.output.strip().splitlines() == [result.output.strip()], (
        result.output
    )
    assert "disk full" in result.output and "unexpected" not in result.output, result.output
    assert unchanged(index, before)
    with monkeypatch.context() as patch:
        patch.setattr(FaissIndex, "write", failure)
        result = CliRunner().invoke(cli, ["compact", str(index)])
    assert result.exit_code == 1 and "disk full" in result.output and "unexpected" not in result.output
    assert unchanged(index, before)
    assert add_to_index(index, write_csv(tmp_path / "m2.csv", [("x", "y z", "a")])).added == 1


def test_a_full_disk_during_index_is_one_line_and_keeps_the_old_index(
    index, tmp_path, monkeypatch, tiny_model
):
    before = snapshot(index)
    monkeypatch.setattr(FaissIndex, "write", no_space)
    corpus = write_csv(tmp_path / "again.csv", BASE)
    for target in (index, tmp_path / "fresh"):
        result = CliRunner().invoke(cli, ["index", str(corpus), "-o", str(target), "--model", tiny_model])
        assert result.exit_code == 1 and "disk full" in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1 and "unexpected" not in result.output
    assert unchanged(index, before) and not (tmp_path / "fresh").exists()


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MB tmpfs (where this process may mount one): a real full disk, large enough for an
    index of the tiny model with the graph it holds (a copy: a link cannot cross filesystems)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    mounting = ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)]
    done = subprocess.run(mounting, capture_output=True)
    if done.returncode:
        pytest.skip("cannot mount a tmpfs here")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.slow
def test_a_real_full_disk(small_disk, tmp_path, tiny_model):
    """Filled to the last byte: add, compact and index say "disk full" in one line, the index
    answers as before, and once space is freed the same add succeeds."""
    build_index(write_csv(tmp_path / "base.csv", BASE), small_disk / "idx", Strategy(model=tiny_model))
    index = small_disk / "idx"
    filler = small_disk / "filler"
    with filler.open("wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 512)
    big = write_csv(
        tmp_path / "big.csv", [(f"n{i}", f"new text number {i} " * 20, "app") for i in range(300)]
    )
    before = snapshot(index)
    for command in (
        ["add", str(index), str(big)],
        ["compact", str(index)],
        ["index", str(big), "-o", str(index)],
    ):
        if command[0] == "index":
            command += ["--model", tiny_model]
        done = subprocess.run([sys.executable, "-m", "search.cli", *command], capture_output=True, text=True)
        assert done.returncode == 1 and "disk full" in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "unexpected" not in done.stderr, done.stderr
        assert open_index(index).meta["count"] == len(BASE)
    assert {k: v for k, v in snapshot(index).items() if k != ".lock"}.keys() <= before.keys() | {".lock"}
    filler.unlink()
    assert add_to_index(index, big).added == 300


def test_a_checksum_is_the_crc_of_the_bytes(tmp_path):
    """A file's checksum (mapped and summed in one call) is the CRC-32 of its bytes; an empty
    file's, which cannot be mapped, is 0."""
    import zlib

    from indexer.store.integrity import checksum

    data = bytes(range(256)) * 5000
    (tmp_path / "some").write_bytes(data)
    (tmp_path / "empty").write_bytes(b"")
    assert checksum(tmp_path / "some") == zlib.crc32(data)
    assert checksum(tmp_path / "empty") == 0
