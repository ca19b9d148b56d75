"""Updates: a change appended into the live version as a segment, or merged into a new version."""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from indexer.catalog import Catalog
from indexer.reading.corpus import Entry
from indexer.store.held import hold_graph
from indexer.store.integrity import records, verify_files
from indexer.store.layout import DATABASE, TRANSFORM, VECTORS
from indexer.store.meta import IndexMeta
from indexer.store.opening import open_index
from indexer.store.versions import committing, fsync, live_meta, space
from indexer.vectors import unit_length
from indexer.vectors.base import shape_of
from indexer.vectors.entries import vector_ids, with_also_ids
from indexer.vectors.factory import refit, write_segment
from indexer.vectors.segments import SEGMENT, Manifest, segment_name


@dataclass(frozen=True)
class Change:
    """An update to apply to the live index: entries to insert or replace, external ids to drop."""

    upserts: Sequence[Entry] = ()
    vectors: np.ndarray | None = None  # unit vectors of the upserts that need new ones
    owners: np.ndarray | None = None  # position in ``upserts`` of each vector
    also: np.ndarray | None = None  # whether each vector is its entry's also-vector (embedding.fields)
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
    manifest = live.manifest or Manifest()
    base = live.vectors + manifest.hidden - manifest.segment_vectors
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
    """The change's vectors at unit length and their vector ids."""
    vectors = np.ascontiguousarray(change.vectors, dtype=np.float32)
    unit_length(vectors)
    owners = np.asarray(placed.rowids, dtype=np.int64)[change.owners]
    return vectors, vector_ids(owners, change.also)


def append_change(index_dir: str | Path, change: Change) -> Path:
    """Apply ``change`` inside the live version: its vectors as one new segment file (fsynced),
    then the rows, the tombstones of replaced and deleted rows and the new segment list in one
    SQLite transaction. Disk written is proportional to the change. Returns the live version."""
    index_dir = Path(index_dir)
    with space(index_dir):
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
        placed = _place(catalog, change, int(live.meta.next_rowid))
        segments, added, files = manifest.segments, 0, dict(live.meta.files or {})
        if change.vectors is not None and len(change.vectors):
            write_segment(segment, *_new_vectors(change, placed))
            fsync(segment)
            fsync(version)
            added = len(change.vectors)
            segments += ((generation, added),)
            files.update(records(version, [segment.name]))
        buried = placed.gone + placed.replaced
        hidden = int(sum(catalog.values(buried, "_chunks").values()))
        catalog.bury(buried, generation)
        catalog.delete(placed.gone)
        catalog.put(change.upserts, placed.rowids, placed.chunks)
        new_rows = placed.next_rowid - int(live.meta.next_rowid)
        meta = live.meta.replace(
            count=live.meta.count - len(placed.gone) + new_rows,
            vectors=live.meta.vectors - hidden + added,
            next_rowid=placed.next_rowid,
            manifest=Manifest(segments, generation, manifest.hidden + hidden),
            files=files or live.meta.files,
            updated=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        )
        catalog.write_meta(meta.merged(change.meta, index_dir).to_dict())
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
    # it reads the whole index anyway: never carry damage into a new version
    verify_files(live.path, live.version, live.meta.files or {})

    def fill(version: Path) -> IndexMeta:
        shutil.copyfile(live.version / DATABASE, version / DATABASE)
        if (live.version / TRANSFORM).exists():
            shutil.copyfile(live.version / TRANSFORM, version / TRANSFORM)
        graph = hold_graph(version, live.strategy, live.graph)
        catalog = Catalog(version / DATABASE, readonly=False)
        index = live.vectors.merged()
        placed = _place(catalog, change, int(live.meta.next_rowid))
        if placed.gone or placed.replaced:
            index.remove(with_also_ids(placed.gone + placed.replaced))
        catalog.delete(placed.gone)
        if change.vectors is not None and len(change.vectors):
            index.add(*_new_vectors(change, placed))
        catalog.put(change.upserts, placed.rowids, placed.chunks)
        catalog.clear_tombstones()
        index, tuned_for = refit(
            index,
            live.meta.index_kind,
            live.meta.storage_name,
            live.meta.vectors if live.meta.tuned_for is None else live.meta.tuned_for,
            retune=compact,
        )
        meta = live.meta.replace(
            count=catalog.count(),
            vectors=int(index.count),
            next_rowid=placed.next_rowid,
            tuned_for=tuned_for,
            **shape_of(index),
            manifest=Manifest(generation=live.manifest.generation),
            updated=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            graph=graph,
        )
        catalog.commit()
        if compact:
            catalog.vacuum()
        catalog.close()
        index.write(version / VECTORS)
        return meta.merged(change.meta, index_dir)

    with committing(index_dir) as pending:
        pending.meta = fill(pending.path)
    return pending.path
