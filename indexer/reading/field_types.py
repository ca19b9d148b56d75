"""Column types of stored fields, decided from the values, and a value as its column keeps it.
Plain Python (no SQLite connection): the catalog creates and fills the columns these name.

Field types are decided per column from the rows that first bring it (the build, or the ``add``
that adds the column), so a filter compares numbers as numbers in any corpus format:

- a value counts as a number when it is one (JSON) or when its text reads as one (CSV and TSV
  cells, JSON strings): ``12``, ``-3``, ``9.5``, ``1e3``; not ``1_000``, ``nan`` or ``inf``;
- a *code* is a value SQLite's numeric affinity would turn into a number that is not one here,
  so it would not come back as written: ``007`` or ``02134`` (a leading zero), ``+44`` (a sign),
  ``.5``, an integer past 64 bits written as text (``"99999999999999999999999"``, which SQLite
  would keep as ``1e+23``). A numeric column cannot keep a code as text, so one code makes its
  column ``text``, and an ``add`` that brings one to an existing numeric column has that row rejected
  (``misfit``) rather than its value changed;
- every non-empty value a number -> ``integer`` (all whole) or ``number`` (SQLite NUMERIC). A
  JSON number SQLite cannot hold as written, an integer past 64 bits or -0.0, counts as one: its
  column keeps the nearest number SQLite holds (what filters compare) and the catalog keeps its
  JSON text beside it, given back as the number written (``exact_text``, ``indexer.catalog.exact``);
- more numbers than other text (``"9.5"``, ``"n/a"``, ``"12"``) -> ``number``: the numbers are
  stored and compared as numbers, the text stays text (a filter treats it as unknown in ``<``,
  ``<=``, ``>``, ``>=`` with a number: see ``search.read.filters``);
- otherwise (or any JSON list/object, stored as JSON text, which the catalog gives back as the
  list or object: ``indexer.catalog.structured``) -> ``text``.

The id field's column is ``text`` whatever its values (``indexer.writing.build.survey_corpus``): ids are
text, ``"01"`` and ``"1"`` two of them.

In a numeric column an empty cell (or empty string) is NULL. NUMERIC stores a whole float as an
integer: JSON ``10`` and ``10.0`` both come back as ``10``, ``9.5`` as ``9.5`` (a REAL column
would give ``10.0``). A later ``add`` converts its values to the stored column types the same
way. Upserting an entry replaces all its fields: one missing from the new row becomes NULL.

(sqlite-utils' ``TypeTracker`` cannot express these rules: it is all-or-nothing per column, so
one ``n/a`` makes a price column text, and it calls a JSON float such as 9.5 an integer, as
``int(9.5)`` succeeds.)
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

NUMBER_TEXT = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
"""A number as text; a group matched (a fraction, an exponent): a float."""
SPACE = r"[ \t\n\v\f\r]*"
SQLITE_NUMBER = re.compile(SPACE + r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?" + SPACE)
"""Text that SQLite's INTEGER, NUMERIC and REAL affinities store as a number (tests/test_corpus_fuzz.py
holds it to SQLite's own behaviour)."""
INT64 = 1 << 63
_NUMERIC_START = frozenset("0123456789+-.")
"""How a stripped text that ``NUMBER_TEXT`` or ``SQLITE_NUMBER`` matches can begin."""


def as_number(value: Any) -> int | float | None:
    """The number a value stands for, or None. Whole floats become ints (NUMERIC semantics)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        found = NUMBER_TEXT.fullmatch(text)
        if not found:
            return None
        value = float(text) if found.lastindex else int(text)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return None
        return int(value) if value.is_integer() and abs(value) < INT64 else value
    if isinstance(value, int):
        return value if -INT64 <= value < INT64 else None
    return None


def value_kind(value: Any) -> str | None:
    """How a value counts towards its column's type: ``integer``, ``float``, ``code`` (see the
    module docstring), ``text``, ``structured`` (a list or object); None if empty."""
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        if text[0] not in _NUMERIC_START:  # the common text: neither a number nor a code
            return "text"
        if text.isdigit() and text.isascii() and len(text) < 19 and (text[0] != "0" or len(text) == 1):
            return "integer"  # the common number, a row's id: ``NUMBER_TEXT`` without a sign, within 64 bits
    elif value is None:
        return None
    if isinstance(value, (dict, list)):
        return "structured"
    if type(value) is int:  # a JSON integer, past 64 bits too (``exact_text``)
        return "integer"
    number = as_number(value)
    if number is not None:
        return "integer" if isinstance(number, int) else "float"
    return "code" if SQLITE_NUMBER.fullmatch(value if isinstance(value, str) else str(value)) else "text"


def misfit(row: dict[str, Any], types: dict[str, str]) -> str | None:
    """Why a row's values cannot be stored in the existing columns (``types``: casefolded name ->
    type): a code in a numeric column would come back as another value. None if they fit."""
    for name, value in row.items():
        if types.get(name.casefold(), "text") != "text" and value_kind(value) == "code":
            return (
                f"code in a number column: field {name!r} is {str(value)!r}, which the index's number "
                "column would store as another value (rebuild the index to make the column text)"
            )
    return None


class TypeCounter:
    """Field types decided from rows seen one at a time (constant memory per field), so a
    streamed build types its columns as a whole-corpus ``detect_types`` would."""

    def __init__(self) -> None:
        self.counts: dict[str, Counter] = {}

    def add(self, row: dict[str, Any]) -> None:
        counts = self.counts
        for name, value in row.items():
            kind = value_kind(value)
            seen = counts.get(name)
            if seen is None:  # not ``setdefault``: it would make a Counter per value
                seen = counts[name] = Counter()
            if kind:
                seen[kind] += 1

    def types(self) -> dict[str, str]:
        """Field name -> ``integer``, ``number`` or ``text`` (the rules in the module docstring)."""
        types = {}
        for name, seen in self.counts.items():
            numbers = seen["integer"] + seen["float"]
            if seen["structured"] or seen["code"] or numbers <= seen["text"]:
                types[name] = "text"
            elif seen["float"] or seen["text"]:
                types[name] = "number"
            else:
                types[name] = "integer"
        return types


def detect_types(rows: Iterable[dict[str, Any]]) -> dict[str, str]:
    """Field name -> ``integer``, ``number`` or ``text`` (the rules in the module docstring)."""
    counter = TypeCounter()
    for row in rows:
        counter.add(row)
    return counter.types()


def stored_value(value: Any, field_type: str) -> Any:
    """What the column keeps for ``value``: numbers in numeric columns (empty -> NULL), text in
    text columns, JSON text for lists and objects."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    if field_type == "text":
        if isinstance(value, bool):
            return str(int(value))
        return str(value) if isinstance(value, (int, float)) else value
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    number = as_number(value)
    if number is None and type(value) is int:  # past 64 bits (``exact_text``)
        return _nearest_float(value)
    if number is None:
        return value if isinstance(value, str) else str(value)
    return number


def _nearest_float(value: int) -> float:
    """The float nearest an integer, or the infinity of its sign past the largest float."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def exact_text(value: Any, field_type: str) -> str | None:
    """The JSON text of a JSON number its numeric column would give back as another value: an
    integer past 64 bits (SQLite's INTEGER holds none: its nearest float is stored) or -0.0
    (stored as 0); None for every other value. The catalog keeps it beside the column
    (``indexer.catalog.exact``)."""
    if field_type == "text":
        return None
    if type(value) is int and not -INT64 <= value < INT64:
        return json.dumps(value)
    if type(value) is float and value == 0 and math.copysign(1.0, value) < 0:
        return "-0.0"
    return None


@dataclass(frozen=True)
class Structured:
    """A list or object, or a number its column cannot hold as written (``exact_text``), as
    ``comparable`` gives it: its JSON text, unequal to a string of that text or to the number the
    column holds (the catalog gives each back as it came)."""

    text: str


def comparable(fields: dict[str, Any], types: dict[str, str]) -> dict[str, Any]:
    """Fields as stored (casefolded names, NULLs left out): equal means nothing to update.
    ``types``: casefolded name -> type (``Catalog.types_for``)."""
    out: dict[str, Any] = {}
    for name, value in fields.items():
        field_type = types[name.casefold()]
        kept, exact = stored_value(value, field_type), exact_text(value, field_type)
        if exact is not None or isinstance(value, (dict, list)):
            out[name.casefold()] = Structured(exact or kept)
        elif kept is not None:
            out[name.casefold()] = kept
    return out
