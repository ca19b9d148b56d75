"""The columns an index's table holds: its own (``RESERVED``) and how many fields fit beside them
(``MAX_FIELDS``, SQLite's column limit, asked of SQLite once). The corpus reader checks a file's
names and width against them before anything is stored, so they sit on the lowest floor, under the
reader and the catalog that both use them.
"""

from __future__ import annotations

import sqlite3

RESERVED = ("_rowid", "_id", "_text", "_hash", "_chunks")
"""Column names the index uses for itself; an input field may not take them."""


def _column_limit() -> int:
    db = sqlite3.connect(":memory:")
    try:
        return db.getlimit(sqlite3.SQLITE_LIMIT_COLUMN)
    finally:
        db.close()


MAX_FIELDS = _column_limit() - len(RESERVED)
"""Fields an index holds: SQLite's column limit (2,000 by default) less the index's own columns."""
