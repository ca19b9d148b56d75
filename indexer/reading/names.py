"""Field names as an index's SQLite columns: checked before anything is stored (no two differing
only in case, none the index uses itself, no more than a table holds), and matched whatever their
case, with the nearest name suggested for one that is missing."""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path

from indexer.columns import MAX_FIELDS, RESERVED
from indexer.errors import BadInput
from indexer.reading.storable import UNSTORABLE


def check_header(header: list[str], path: Path, columns: bool = True) -> None:
    """A CSV or TSV header's names must be names (and, ``columns``, usable as SQLite columns),
    before any row is read."""
    if UNSTORABLE.search("".join(header)):
        raise BadInput(f"{path}: the header row is not valid UTF-8 (or holds a NUL)")
    duplicated = [h for h, n in Counter(header).items() if n > 1]
    if duplicated:
        raise BadInput(f"{path}: duplicate column names: {', '.join(duplicated)}")
    if not columns:
        return
    check_case(header)
    check_field_count(len(header) - ("_id" in header), f"{path} has {len(header)} columns")


def check_case(names: Sequence[str]) -> None:
    """SQLite column names are case-insensitive: 'text' and 'Text' would be one column."""
    first: dict[str, str] = {}
    for name in names:
        other = first.setdefault(name.casefold(), name)
        if other != name:
            raise BadInput(
                f"columns {other!r} and {name!r} differ only in case: SQLite column names are "
                "case-insensitive; rename one"
            )


def check_field_names(names: Iterable[str], id_field: str | None = None) -> None:
    """Field names must be usable as columns: none reserved, no two differing only in case."""
    names = list(names)
    check_case(names)
    clash = sorted(n for n in names if n.casefold() in RESERVED and not (n == "_id" == id_field))
    if clash:
        raise BadInput(f"field names {', '.join(clash)} are reserved: rename them")


def check_field_count(count: int, what: str) -> None:
    """Refuse, before anything is written, more fields than an index's SQLite table holds."""
    if count > MAX_FIELDS:
        raise BadInput(
            f"{what}: an index holds at most {MAX_FIELDS} fields (SQLite's column limit); keep fewer"
        )


def spelled(name: str | None, present: Collection[str]) -> str | None:
    """``name`` as ``present`` spells it: a field name matches whatever its case, as SQLite's
    column names do (an exact match first)."""
    if name is None or name in present:
        return name
    return next((other for other in present if other.casefold() == name.casefold()), name)


def nearest(name: str, present: Collection[str]) -> str:
    """`` (did you mean 'question'?)`` for the field name closest to ``name``, or nothing."""
    folded = {other.casefold(): other for other in present}
    close = difflib.get_close_matches(name.casefold(), list(folded), n=1)
    return f" (did you mean {folded[close[0]]!r}?)" if close else ""
