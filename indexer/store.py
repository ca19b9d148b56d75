"""The on-disk index: one directory, swapped in whole so a failed run never damages the last one.

Layout::

    INDEX_DIR/CURRENT              name of the live version (replaced atomically)
    INDEX_DIR/.lock                held (flock) by the one writer; readers never take it
    INDEX_DIR/v-.../vectors.faiss  unit vectors, exact or IVF, ids = row ids (``vector_index``)
    INDEX_DIR/v-.../meta.db        SQLite: ``entries`` (one row per entry) and ``meta``
    INDEX_DIR/v-.../transform.npz  fitted centering/whitening, when the strategy has one

FAISS ids are ``entries._rowid``; a chunked document has several vectors under the same id, so a
hit always maps to its row with no guessing, and row ids never change or get reused. Every write
(a build, an add, a delete) makes a complete new version directory (updates start from a copy of
the live one), fsyncs it, and only then points ``CURRENT`` at it. The previous version is kept
one more round so a reader that has just read ``CURRENT`` still finds its files.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from indexer.corpus import Entry
from indexer.errors import BadInput, IndexDamaged, IndexLocked
from indexer.strategy import Strategy
from indexer.transform import Transform
from indexer.vector_index import build_vector_index

FORMAT_VERSION = 1
CURRENT = "CURRENT"
LOCK = ".lock"
VECTORS = "vectors.faiss"
DATABASE = "meta.db"
TRANSFORM = "transform.npz"


def content_hash(text: str) -> str:
    """What decides whether an entry must be embedded again (the strategy is fixed per index)."""
    import hashlib

    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()[:32]


@dataclass
class StoredIndex:
    """An opened index: the strategy it was built with, its FAISS index and its database."""

    path: Path
    version: Path
    strategy: Strategy
    meta: dict[str, Any]
    vectors: Any  # faiss.Index
    db: sqlite3.Connection
    transform: Transform | None

    def rows(self, rowids: Sequence[int]) -> dict[int, dict[str, Any]]:
        if not rowids:
            return {}
        marks = ",".join("?" * len(rowids))
        cursor = self.db.execute(f"select * from entries where _rowid in ({marks})", list(rowids))
        names = [c[0] for c in cursor.description]
        return {row[0]: dict(zip(names, row, strict=True)) for row in cursor.fetchall()}

    def columns(self) -> list[str]:
        return [row[1] for row in self.db.execute("pragma table_info(entries)")]

    def size_on_disk(self) -> int:
        return sum(f.stat().st_size for f in self.version.iterdir() if f.is_file())


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def writer_lock(index_dir: Path) -> Iterator[None]:
    """One writer at a time per index; the kernel drops the lock if the writer dies."""
    with (index_dir / LOCK).open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise IndexLocked(
                f"another semsearch process is writing to {index_dir}: try again when it has finished"
            ) from None
        yield


def prepare_target(index_dir: Path) -> None:
    if index_dir.exists() and not index_dir.is_dir():
        raise BadInput(f"{index_dir} exists and is not a directory")
    occupied = index_dir.is_dir() and any(p.name != LOCK for p in index_dir.iterdir())
    if occupied and not (index_dir / CURRENT).is_file():
        raise BadInput(
            f"{index_dir} exists, is not empty and is not a semsearch index: refusing to overwrite it"
        )
    try:
        index_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"cannot create {index_dir}: {exc.strerror}") from None


def _commit_version(index_dir: Path, fill: Callable[[Path], None]) -> Path:
    """Make a new version directory with ``fill``, make it durable, then make it the live one."""
    version = index_dir / f"v-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}"
    version.mkdir()
    try:
        fill(version)
        for child in version.iterdir():
            _fsync(child)
        _fsync(version)
        previous = live_version(index_dir)
        pointer = index_dir / f".{CURRENT}.{secrets.token_hex(4)}"
        pointer.write_text(version.name + "\n", encoding="utf-8")
        _fsync(pointer)
        os.replace(pointer, index_dir / CURRENT)
        _fsync(index_dir)
    except BaseException:
        shutil.rmtree(version, ignore_errors=True)
        raise
    _remove_stale(index_dir, keep={version.name, previous})
    return version


def live_version(index_dir: Path) -> str | None:
    """Name of the live version directory (what CURRENT says), or None."""
    try:
        return (index_dir / CURRENT).read_text(encoding="utf-8").strip()
    except OSError:
        return None


def _remove_stale(index_dir: Path, keep: set[str | None]) -> None:
    """Older versions and leftovers of killed runs (an open reader keeps its unlinked files)."""
    for child in index_dir.iterdir():
        if child.name in keep:
            continue
        if child.name.startswith("v-") and child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
        elif child.name.startswith(f".{CURRENT}."):
            child.unlink(missing_ok=True)


def _entry_rows(entries: Sequence[Entry], rowids: Sequence[int], chunks: Sequence[int]) -> Iterator[dict]:
    for rowid, entry, n in zip(rowids, entries, chunks, strict=True):
        yield {
            "_rowid": int(rowid),
            "_id": entry.id,
            "_text": entry.text,
            "_hash": content_hash(entry.text),
            "_chunks": int(n),
            **entry.fields,
        }


def _write_meta(db: Any, meta: dict[str, Any]) -> None:
    db["meta"].upsert_all(({"key": k, "value": json.dumps(v)} for k, v in meta.items()), pk="key")


def write_index(
    index_dir: str | Path,
    strategy: Strategy,
    entries: Sequence[Entry],
    vectors: np.ndarray,
    owners: np.ndarray,
    *,
    source: dict[str, Any],
    transform: Transform | None = None,
    index_kind: str = "auto",
    storage: str = "float32",
) -> Path:
    """Write a complete new index beside the live one, then swap it in. Returns the version dir.
    The caller holds ``writer_lock``.

    ``owners[i]`` is the entry (position in ``entries``) that ``vectors[i]`` belongs to.
    """
    import faiss
    import sqlite_utils

    index_dir = Path(index_dir)
    prepare_target(index_dir)
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    faiss.normalize_L2(vectors)
    rowids = np.arange(1, len(entries) + 1, dtype=np.int64)

    def fill(version: Path) -> None:
        db = sqlite_utils.Database(version / DATABASE)
        chunks = np.bincount(owners, minlength=len(entries))
        db["entries"].insert_all(
            _entry_rows(entries, rowids, chunks), pk="_rowid", alter=True, batch_size=1000
        )
        db["entries"].create_index(["_id"], unique=True)
        _write_meta(
            db,
            {
                "format_version": FORMAT_VERSION,
                "strategy": strategy.to_dict(),
                "model": strategy.model,
                "dimension": int(vectors.shape[1]),
                "count": len(entries),
                "vectors": int(vectors.shape[0]),
                "next_rowid": len(entries) + 1,
                "index_kind": index_kind,
                "storage": storage,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "source": source,
            },
        )
        db.close()
        index = build_vector_index(vectors, rowids[owners], index_kind, storage)
        faiss.write_index(index, str(version / VECTORS))
        if transform is not None:
            transform.save(version / TRANSFORM)

    return _commit_version(index_dir, fill)


@dataclass(frozen=True)
class Change:
    """An update to apply to the live index: entries to insert or replace, external ids to drop."""

    upserts: Sequence[Entry] = ()
    vectors: np.ndarray | None = None  # unit vectors of the upserts that need new ones
    owners: np.ndarray | None = None  # position in ``upserts`` of each vector
    reembed: frozenset[str] = frozenset()  # ids among upserts whose vectors are replaced
    deletes: Sequence[str] = ()


def apply_change(index_dir: str | Path, change: Change, *, compact: bool = False) -> Path:
    """Copy the live version, apply ``change`` to the copy, and swap it in (same guarantees as a build).

    Row ids of existing entries never change; new entries get ids never used before. The caller
    holds ``writer_lock``.
    """
    import faiss
    import sqlite_utils

    index_dir = Path(index_dir)
    live = open_index(index_dir, mmap=False)  # changed in memory, written to the new version
    live.db.close()

    def fill(version: Path) -> None:
        shutil.copyfile(live.version / DATABASE, version / DATABASE)
        if (live.version / TRANSFORM).exists():
            shutil.copyfile(live.version / TRANSFORM, version / TRANSFORM)
        db = sqlite_utils.Database(version / DATABASE)
        index = live.vectors
        stored = {
            i: (rowid, chunks) for i, rowid, chunks in db.execute("select _id, _rowid, _chunks from entries")
        }
        existing = {i: rowid for i, (rowid, _) in stored.items()}
        gone = [existing[i] for i in change.deletes if i in existing]
        replaced = [existing[e.id] for e in change.upserts if e.id in change.reembed and e.id in existing]
        if gone or replaced:
            index.remove_ids(np.array(gone + replaced, dtype=np.int64))
        if gone:
            db.execute(f"delete from entries where _rowid in ({','.join('?' * len(gone))})", gone)
        next_rowid = int(live.meta["next_rowid"])
        rowids = []
        for entry in change.upserts:
            if entry.id in existing:
                rowids.append(existing[entry.id])
            else:
                rowids.append(next_rowid)
                next_rowid += 1
        counts = np.zeros(len(change.upserts), dtype=np.int64)
        if change.vectors is not None and len(change.vectors):
            vectors = np.ascontiguousarray(change.vectors, dtype=np.float32)
            faiss.normalize_L2(vectors)
            index.add_with_ids(vectors, np.asarray(rowids, dtype=np.int64)[change.owners])
            counts = np.bincount(change.owners, minlength=len(change.upserts))
        rows = list(_entry_rows(change.upserts, rowids, counts))
        for row, entry in zip(rows, change.upserts, strict=True):
            if entry.id not in change.reembed:  # metadata-only update: its vectors stay
                row["_chunks"] = stored[entry.id][1]
        if rows:
            db["entries"].upsert_all(rows, pk="_rowid", alter=True, batch_size=1000)
        count = db["entries"].count
        _write_meta(
            db,
            {
                "count": count,
                "vectors": int(index.ntotal),
                "next_rowid": next_rowid,
                "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            },
        )
        db.close()
        if compact:
            with sqlite3.connect(version / DATABASE) as raw:
                raw.execute("vacuum")
        faiss.write_index(index, str(version / VECTORS))

    return _commit_version(index_dir, fill)


def open_index(index_dir: str | Path, *, mmap: bool = True) -> StoredIndex:
    """Open the live version, checking everything that could make answers wrong. The vectors are
    memory-mapped (not copied into memory) unless the caller will change them."""
    index_dir = Path(index_dir)
    if not index_dir.is_dir():
        raise BadInput(f"no index at {index_dir}")
    for attempt in range(3):  # a writer may swap versions between reading CURRENT and opening it
        try:
            return _open_version(index_dir, mmap)
        except _VersionGone:
            time.sleep(0.05 * (attempt + 1))
    return _open_version(index_dir, mmap, final=True)


def live_meta(index_dir: str | Path) -> dict[str, Any]:
    """The live version's meta table alone: cheap, no vectors loaded."""
    name = live_version(Path(index_dir))
    if name is None:
        raise BadInput(f"{index_dir} is not a semsearch index (no {CURRENT} file)")
    try:
        with contextlib.closing(
            sqlite3.connect(f"file:{Path(index_dir) / name / DATABASE}?mode=ro", uri=True)
        ) as db:
            return {key: json.loads(value) for key, value in db.execute("select key, value from meta")}
    except (sqlite3.DatabaseError, ValueError) as exc:
        raise IndexDamaged(f"damaged index {index_dir}: cannot read {DATABASE}: {exc}") from None


class _VersionGone(Exception):
    pass


def _open_version(index_dir: Path, mmap: bool, final: bool = False) -> StoredIndex:
    import faiss

    name = live_version(index_dir)
    if name is None:
        raise BadInput(f"{index_dir} is not a semsearch index (no {CURRENT} file)")
    version = index_dir / name
    if not name.startswith("v-") or not version.is_dir():
        if not final and name != live_version(index_dir):
            raise _VersionGone
        raise IndexDamaged(f"damaged index {index_dir}: {CURRENT} names a missing version {name!r}")
    if not (version / DATABASE).is_file() or not (version / VECTORS).is_file():
        raise IndexDamaged(f"damaged index {index_dir}: {DATABASE} or {VECTORS} is missing")
    try:
        db = sqlite3.connect(f"file:{version / DATABASE}?mode=ro", uri=True, check_same_thread=False)
        meta = {key: json.loads(value) for key, value in db.execute("select key, value from meta")}
        (count,) = db.execute("select count(*) from entries").fetchone()
    except (sqlite3.DatabaseError, ValueError) as exc:
        raise IndexDamaged(f"damaged index {index_dir}: cannot read {DATABASE}: {exc}") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise BadInput(
            f"index {index_dir} has format version {meta.get('format_version')!r}; this semsearch "
            f"reads version {FORMAT_VERSION}: rebuild it with 'semsearch index'"
        )
    try:
        flags = getattr(faiss, "IO_FLAG_MMAP_IFC", faiss.IO_FLAG_MMAP) if mmap else 0  # IFC: flat codes too
        vectors = faiss.read_index(str(version / VECTORS), flags)
    except RuntimeError:
        raise IndexDamaged(f"damaged index {index_dir}: cannot read {VECTORS}") from None
    if count != meta.get("count") or vectors.ntotal != meta.get("vectors"):
        raise IndexDamaged(
            f"damaged index {index_dir}: {count} entries and {vectors.ntotal} vectors, "
            f"expected {meta.get('count')} and {meta.get('vectors')}"
        )
    if vectors.d != meta.get("dimension"):
        raise IndexDamaged(f"damaged index {index_dir}: vector dimension {vectors.d} != stored")
    strategy = Strategy.from_dict(meta["strategy"])
    transform = None
    if strategy.postprocess != "none":
        if not (version / TRANSFORM).is_file():
            raise IndexDamaged(f"damaged index {index_dir}: {TRANSFORM} is missing")
        transform = Transform.load(version / TRANSFORM)
    return StoredIndex(index_dir, version, strategy, meta, vectors, db, transform)
