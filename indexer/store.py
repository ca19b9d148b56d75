"""The on-disk index: one directory, swapped in whole so a failed run never damages the last one.

Layout::

    INDEX_DIR/CURRENT              name of the live version (replaced atomically)
    INDEX_DIR/.lock                held (flock) by the one writer; readers never take it
    INDEX_DIR/v-.../vectors.faiss  unit vectors, exact or IVF, ids = row ids (``vectors``)
    INDEX_DIR/v-.../meta.db        SQLite: ``entries`` (one row per entry) and ``meta``
    INDEX_DIR/v-.../transform.npz  fitted centering/whitening, when the strategy has one
    INDEX_DIR/v-.../.vectors.spool raw vectors of a build in progress (``VersionWriter``), removed
                                   before the version is made live

    INDEX_DIR/v-.../segment-N.faiss vectors added by updates since the version was written
                                   (``vectors.segments``: live ones listed in ``meta``, with tombstones)

FAISS ids are ``entries._rowid``; a chunked document has several vectors under the same id, so a
hit always maps to its row with no guessing, and row ids never change or get reused. A build, a
``compact`` and a merge make a complete new version directory, fsync it, and only then point
``CURRENT`` at it; the previous version is kept one more round so a reader that has just read
``CURRENT`` still finds its files. An ``add`` or ``delete`` costs the change, not the index
(``append_change``): it writes one new segment file into the live version and commits the rows,
the tombstones and the segment list in one SQLite transaction (the atomic swap); a writer killed
before that commit leaves an orphan segment file, removed by the next writer. ``commit_change``
merges instead (a new version) once the segments grow past ``MAX_SEGMENTS`` or the base's size.
``CURRENT`` may only name a plain version directory inside the index (no path separators, no
symlink), so a damaged or tampered pointer can never make a query or a write use another directory.

Integrity: each version's ``meta`` records the size and CRC-32 of its every file but ``meta.db``
(``FILES``; a segment's in its update's transaction) and the version before it (``PREVIOUS``).
Every open checks presence, sizes, headers and meta types (stat calls and header reads: cheap);
``verify`` (``info --check``) and merging writers compare the checksums. Any writer, under the
lock, removes the partial versions killed writers left; a full disk ends as ``DiskFull``.

This module keeps the version logic; the two halves of a version have their own modules:
``catalog`` (SQLite: entries and meta) and ``vectors`` (the vector index).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import shutil
import sqlite3
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from indexer.catalog import Catalog, detect_types
from indexer.corpus import Entry
from indexer.errors import BadInput, DiskFull, IndexDamaged, IndexLocked, SemsearchError
from indexer.fields import vector_ids, with_also_ids
from indexer.strategy import Strategy
from indexer.transform import Transform
from indexer.vectors.base import VectorIndex, shape_of
from indexer.vectors.factory import build_from_parts, open_vectors, refit, side_files
from indexer.vectors.faiss_index import unit_length
from indexer.vectors.files import npy_size, stored_shape
from indexer.vectors.segments import SEGMENT, Manifest, segment_name, write_segment

FORMAT_VERSION = 1
CURRENT = "CURRENT"
LOCK = ".lock"
VECTORS = "vectors.faiss"
DATABASE = "meta.db"
TRANSFORM = "transform.npz"
FILES = "files"
"""Meta key: ``{file name: [size, crc32]}`` of every file of the version but ``meta.db``, written
at commit (a segment's in its own update's transaction)."""
PREVIOUS = "previous"
"""Meta key: the version that was live before this one (kept one more round for readers)."""
VERSION_NAME = re.compile(r"v-[0-9]{8}T[0-9]{6}-[0-9a-f]{8}")
MAX_POINTER = 256
"""Bytes read from CURRENT: a version name is 27."""


@dataclass
class StoredIndex:
    """An opened index: the strategy it was built with, its FAISS index and its catalog."""

    path: Path
    version: Path
    strategy: Strategy
    meta: dict[str, Any]
    vectors: VectorIndex | None
    catalog: Catalog
    transform: Transform | None
    tombstones: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), dtype=np.int64))

    @property
    def manifest(self) -> Manifest:
        return Manifest.of(self.meta)

    def changed(self) -> bool:
        """Whether an update committed into this version since it was opened: one meta row read.
        (A new version is seen through ``CURRENT``.)"""
        try:
            row = self.db.execute("select value from meta where key = 'generation'").fetchone()
        except sqlite3.OperationalError:  # a killed writer's journal: reopen, which rolls it back
            return True
        return (int(row[0]) if row else 0) != self.manifest.generation

    def read_vectors(self) -> VectorIndex:
        """The vectors of this snapshot through a handle of its own (a scan that must not touch
        the index a server's requests share)."""
        return open_vectors(
            self.version,
            VECTORS,
            self.manifest,
            self.tombstones,
            int(self.meta["vectors"]),
            mmap=True,
            storage=self.storage,
        )

    @property
    def storage(self) -> str:
        return self.meta.get("storage", "float32")

    @property
    def db(self) -> Any:  # sqlite3.Connection, read-only
        return self.catalog.db

    def rows(self, rowids: Sequence[int]) -> dict[int, dict[str, Any]]:
        return self.catalog.rows(rowids)

    def columns(self) -> list[str]:
        return self.catalog.columns()

    def size_on_disk(self) -> int:
        return sum(f.stat().st_size for f in self.version.iterdir() if f.is_file())

    def info(self) -> dict[str, Any]:
        """What the CLI's ``info`` and the server's ``/info`` show."""
        from indexer.encoders.factory import encoder_status

        meta, source = self.meta, self.meta.get("source", {})
        if self.vectors is None and "vector_kind" not in meta:  # written before meta kept the kind
            self.vectors = self.read_vectors()
        if self.vectors is None:
            kind, nprobe = meta["vector_kind"], meta.get("nprobe")
        else:
            kind, nprobe = self.vectors.kind, self.vectors.nprobe
        return {
            "path": str(self.path),
            "version": self.version.name,
            "strategy": self.strategy.to_dict(),
            "description": self.strategy.describe(),
            "encoder": encoder_status(self.strategy),
            "model": meta["model"],
            "entries": meta["count"],
            "vectors": meta["vectors"],
            "dimension": meta["dimension"],
            "index_kind": kind,
            "storage": meta.get("storage", "float32"),
            **({"nprobe": int(nprobe)} if kind == "ivf" else {}),
            "size_bytes": self.size_on_disk(),
            "segments": len(self.manifest.segments),
            "created": meta.get("created"),
            "updated": meta.get("updated"),
            "source": source.get("path"),
            "text_fields": list(source.get("text_fields") or []),
            "id_field": source.get("id_field"),
            "also": source.get("also"),
            "fields": self.catalog.field_types(),
        }


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def writer_lock(index_dir: Path, wait: float = 0) -> Iterator[None]:
    """One writer at a time per index; the kernel drops the lock if the writer dies. ``wait``:
    seconds to keep trying while another writer holds it, then ``IndexLocked``."""
    deadline = time.monotonic() + wait
    if not Path(index_dir).is_dir():
        raise BadInput(f"no index at {index_dir}")
    try:
        handle = (Path(index_dir) / LOCK).open("a+")
    except OSError as exc:
        raise BadInput(f"cannot write to {index_dir}: {exc.strerror}") from None
    with handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise IndexLocked(
                        f"another semsearch process is writing to {index_dir}: try again when it has "
                        "finished, or wait for it (--wait SECONDS)"
                    ) from None
                time.sleep(min(0.05, max(deadline - time.monotonic(), 0)))
        _remove_leftovers(Path(index_dir))
        yield


def _remove_leftovers(index_dir: Path) -> None:
    """What killed writers left (a partial version, a pointer file), removed by the next writer
    under the lock: every version directory but the live one and the one before it. An index
    written before versions recorded their predecessor loses only those newer than the live one
    (a partial version is always newer: it was begun after the live one was committed)."""
    try:
        live = live_version(index_dir)
        meta = live_meta(index_dir) if live else {}
    except SemsearchError:
        return  # a damaged or absent index: leave everything for the user to see
    if live is None:
        return
    stamp = live[: len("v-YYYYmmddTHHMMSS")]

    def leftover(name: str) -> bool:
        return PREVIOUS in meta or name[: len(stamp)] > stamp

    _remove_stale(index_dir, keep={live, meta.get(PREVIOUS)}, version=leftover)


def prepare_target(index_dir: Path) -> Path | None:
    """Make sure ``index_dir`` can take an index; returns the topmost directory this created."""
    if index_dir.exists() and not index_dir.is_dir():
        raise BadInput(f"{index_dir} exists and is not a directory")
    occupied = index_dir.is_dir() and any(p.name != LOCK for p in index_dir.iterdir())
    if occupied and not (index_dir / CURRENT).is_file():
        raise BadInput(
            f"{index_dir} exists, is not empty and is not a semsearch index: refusing to overwrite it"
        )
    top, missing = None, index_dir.absolute()
    while not missing.exists():
        top, missing = missing, missing.parent
    try:
        index_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"cannot create {index_dir}: {exc.strerror}") from None
    return top


@contextlib.contextmanager
def building(index_dir: Path, wait: float = 0) -> Iterator[None]:
    """Prepare ``index_dir`` and hold its writer lock for a build. A build that fails before
    any index exists there removes the directories it created: nothing is left behind."""
    made = prepare_target(index_dir)
    with writer_lock(index_dir, wait):
        try:
            yield
        except BaseException:
            if made is not None and _live_or_none(index_dir) is None:
                shutil.rmtree(made, ignore_errors=True)
            raise


def _disk_full(exc: BaseException) -> bool:
    """Whether a write failed for want of space, as each writer says it: an OSError (ENOSPC,
    EDQUOT, or numpy's short write), SQLite's SQLITE_FULL, FAISS's RuntimeError text."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT) or (
            exc.errno is None and "requested and" in str(exc)
        )
    if isinstance(exc, sqlite3.OperationalError):
        return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
    return isinstance(exc, RuntimeError) and "No space left on device" in str(exc)


@contextlib.contextmanager
def _space(index_dir: Path) -> Iterator[None]:
    """A write that runs out of space ends as ``DiskFull`` (its caller has undone its partial files)."""
    try:
        yield
    except Exception as exc:
        if _disk_full(exc):
            raise DiskFull(
                f"disk full: cannot write to {index_dir}; the index is unchanged (free some space and retry)"
            ) from None
        raise


def _commit_version(index_dir: Path, fill: Callable[[Path], None]) -> Path:
    """Make a new version directory with ``fill``, make it durable, then make it the live one."""
    with _space(index_dir):
        return _write_version(index_dir, fill)


def _write_version(index_dir: Path, fill: Callable[[Path], None]) -> Path:
    version = index_dir / f"v-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}"
    version.mkdir()
    pointer = index_dir / f".{CURRENT}.{secrets.token_hex(4)}"
    try:
        fill(version)
        previous = _live_or_none(index_dir)
        catalog = Catalog(version / DATABASE, readonly=False)
        names = [f.name for f in version.iterdir() if f.name != DATABASE]
        catalog.write_meta({FILES: _records(version, names), PREVIOUS: previous})
        catalog.commit()
        catalog.close()
        for child in version.iterdir():
            _fsync(child)
        _fsync(version)
        pointer.write_text(version.name + "\n", encoding="utf-8")
        _fsync(pointer)
    except BaseException:
        shutil.rmtree(version, ignore_errors=True)
        pointer.unlink(missing_ok=True)
        raise
    os.replace(pointer, index_dir / CURRENT)  # the swap: from here on the version is live
    _fsync(index_dir)
    _remove_stale(index_dir, keep={version.name, previous})
    return version


def _checksum(path: Path) -> int:
    """CRC-32 of a file, read in 1 MB blocks (about 3.7 GB/s here: cheap next to writing it)."""
    crc = 0
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            crc = zlib.crc32(block, crc)
    return crc


def _records(version: Path, names: Iterable[str]) -> dict[str, list[int]]:
    return {name: [(version / name).stat().st_size, _checksum(version / name)] for name in names}


def live_version(index_dir: Path) -> str | None:
    """Name of the live version directory (what CURRENT says), or None where there is no
    CURRENT. One that cannot hold a version name (not UTF-8, too long) is damage."""
    try:
        with (index_dir / CURRENT).open("rb") as f:
            raw = f.read(MAX_POINTER + 1)
    except OSError:
        return None
    try:
        name = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        name = None
    if name is None or len(raw) > MAX_POINTER:
        raise IndexDamaged(f"damaged index {index_dir}: {CURRENT} does not hold a version name")
    return name


def _live_or_none(index_dir: Path) -> str | None:
    """``live_version`` for a writer about to replace CURRENT: a damaged one counts as none."""
    try:
        return live_version(index_dir)
    except IndexDamaged:
        return None


def _version_dir(index_dir: Path, name: str) -> Path:
    """The live version's directory. Only a plain ``v-<time>-<hex>`` name (no path separators,
    not a symlink) is accepted, so the directory is always inside ``index_dir``."""
    version = index_dir / name
    if not VERSION_NAME.fullmatch(name) or version.is_symlink():
        plain = re.fullmatch(r"[\w-]+", name) and not version.is_symlink()
        what = f"a missing version {name!r}" if plain else f"{name!r}, which is not a version directory in it"
        raise IndexDamaged(f"damaged index {index_dir}: {CURRENT} names {what}")
    return version


def _remove_stale(
    index_dir: Path, keep: set[str | None], version: Callable[[str], bool] = lambda name: True
) -> None:
    """Older versions (those ``version`` accepts) and leftovers of killed runs (an open reader
    keeps its unlinked files)."""
    for child in index_dir.iterdir():
        if child.name in keep:
            continue
        if child.name.startswith("v-") and child.is_dir() and not child.is_symlink() and version(child.name):
            shutil.rmtree(child, ignore_errors=True)
        elif child.name.startswith(f".{CURRENT}."):
            child.unlink(missing_ok=True)


PART_ROWS = 8192
"""Vectors read back from the spool at a time (12 MB at 384 dimensions)."""


class VersionWriter:
    """A new version filled part by part: entries go to SQLite as they come (one transaction),
    their raw vectors to a spool file beside it, so neither the texts nor the vectors of the
    whole corpus are ever held in memory. ``finish`` builds the vector index from the spool
    (``vectors.factory.build_from_parts``): the index's copy is the only whole one."""

    SPOOL = ".vectors.spool"  # raw float32 vectors; removed before the version is committed
    SPOOL_IDS = ".ids.spool"  # the row id of each (int64)

    def __init__(self, version: Path, field_types: dict[str, str]):
        self.version = version
        self.catalog = Catalog.create(version / DATABASE, field_types)
        self.entries = 0
        self.vectors = 0
        self.dimension: int | None = None
        self._spool = (version / self.SPOOL).open("wb")
        self._spool_ids = (version / self.SPOOL_IDS).open("wb")

    def add(
        self,
        entries: Sequence[Entry],
        vectors: np.ndarray,
        owners: np.ndarray,
        also: np.ndarray | None = None,
    ) -> None:
        """Entries with their vectors; ``owners[i]``: position in ``entries`` of ``vectors[i]``;
        ``also[i]``: it is that entry's also-vector (``indexer.fields``)."""
        rowids = np.arange(self.entries + 1, self.entries + len(entries) + 1, dtype=np.int64)
        self.catalog.put(entries, rowids, np.bincount(owners, minlength=len(entries)))
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if self.dimension is None:
            self.dimension = vectors.shape[1]
        self._spool.write(vectors.tobytes())
        self._spool_ids.write(vector_ids(rowids[owners], also).tobytes())
        self.entries += len(entries)
        self.vectors += len(vectors)

    def parts(self, transform: Transform | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The spooled vectors, ``transform``-ed and unit length, with their row ids."""
        with (self.version / self.SPOOL_IDS).open("rb") as ids:
            for raw in self.raw_parts():
                vectors = np.ascontiguousarray(Transform.apply_optional(transform, raw))
                unit_length(vectors)
                yield vectors, np.fromfile(ids, np.int64, len(vectors))

    def raw_parts(self) -> Iterator[np.ndarray]:
        """The spooled vectors as embedded, ``PART_ROWS`` at a time."""
        with (self.version / self.SPOOL).open("rb") as spool:
            for start in range(0, self.vectors, PART_ROWS):
                rows = min(PART_ROWS, self.vectors - start)
                yield np.fromfile(spool, np.float32, rows * self.dimension).reshape(rows, -1)

    def finish(
        self,
        strategy: Strategy,
        *,
        source: dict[str, Any],
        transform: Transform | None = None,
        index_kind: str = "auto",
        storage: str = "float32",
    ) -> dict[str, Any]:
        """Fit the strategy's transform on the spooled vectors (unless ``transform`` is given: then
        they were transformed already), build and write the vector index; returns the meta written."""
        self._spool.close()
        self._spool_ids.close()
        if not self.entries:
            raise BadInput("nothing to index: no entries")
        given = transform is not None
        if not given:
            transform = Transform.for_strategy(strategy, self.raw_parts())
        dimension = (transform and transform.dimension) or self.dimension
        index = build_from_parts(
            lambda: self.parts(None if given else transform),
            self.vectors,
            dimension,
            index_kind,
            storage,
            directory=self.version,
        )
        (self.version / self.SPOOL).unlink()
        (self.version / self.SPOOL_IDS).unlink()
        meta = {
            "format_version": FORMAT_VERSION,
            "strategy": strategy.to_dict(),
            "model": strategy.model,
            "dimension": int(dimension),
            "count": self.entries,
            "vectors": self.vectors,
            "next_rowid": self.entries + 1,
            "index_kind": index_kind,
            "storage": storage,
            "tuned_for": self.vectors,
            **shape_of(index),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "source": source,
        }
        self.catalog.write_meta(meta)
        self.catalog.commit()
        self.catalog.close()
        index.write(self.version / VECTORS)
        if transform is not None:
            transform.save(self.version / TRANSFORM)
        return meta

    def close(self) -> None:
        """Release the files of an abandoned version (its directory is removed by the caller)."""
        self._spool.close()
        self._spool_ids.close()
        self.catalog.close()


def stream_index(
    index_dir: str | Path, field_types: dict[str, str], fill: Callable[[VersionWriter], None]
) -> Path:
    """Write a complete new index beside the live one, then swap it in. Returns the version dir.
    ``fill`` adds the entries and vectors (``VersionWriter.add``) and calls ``finish``; if it
    raises, the new version is removed and the live one stays. The caller holds ``writer_lock``."""
    index_dir = Path(index_dir)
    prepare_target(index_dir)

    def run(version: Path) -> None:
        writer = VersionWriter(version, field_types)
        try:
            fill(writer)
        finally:
            writer.close()

    return _commit_version(index_dir, run)


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
    also: np.ndarray | None = None,
) -> Path:
    """``stream_index`` for entries and vectors already in memory (vectors transformed already by
    ``transform``, if any). ``owners[i]`` is the entry (position in ``entries``) of ``vectors[i]``;
    ``also[i]``: it is that entry's also-vector (``indexer.fields``)."""

    def fill(writer: VersionWriter) -> None:
        writer.add(entries, vectors, owners, also)
        finish = {"source": source, "index_kind": index_kind, "storage": storage}
        writer.finish(strategy, transform=transform, **finish)

    return stream_index(index_dir, detect_types(e.fields for e in entries), fill)


@dataclass(frozen=True)
class Change:
    """An update to apply to the live index: entries to insert or replace, external ids to drop."""

    upserts: Sequence[Entry] = ()
    vectors: np.ndarray | None = None  # unit vectors of the upserts that need new ones
    owners: np.ndarray | None = None  # position in ``upserts`` of each vector
    also: np.ndarray | None = None  # whether each vector is its entry's also-vector (indexer.fields)
    reembed: frozenset[str] = frozenset()  # ids among upserts whose vectors are replaced
    deletes: Sequence[str] = ()
    meta: Mapping[str, Any] | None = None  # meta keys to set (e.g. a calibration), JSON values


MAX_SEGMENTS = 8
"""Segments a version holds before the next update merges them (each search visits every one)."""


def commit_change(index_dir: str | Path, change: Change) -> Path:
    """Apply an update the cheap way (``append_change``) unless the segments would pass
    ``MAX_SEGMENTS``, or the vectors they add or the vectors tombstones hide would pass half the
    base: then merge everything into a new version (``apply_change``), so a search stays one big
    index plus a few small ones, and an IVF base is not probed mostly for buried vectors.
    Returns the live version. The caller holds ``writer_lock``."""
    index_dir = Path(index_dir)
    live = live_meta(index_dir)
    manifest = Manifest.of(live)
    base = int(live["vectors"]) + manifest.hidden - manifest.segment_vectors
    added = manifest.segment_vectors + (0 if change.vectors is None else len(change.vectors))
    # entries that may bury vectors (``reembed`` also names new ones): a bound, not a count
    hidden = manifest.hidden + len(change.deletes) + len(change.reembed)
    segments = len(manifest.segments) + (change.vectors is not None and len(change.vectors) > 0)
    if segments > MAX_SEGMENTS or 2 * added > base or 2 * hidden > base:
        return apply_change(index_dir, change)
    return append_change(index_dir, change)


@dataclass(frozen=True)
class _Placed:
    """Where a change lands in a catalog: row ids that go, row ids whose vectors are replaced,
    the row id and vector count of each upsert, the next unused row id."""

    gone: list[int]
    replaced: list[int]
    rowids: list[int]
    chunks: np.ndarray
    next_rowid: int


def _place(catalog: Catalog, change: Change, next_rowid: int) -> _Placed:
    """Row ids of existing entries never change; new entries get ids never used before. A
    metadata-only upsert keeps its vector count."""
    known = catalog.rowids([e.id for e in change.upserts] + list(change.deletes))
    gone = [known[i] for i in change.deletes if i in known]
    replaced = [known[e.id] for e in change.upserts if e.id in change.reembed and e.id in known]
    rowids = []
    for entry in change.upserts:
        if entry.id not in known:
            known[entry.id] = next_rowid
            next_rowid += 1
        rowids.append(known[entry.id])
    chunks = np.zeros(len(change.upserts), dtype=np.int64)
    if change.vectors is not None and len(change.vectors):
        chunks = np.bincount(change.owners, minlength=len(change.upserts))
    kept = catalog.rows(
        [r for e, r in zip(change.upserts, rowids, strict=True) if e.id not in change.reembed]
    )
    for i, entry in enumerate(change.upserts):
        if entry.id not in change.reembed:  # metadata-only update: its vectors stay
            chunks[i] = kept[rowids[i]]["_chunks"]
    return _Placed(gone, replaced, rowids, chunks, next_rowid)


def _new_vectors(change: Change, placed: _Placed) -> tuple[np.ndarray, np.ndarray]:
    """The change's vectors at unit length and their FAISS ids."""
    vectors = np.ascontiguousarray(change.vectors, dtype=np.float32)
    unit_length(vectors)
    owners = np.asarray(placed.rowids, dtype=np.int64)[change.owners]
    return vectors, vector_ids(owners, change.also)


def append_change(index_dir: str | Path, change: Change) -> Path:
    """Apply ``change`` inside the live version: its vectors as one new segment file (fsynced),
    then the rows, the tombstones of replaced and deleted rows and the new segment list in one
    SQLite transaction. Disk written is proportional to the change. Returns the live version."""
    index_dir = Path(index_dir)
    with _space(index_dir):
        return _append(index_dir, change)


def _append(index_dir: Path, change: Change) -> Path:
    live = open_index(index_dir, vectors=False)
    live.catalog.close()
    version, manifest = live.version, live.manifest
    for orphan in version.glob(SEGMENT.replace("{:08d}", "*")):  # of a writer killed before its commit
        if orphan.name not in manifest.files():
            orphan.unlink()
    generation = manifest.generation + 1
    segment = version / segment_name(generation)
    catalog = Catalog(version / DATABASE, readonly=False)
    committed = False
    try:
        catalog.db.execute("begin immediate")
        placed = _place(catalog, change, int(live.meta["next_rowid"]))
        segments, added, files = manifest.segments, 0, dict(live.meta.get(FILES, {}))
        if change.vectors is not None and len(change.vectors):
            write_segment(segment, *_new_vectors(change, placed))
            _fsync(segment)
            _fsync(version)
            added = len(change.vectors)
            segments += ((generation, added),)
            files.update(_records(version, [segment.name]))
        buried = placed.gone + placed.replaced
        hidden = int(sum(catalog.values(buried, "_chunks").values()))
        catalog.bury(buried, generation)
        catalog.delete(placed.gone)
        catalog.put(change.upserts, placed.rowids, placed.chunks)
        new_rows = placed.next_rowid - int(live.meta["next_rowid"])
        catalog.write_meta(
            {
                "count": int(live.meta["count"]) - len(placed.gone) + new_rows,
                "vectors": int(live.meta["vectors"]) - hidden + added,
                "next_rowid": placed.next_rowid,
                **Manifest(segments, generation, manifest.hidden + hidden).to_meta(),
                **({FILES: files} if files else {}),
                "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                **(change.meta or {}),
            }
        )
        catalog.commit()
        committed = True
    finally:
        catalog.close()  # without the commit: rolled back
        if not committed:
            segment.unlink(missing_ok=True)
    return version


def apply_change(index_dir: str | Path, change: Change, *, compact: bool = False) -> Path:
    """Copy the live version, apply ``change`` to the copy with its segments merged into the base
    and its tombstones dropped, and swap it in (same guarantees as a build).

    Row ids of existing entries never change; new entries get ids never used before. An upsert
    replaces the entry's fields whole. The vector index is refitted to its new size
    (``vectors.factory.refit``). ``compact`` also vacuums the database. The caller holds ``writer_lock``.
    """
    index_dir = Path(index_dir)
    live = open_index(index_dir, mmap=False)  # changed in memory, written to the new version
    live.catalog.close()
    _verify_files(live)  # it reads the whole index anyway: never carry damage into a new version

    def fill(version: Path) -> None:
        shutil.copyfile(live.version / DATABASE, version / DATABASE)
        if (live.version / TRANSFORM).exists():
            shutil.copyfile(live.version / TRANSFORM, version / TRANSFORM)
        catalog = Catalog(version / DATABASE, readonly=False)
        index = live.vectors.merged()
        placed = _place(catalog, change, int(live.meta["next_rowid"]))
        if placed.gone or placed.replaced:
            index.remove(with_also_ids(placed.gone + placed.replaced))
        catalog.delete(placed.gone)
        if change.vectors is not None and len(change.vectors):
            index.add(*_new_vectors(change, placed))
        catalog.put(change.upserts, placed.rowids, placed.chunks)
        catalog.clear_tombstones()
        index, tuned_for = refit(
            index,
            live.meta["index_kind"],
            live.meta.get("storage", "float32"),
            int(live.meta.get("tuned_for", live.meta["vectors"])),
            retune=compact,
        )
        catalog.write_meta(
            {
                "count": catalog.count(),
                "vectors": int(index.count),
                "next_rowid": placed.next_rowid,
                "tuned_for": tuned_for,
                **shape_of(index),
                **Manifest(generation=live.manifest.generation).to_meta(),
                "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                **(change.meta or {}),
            }
        )
        catalog.commit()
        if compact:
            catalog.vacuum()
        catalog.close()
        index.write(version / VECTORS)

    return _commit_version(index_dir, fill)


def open_index(index_dir: str | Path, *, mmap: bool = True, vectors: bool = True) -> StoredIndex:
    """Open the live version, checking everything that could make answers wrong. The vectors are
    memory-mapped (not copied into memory) unless the caller will change them. ``vectors=False``
    (``info``, an update): the vector files' headers are checked against the meta but FAISS is not
    loaded (nor imported), the rows are not counted (a scan of the whole table), and
    ``StoredIndex.vectors`` is None."""
    index_dir = Path(index_dir)
    if not index_dir.is_dir():
        raise BadInput(f"no index at {index_dir}")
    for attempt in range(3):  # a writer may swap versions between reading CURRENT and opening it
        try:
            return _open_version(index_dir, mmap, vectors)
        except _VersionGone:
            time.sleep(0.05 * (attempt + 1))
    return _open_version(index_dir, mmap, vectors, final=True)


def live_meta(index_dir: str | Path) -> dict[str, Any]:
    """The live version's meta table alone: cheap, no vectors loaded."""
    index_dir = Path(index_dir)
    name = live_version(index_dir)
    if name is None:
        raise BadInput(f"{index_dir} is not a semsearch index (no {CURRENT} file)")
    version = _version_dir(index_dir, name)
    try:
        catalog = Catalog(version / DATABASE)
        with contextlib.closing(catalog.db):
            return catalog.read_meta()
    except (sqlite3.DatabaseError, ValueError) as exc:
        raise IndexDamaged(f"damaged index {index_dir}: cannot read {DATABASE}: {exc}") from None


class _VersionGone(Exception):
    pass


def _open_version(index_dir: Path, mmap: bool, load: bool, final: bool = False) -> StoredIndex:
    name = live_version(index_dir)
    if name is None:
        raise BadInput(f"{index_dir} is not a semsearch index (no {CURRENT} file)")
    version = _version_dir(index_dir, name)
    if not version.is_dir():
        if not final and name != live_version(index_dir):
            raise _VersionGone
        raise IndexDamaged(f"damaged index {index_dir}: {CURRENT} names a missing version {name!r}")
    if not (version / DATABASE).is_file() or not (version / VECTORS).is_file():
        raise IndexDamaged(f"damaged index {index_dir}: {DATABASE} or {VECTORS} is missing")
    Catalog.recover(version / DATABASE)
    try:
        _check_database_header(version / DATABASE)
        catalog = Catalog(version / DATABASE)
        catalog.db.execute("begin")  # meta, count and tombstones of one generation
        meta = catalog.read_meta()
        count = catalog.count() if load else meta.get("count")  # a scan of every row: queries only
        tombstones = catalog.tombstones()
        catalog.db.commit()
    except (sqlite3.DatabaseError, ValueError, OSError) as exc:
        raise IndexDamaged(f"damaged index {index_dir}: cannot read {DATABASE}: {exc}") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise BadInput(
            f"index {index_dir} has format version {meta.get('format_version')!r}; this semsearch "
            f"reads version {FORMAT_VERSION}: rebuild it with 'semsearch index'"
        )
    strategy = _check_meta(index_dir, meta)
    manifest = Manifest.of(meta)
    files = [VECTORS, *manifest.files()]
    _check_files(index_dir, version, meta, [*files, *side_files(meta.get("storage", "float32"))])
    vectors = None
    try:
        if load:
            vectors = open_vectors(
                version,
                VECTORS,
                manifest,
                tombstones,
                int(meta["vectors"]),
                mmap=mmap,
                storage=meta.get("storage", "float32"),
            )
            shapes = vectors.part_shapes()
        else:
            shapes = [stored_shape(version / name) for name in files]
    except (RuntimeError, OSError, ValueError, TypeError):
        raise IndexDamaged(f"damaged index {index_dir}: cannot read {VECTORS} or a segment") from None
    dimension, total = shapes[0][0], sum(n for _, n in shapes) - manifest.hidden
    if count != meta.get("count") or total != meta.get("vectors"):
        raise IndexDamaged(
            f"damaged index {index_dir}: {count} entries and {total} vectors, "
            f"expected {meta.get('count')} and {meta.get('vectors')}"
        )
    if any(d != dimension for d, _ in shapes):
        raise IndexDamaged(f"damaged index {index_dir}: a segment's dimension differs from the base's")
    if dimension != meta.get("dimension"):
        raise IndexDamaged(f"damaged index {index_dir}: vector dimension {dimension} != stored")
    transform = None
    if strategy.postprocess != "none":
        if not (version / TRANSFORM).is_file():
            raise IndexDamaged(f"damaged index {index_dir}: {TRANSFORM} is missing")
        transform = Transform.load(version / TRANSFORM)
    return StoredIndex(index_dir, version, strategy, meta, vectors, catalog, transform, tombstones)


_COUNTS = ("count", "vectors", "dimension", "next_rowid", "generation", "hidden", "tuned_for", "nprobe")


def _check_meta(index_dir: Path, meta: dict[str, Any]) -> Strategy:
    """The meta values the index is read by, of the types it was written with; returns the
    stored strategy. (A hand-edited or damaged value is reported here, not met as a Python error
    deeper in.)"""

    def whole(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    from indexer.vectors.factory import KINDS, STORAGES

    bad = [key for key in _COUNTS if key in meta and not whole(meta[key])]
    bad += [key for key in ("count", "vectors", "dimension", "strategy", "model") if key not in meta]
    segments = meta.get("segments", [])
    if not isinstance(segments, list) or not all(
        isinstance(s, list) and len(s) == 2 and all(map(whole, s)) for s in segments
    ):
        bad.append("segments")
    files = meta.get(FILES, {})
    if not isinstance(files, dict) or not all(
        re.fullmatch(r"[\w-][\w.-]*", name) and isinstance(r, list) and len(r) == 2 and all(map(whole, r))
        for name, r in files.items()
    ):
        bad.append(FILES)
    if meta.get("storage", "float32") not in STORAGES:
        bad.append("storage")
    if meta.get("index_kind", "auto") not in KINDS:
        bad.append("index_kind")
    if meta.get("vector_kind", "flat") not in ("flat", "ivf"):
        bad.append("vector_kind")
    if not isinstance(meta.get("source", {}), dict):
        bad.append("source")
    strategy = None
    if isinstance(meta.get("strategy"), dict):
        try:
            strategy = Strategy.from_dict(meta["strategy"])
        except (SemsearchError, TypeError, ValueError) as exc:
            bad.append(f"strategy ({exc})")
    elif "strategy" not in bad:
        bad.append("strategy")
    if bad:
        raise IndexDamaged(
            f"damaged index {index_dir}: malformed meta in {DATABASE}: {', '.join(sorted(set(bad)))}"
        )
    return strategy


def _check_files(index_dir: Path, version: Path, meta: dict[str, Any], needed: Sequence[str]) -> None:
    """Every file the version needs is there, with the size it was written with (recorded at
    commit) and, for ``.npy`` files, the size its header implies: stat calls and one header read,
    cheap enough for every open. A damaged file is named."""
    recorded = meta.get(FILES, {})
    for name in dict.fromkeys([*needed, *recorded]):
        path = version / name
        if not path.is_file():
            raise IndexDamaged(f"damaged index {index_dir}: {name} is missing")
        size = path.stat().st_size
        expected = [recorded[name][0]] if name in recorded else []
        if name.endswith(".npy"):
            try:
                expected.append(npy_size(path))
            except (OSError, ValueError, SyntaxError) as exc:
                raise IndexDamaged(f"damaged index {index_dir}: cannot read {name}: {exc}") from None
        wrong = next((e for e in expected if e != size), None)
        if wrong is not None:
            raise IndexDamaged(
                f"damaged index {index_dir}: cannot read {name}: it has {size} bytes, {wrong} were written"
            )


def _check_database_header(path: Path) -> None:
    """A SQLite file holds at least the pages its header counts (when that count is current):
    a truncated ``meta.db`` is caught before a query meets a missing page."""
    with path.open("rb") as f:
        header = f.read(100)
    if len(header) < 100 or not header.startswith(b"SQLite format 3\x00"):
        raise ValueError("not a SQLite database")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    if header[24:28] == header[92:96] and path.stat().st_size < page_size * pages:
        raise ValueError(f"truncated: {path.stat().st_size} bytes, {page_size * pages} expected")


def _verify_files(index: StoredIndex) -> int:
    """The full check (``verify``): every file recorded at commit against its checksum. Returns
    the number of files checked."""
    recorded = index.meta.get(FILES, {})
    damaged = [name for name, (_, crc) in recorded.items() if _checksum(index.version / name) != crc]
    if damaged:
        raise IndexDamaged(
            f"damaged index {index.path}: {', '.join(sorted(damaged))} do not match the checksum "
            "written at commit"
        )
    return len(recorded)


def verify(index_dir: str | Path) -> int:
    """``semsearch info --check``: what every open checks, the vectors loaded by FAISS, every
    file against the checksum recorded at commit and ``meta.db`` by SQLite's integrity check.
    Reads the whole index. Returns the number of files checked; damage raises ``IndexDamaged``
    naming the file."""
    index = open_index(index_dir)
    try:
        checked = _verify_files(index)
        try:
            problems = [row[0] for row in index.db.execute("pragma integrity_check")]
        except sqlite3.DatabaseError as exc:
            problems = [str(exc)]
        if problems != ["ok"]:
            raise IndexDamaged(f"damaged index {index.path}: {DATABASE} fails SQLite's check: {problems[0]}")
    finally:
        index.catalog.close()
    return checked + 1
