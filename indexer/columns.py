"""The columns an index's table holds: its own (``RESERVED``) and how many fields fit beside them
(``MAX_FIELDS``). The corpus reader checks a file's names and width against them before anything
is stored, so they sit on the lowest floor, under the reader and the catalog that both use them.
"""

from __future__ import annotations

RESERVED = ("_rowid", "_id", "_text", "_hash", "_chunks")
"""Column names the index uses for itself; an input field may not take them."""

MAX_COLUMNS = 2000
"""The columns an index's table may have: SQLite's default limit (``SQLITE_MAX_COLUMN``), which
every stock build keeps, so an index opens wherever it is copied, whatever SQLite built it."""

MAX_FIELDS = MAX_COLUMNS - len(RESERVED)
"""Fields an index holds: the column limit less the index's own columns."""
