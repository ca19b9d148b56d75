"""The on-disk index: one directory, swapped in whole so a failed run never damages the last one.

Layout::

    INDEX_DIR/CURRENT            name of the live version (replaced atomically)
    INDEX_DIR/v-.../vectors.faiss  IndexIDMap over IndexFlatIP of unit float32 vectors
    INDEX_DIR/v-.../meta.db        SQLite: ``entries`` (one row per entry) and ``meta``

FAISS ids are ``entries._rowid``. A chunked document has several vectors under the same id, so a
hit always maps to its row with no guessing. A new version is fully written and fsynced before
``CURRENT`` points to it; older versions are removed only after that.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from indexer.corpus import Entry
from indexer.errors import SemsearchError
from indexer.strategy import Strategy
from indexer.transform import Transform

FORMAT_VERSION = 1
CURRENT = "CURRENT"
VECTORS = "vectors.faiss"
DATABASE = "meta.db"
TRANSFORM = "transform.npz"


@dataclass
class StoredIndex:
    """An opened index: the strategy it was built with, its FAISS index and its database."""

    path: Path
    version: Path
    strategy: Strategy
    meta: dict[str, Any]
    vectors: Any  # faiss.Index
    db: Any  # sqlite_utils.Database
    transform: Transform | None

    def rows(self, rowids: Sequence[int]) -> dict[int, dict[str, Any]]:
        if not rowids:
            return {}
        marks = ",".join("?" * len(rowids))
        cursor = self.db.execute(f"select * from entries where _rowid in ({marks})", list(rowids))
        names = [c[0] for c in cursor.description]
        return {row[0]: dict(zip(names, row, strict=True)) for row in cursor.fetchall()}

    def size_on_disk(self) -> int:
        return sum(f.stat().st_size for f in self.version.iterdir() if f.is_file())


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _prepare_target(index_dir: Path) -> None:
    if index_dir.exists() and not index_dir.is_dir():
        raise SemsearchError(f"{index_dir} exists and is not a directory")
    if index_dir.is_dir() and any(index_dir.iterdir()) and not (index_dir / CURRENT).is_file():
        raise SemsearchError(
            f"{index_dir} exists, is not empty and is not a semsearch index: refusing to overwrite it"
        )
    try:
        index_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SemsearchError(f"cannot create {index_dir}: {exc.strerror}") from None


def write_index(
    index_dir: str | Path,
    strategy: Strategy,
    entries: Sequence[Entry],
    vectors: np.ndarray,
    owners: np.ndarray,
    *,
    source: dict[str, Any],
    transform: Transform | None = None,
) -> Path:
    """Write a complete new version beside the live one, then swap it in. Returns the version dir.

    ``owners[i]`` is the entry (position in ``entries``) that ``vectors[i]`` belongs to.
    """
    import faiss
    import sqlite_utils

    index_dir = Path(index_dir)
    _prepare_target(index_dir)
    version = index_dir / f"v-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}"
    version.mkdir()
    try:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        faiss.normalize_L2(vectors)
        rowids = np.arange(1, len(entries) + 1, dtype=np.int64)
        chunks = np.bincount(owners, minlength=len(entries))
        db = sqlite_utils.Database(version / DATABASE)
        db["entries"].insert_all(
            (
                {"_rowid": int(rowid), "_id": e.id, "_text": e.text, "_chunks": int(n), **e.fields}
                for rowid, e, n in zip(rowids, entries, chunks, strict=True)
            ),
            pk="_rowid",
            alter=True,
            batch_size=1000,
        )
        db["entries"].create_index(["_id"], unique=True)
        meta = {
            "format_version": FORMAT_VERSION,
            "strategy": strategy.to_dict(),
            "model": strategy.model,
            "dimension": int(vectors.shape[1]),
            "count": len(entries),
            "vectors": int(vectors.shape[0]),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "source": source,
        }
        db["meta"].insert_all(({"key": k, "value": json.dumps(v)} for k, v in meta.items()), pk="key")
        db.close()
        index = faiss.IndexIDMap(faiss.IndexFlatIP(int(vectors.shape[1])))
        index.add_with_ids(vectors, rowids[owners])
        faiss.write_index(index, str(version / VECTORS))
        if transform is not None:
            transform.save(version / TRANSFORM)
        for name in (DATABASE, VECTORS, TRANSFORM):
            if (version / name).exists():
                _fsync(version / name)
        _fsync(version)
        pointer = index_dir / f".{CURRENT}.{secrets.token_hex(4)}"
        pointer.write_text(version.name + "\n", encoding="utf-8")
        _fsync(pointer)
        os.replace(pointer, index_dir / CURRENT)
        _fsync(index_dir)
    except BaseException:
        shutil.rmtree(version, ignore_errors=True)
        raise
    _remove_stale(index_dir, keep=version.name)
    return version


def _remove_stale(index_dir: Path, keep: str) -> None:
    """Old versions and leftovers of killed runs; an open reader keeps its unlinked files."""
    for child in index_dir.iterdir():
        if child.name == keep or child.name == CURRENT:
            continue
        if child.name.startswith("v-") and child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
        elif child.name.startswith(f".{CURRENT}."):
            child.unlink(missing_ok=True)


def open_index(index_dir: str | Path) -> StoredIndex:
    """Open the live version, checking everything that could make answers wrong."""
    import sqlite3

    import faiss
    import sqlite_utils

    index_dir = Path(index_dir)
    if not index_dir.is_dir():
        raise SemsearchError(f"no index at {index_dir}")
    try:
        name = (index_dir / CURRENT).read_text(encoding="utf-8").strip()
    except OSError:
        raise SemsearchError(f"{index_dir} is not a semsearch index (no {CURRENT} file)") from None
    version = index_dir / name
    if not name.startswith("v-") or not version.is_dir():
        raise SemsearchError(f"damaged index {index_dir}: {CURRENT} names a missing version {name!r}")
    if not (version / DATABASE).is_file() or not (version / VECTORS).is_file():
        raise SemsearchError(f"damaged index {index_dir}: {DATABASE} or {VECTORS} is missing")
    try:
        db = sqlite_utils.Database(sqlite3.connect(f"file:{version / DATABASE}?mode=ro", uri=True))
        meta = {row["key"]: json.loads(row["value"]) for row in db["meta"].rows}
        count = db["entries"].count
    except (sqlite3.DatabaseError, ValueError, KeyError) as exc:
        raise SemsearchError(f"damaged index {index_dir}: cannot read {DATABASE}: {exc}") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise SemsearchError(
            f"index {index_dir} has format version {meta.get('format_version')!r}; this semsearch "
            f"reads version {FORMAT_VERSION}: rebuild it with 'semsearch index'"
        )
    try:
        vectors = faiss.read_index(str(version / VECTORS))
    except RuntimeError:
        raise SemsearchError(f"damaged index {index_dir}: cannot read {VECTORS}") from None
    if count != meta.get("count") or vectors.ntotal != meta.get("vectors"):
        raise SemsearchError(
            f"damaged index {index_dir}: {count} entries and {vectors.ntotal} vectors, "
            f"expected {meta.get('count')} and {meta.get('vectors')}"
        )
    if vectors.d != meta.get("dimension"):
        raise SemsearchError(f"damaged index {index_dir}: vector dimension {vectors.d} != stored")
    strategy = Strategy.from_dict(meta["strategy"])
    transform = None
    if strategy.postprocess != "none":
        if not (version / TRANSFORM).is_file():
            raise SemsearchError(f"damaged index {index_dir}: {TRANSFORM} is missing")
        transform = Transform.load(version / TRANSFORM)
    return StoredIndex(index_dir, version, strategy, meta, vectors, db, transform)
