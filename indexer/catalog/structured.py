"""Which stored values are JSON lists or objects. Their column keeps their JSON text, so filters,
groups, facets and keyword search read them as before, but a string field can hold the very same
text (``"{}"``): the table ``structured`` names each (row, field) whose value was a list or object,
and reading a row decodes those alone. It is kept exact by a trigger in the writer's own
transaction, and made by the first write that stores such a value (an index written before it
has none: its values read as text)."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterable, Mapping
from typing import Any

STRUCTURED = "structured"
_SCHEMA = (
    "create table if not exists structured (_rowid integer not null, field text not null,"
    " primary key (_rowid, field)) without rowid",
    # a replaced row (``insert or replace``, with ``recursive_triggers``) is deleted first: its marks go
    "create trigger if not exists structured_delete after delete on entries"
    " begin delete from structured where _rowid = old._rowid; end",
)


def is_structured(value: Any) -> bool:
    """Whether a field's value is stored as JSON text to come back as JSON (a list or an object)."""
    return isinstance(value, (dict, list))


def mark(db: sqlite3.Connection, marks: Mapping[int, Iterable[str]]) -> None:
    """Record that these rows' fields (row id -> names) hold lists or objects, in the caller's
    transaction, after the rows themselves were written."""
    found = [(rowid, name.casefold()) for rowid, names in marks.items() for name in names]
    if not found:
        return
    for statement in _SCHEMA:
        db.execute(statement)
    db.executemany("insert or ignore into structured (_rowid, field) values (?, ?)", found)


def decode(db: sqlite3.Connection, rows: Mapping[int, dict[str, Any]], answered: bool = True) -> None:
    """Turn the marked values of ``rows`` (row id -> column name -> stored value, the same
    columns in each) back into the lists and objects they were, in place. ``answered``: one
    holding NaN or an infinity, which JSON answers cannot carry, stays its text."""
    if not rows:
        return
    spelled = {name.casefold(): name for name in next(iter(rows.values()))}
    marked = db.execute(
        "select _rowid, field from structured where _rowid in (select value from json_each(?))",
        (json.dumps([int(r) for r in rows]),),
    )
    for rowid, field in marked:
        row, name = rows.get(rowid), spelled.get(field)
        if row is not None and name is not None and isinstance(row[name], str):
            with contextlib.suppress(ValueError):  # NaN or an infinity, where answered
                row[name] = json.loads(row[name], parse_constant=_refuse if answered else None)


def _refuse(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON an answer can carry")
