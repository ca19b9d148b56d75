"""JSON numbers a numeric column cannot give back as written: an integer past 64 bits (SQLite's
INTEGER holds none) and -0.0 (SQLite stores 0). The column keeps the nearest number SQLite
holds (``indexer.reading.field_types.stored_value``), so filters, groups and facets compare it as
a number; the table ``exact`` keeps each one's JSON text by (row, field), and reading a row
gives the number written. It is kept exact by a trigger in the writer's own transaction, and
made by the first write that stores such a number (an index written before it has none)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from typing import Any

EXACT = "exact"
_SCHEMA = (
    "create table if not exists exact (_rowid integer not null, field text not null,"
    " value text not null, primary key (_rowid, field)) without rowid",
    # a replaced row (``insert or replace``, with ``recursive_triggers``) is deleted first: its numbers go
    "create trigger if not exists exact_delete after delete on entries"
    " begin delete from exact where _rowid = old._rowid; end",
)


def keep(db: sqlite3.Connection, found: Mapping[int, Mapping[str, str]]) -> None:
    """Record these rows' exact numbers (row id -> field name -> JSON text), in the caller's
    transaction, after the rows themselves were written."""
    values = [
        (rowid, name.casefold(), text) for rowid, named in found.items() for name, text in named.items()
    ]
    if not values:
        return
    for statement in _SCHEMA:
        db.execute(statement)
    db.executemany("insert or replace into exact (_rowid, field, value) values (?, ?, ?)", values)


def restore(db: sqlite3.Connection, rows: Mapping[int, dict[str, Any]]) -> None:
    """Put the exact numbers of ``rows`` (row id -> column name -> stored value, the same columns
    in each) in place of the nearest ones their columns hold."""
    if not rows:
        return
    spelled = {name.casefold(): name for name in next(iter(rows.values()))}
    found = db.execute(
        "select _rowid, field, value from exact where _rowid in (select value from json_each(?))",
        (json.dumps([int(r) for r in rows]),),
    )
    for rowid, field, text in found:
        row, name = rows.get(rowid), spelled.get(field)
        if row is not None and name is not None:
            row[name] = json.loads(text)
