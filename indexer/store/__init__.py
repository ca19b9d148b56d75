"""The on-disk index: one directory whose versions are swapped in whole, so a failed run never
damages the last one. docs/architecture.md ("The store") gives its layout, integrity checks and
modules; this module names the public API callers import.
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
