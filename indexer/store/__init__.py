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

Vector ids are ``entries._rowid``; a chunked document has several vectors under the same id, so a
hit always maps to its row with no guessing, and row ids never change or get reused. A build, a
``compact`` and a merge make a complete new version directory, fsync it, and only then point
``CURRENT`` at it. Each reader holds the version it opened (a shared flock on its directory,
``VersionHold``); an older version is removed as soon as no reader holds it (by the writer, or by
the last reader letting go), so the index on disk is its current size. A reader that read
``CURRENT`` just before a swap and finds its version gone opens the new one. An ``add`` or
``delete`` costs the change, not the index (``append_change``): it writes one new segment file
into the live version and commits the rows, the tombstones and the segment list in one SQLite
transaction (the atomic swap); a writer killed before that commit leaves an orphan segment file,
removed by the next writer. ``commit_change`` merges instead (a new version) once the segments
grow past ``MAX_SEGMENTS`` or the base's size. ``CURRENT`` may only name a plain version directory
inside the index (no path separators, no symlink), so a damaged or tampered pointer can never make
a query or a write use another directory.

Integrity: each version's ``meta`` records the size and CRC-32 of its every file but ``meta.db``
(``FILES``; a segment's in its update's transaction) and the version before it (``PREVIOUS``).
Every open checks presence, sizes, headers and meta types (stat calls and header reads: cheap);
``verify`` (``info --check``) and merging writers compare the checksums. Any writer, under the
lock, removes the partial versions killed writers left; a full disk ends as ``DiskFull``.

The two halves of a version have their own modules: ``catalog`` (SQLite: entries and meta)
and ``vectors`` (the vector index). The package is cut by job: ``layout`` (file names and the
store's own meta keys), ``meta`` (``IndexMeta``, the typed meta), ``versions`` (lock,
``CURRENT``, making a version live, cleanup), ``integrity`` (sizes, headers, checksums),
``opening`` (``open_index``, ``verify``), ``writer`` (``new_version``: a new version part by part) and
``changes`` (updates). This module names the public API callers use.
"""

from indexer.store.changes import MAX_SEGMENTS, Change, append_change, apply_change, commit_change
from indexer.store.layout import CURRENT, DATABASE, LOCK, TRANSFORM, VECTORS
from indexer.store.opening import StoredIndex, open_index, verify
from indexer.store.versions import live_meta, live_version, writer_lock
from indexer.store.writer import VersionWriter, new_version, write_index

__all__ = [
    "CURRENT",
    "DATABASE",
    "LOCK",
    "MAX_SEGMENTS",
    "TRANSFORM",
    "VECTORS",
    "Change",
    "StoredIndex",
    "VersionWriter",
    "append_change",
    "apply_change",
    "commit_change",
    "live_meta",
    "live_version",
    "new_version",
    "open_index",
    "verify",
    "write_index",
    "writer_lock",
]
