"""Corpus files -> entries to index (id, text, every field of the row), and the rows rejected.

Formats: CSV and TSV with a header, JSON Lines, plain text (one entry per line). A row that cannot
be used is never dropped silently: it is kept as a Rejection with its row number and reason.
Bytes that are not UTF-8 reject their row only (decoded with ``surrogateescape``, then detected).
A CSV quote left open at the end of the file rejects the row that opened it ("unterminated
quote"); the lines it would have swallowed are read again as rows of their own.

The id is the ``--id-field``, else a field ``id``, else ``_id`` (BEIR's corpus.jsonl), else the
row number. ``_id`` is consumed as the id rather than kept as a field. Field names are SQLite
column names, so two names that differ only in case, or a name the index uses itself
(``RESERVED``), are an error naming them.
"""

from __future__ import annotations

import csv
import json
import re
from collections import Counter
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from indexer.errors import BadInput

FORMATS = ("csv", "tsv", "jsonl", "text")
_SUFFIXES = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".tab": "tsv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".txt": "text",
    ".text": "text",
}
RESERVED = ("_rowid", "_id", "_text", "_hash", "_chunks")
"""Column names the index uses for itself; an input field may not take them."""
_SURROGATE = re.compile("[\udc80-\udcff]")
csv.field_size_limit(1 << 30)


@dataclass(frozen=True)
class Entry:
    id: str
    text: str
    fields: dict[str, Any]


@dataclass(frozen=True)
class Rejection:
    row: int
    reason: str


@dataclass
class Corpus:
    entries: list[Entry] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    id_field: str | None = None
    """The field the ids came from (given or detected); None: row numbers."""

    @property
    def rows(self) -> int:
        return len(self.entries) + len(self.rejected)

    def rejection_summary(self) -> str:
        """'2 empty text, 1 duplicate id': reasons grouped by their kind (the part before ':')."""
        kinds = Counter(r.reason.split(":")[0] for r in self.rejected)
        return ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())


def detect_format(path: Path, fmt: str | None) -> str:
    if fmt:
        if fmt not in FORMATS:
            raise BadInput(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
        return fmt
    found = _SUFFIXES.get(path.suffix.lower())
    if found is None:
        raise BadInput(
            f"cannot tell the format of {path.name!r} from its extension: use --format {'|'.join(FORMATS)}"
        )
    return found


def _read_text(path: Path) -> str:
    if not path.exists():
        raise BadInput(f"no such file: {path}")
    if not path.is_file():
        raise BadInput(f"not a file: {path}")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror}") from None
    return raw.removeprefix(b"\xef\xbb\xbf").decode("utf-8", errors="surrogateescape")


Rows = Iterator[tuple[int, "dict[str, Any] | str"]]


def _rows(text: str, fmt: str, path: Path) -> tuple[list[str], Rows]:
    """The header's field names (empty for formats without one) and (row number, row) pairs;
    a string row is the reason it could not be parsed."""
    lines = text.splitlines()
    if fmt == "text":
        return [], ((n, {"text": line}) for n, line in enumerate(lines, 1))
    if fmt == "jsonl":
        return [], (_json_row(n, line) for n, line in enumerate(lines, 1))
    records = _csv_records(text.splitlines(keepends=True), fmt)
    header = next(records, None)
    if not isinstance(header, list) or not any(h.strip() for h in header):
        raise BadInput(f"{path} has no header row")
    if _SURROGATE.search("".join(header)):
        raise BadInput(f"{path}: the header row is not valid UTF-8")
    header = [h.strip() for h in header]
    duplicated = [h for h, n in Counter(header).items() if n > 1]
    if duplicated:
        raise BadInput(f"{path}: duplicate column names: {', '.join(duplicated)}")
    _check_case(header)

    def rows() -> Rows:
        for number, values in enumerate(records, 1):
            if isinstance(values, str):
                yield number, values
            elif not values or not any(v.strip() for v in values):
                yield number, "empty line"
            elif len(values) != len(header):
                yield number, f"wrong field count: {len(values)} fields, header has {len(header)}"
            else:
                yield number, dict(zip(header, values, strict=True))

    return header, rows()


def _csv_records(lines: list[str], fmt: str) -> Iterator[list[str] | str]:
    """CSV/TSV records; a string is why a record was rejected. Parsing is strict, so a quote
    open until the end of the file, or closed lines later by a quote that is followed by more text,
    is an error rather than one field holding the rows after it: that record is rejected and
    parsing resumes on the line after the one it started on."""
    dialect = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if fmt == "tsv" else {}
    start = 0
    while start < len(lines):
        reader = csv.reader(iter(lines[start:]), strict=True, **dialect)
        consumed = 0  # lines taken by the records read so far
        try:
            for values in reader:
                yield values
                consumed = reader.line_num
            return
        except csv.Error as exc:
            opened = start + consumed + 1
            raw = "".join(lines[opened - 1 : start + reader.line_num])
            ran_on = reader.line_num - consumed > 1 or raw.count('"') % 2  # a quote left open
            yield f"unterminated quote: opened on line {opened}" if ran_on else f"bad CSV: {exc}"
            start += consumed + 1


def _check_case(names: Sequence[str]) -> None:
    """SQLite column names are case-insensitive: 'text' and 'Text' would be one column."""
    first: dict[str, str] = {}
    for name in names:
        other = first.setdefault(name.casefold(), name)
        if other != name:
            raise BadInput(
                f"columns {other!r} and {name!r} differ only in case: SQLite column names are "
                "case-insensitive; rename one"
            )


def _json_row(number: int, line: str) -> tuple[int, dict[str, Any] | str]:
    if not line.strip():
        return number, "empty line"
    try:
        row = json.loads(line)
    except ValueError:
        return number, "invalid JSON" + (" (not UTF-8)" if _SURROGATE.search(line) else "")
    return number, row if isinstance(row, dict) else "not a JSON object"


def _text_value(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


def field_text(row: dict[str, Any], names: Sequence[str]) -> str:
    """The named fields' text values, stripped and joined by a space (absent or non-text: skipped)."""
    values = (_text_value(row.get(name)) for name in names)
    return " ".join(part for part in (v.strip() for v in values if v is not None) if part)


def read_corpus(
    path: str | Path,
    *,
    text_fields: Sequence[str] | None = None,
    id_field: str | None = None,
    fmt: str | None = None,
) -> Corpus:
    """Read a corpus file. ``text_fields``: fields joined (by a space) into the embedded text,
    default ``text``. ``id_field``: the external id, default the ``id`` field if rows have one,
    else ``_id``, else the row number."""
    path = Path(path)
    text = _read_text(path)
    fmt = detect_format(path, fmt)
    wanted = list(text_fields or ["text"])
    corpus = Corpus()
    seen: dict[str, int] = {}
    header, rows = _rows(text, fmt, path)
    names: dict[str, None] = dict.fromkeys(header)  # in order of appearance
    if header and id_field is None:
        id_field = _default_id(header)
    for number, row in rows:
        if isinstance(row, str):
            corpus.rejected.append(Rejection(number, row))
            continue
        if not names and id_field is None and fmt == "jsonl":
            id_field = _default_id(row)
        names.update(dict.fromkeys(row))
        reason = _check_row(row, wanted, id_field)
        if reason:
            corpus.rejected.append(Rejection(number, reason))
            continue
        entry_id = str(row[id_field]).strip() if id_field else str(number)
        if entry_id in seen:
            corpus.rejected.append(
                Rejection(number, f"duplicate id: {entry_id!r} (first at row {seen[entry_id]})")
            )
            continue
        seen[entry_id] = number
        joined = field_text(row, wanted)
        if id_field == "_id":
            row = {k: v for k, v in row.items() if k != "_id"}
        corpus.entries.append(Entry(entry_id, joined, row))
    _check_case(list(names))
    clash = sorted(n for n in names if n.casefold() in RESERVED and not (n == "_id" == id_field))
    if clash:
        raise BadInput(f"field names {', '.join(clash)} are reserved: rename them")
    missing = [f for f in [*wanted, *([id_field] if id_field else [])] if names and f not in names]
    if missing:
        raise BadInput(
            f"no row of {path.name} has field {', '.join(map(repr, missing))}; fields are: "
            f"{', '.join(sorted(names))} (choose with --text-field / --id-field)"
        )
    if not corpus.entries:
        detail = f" ({corpus.rejection_summary()})" if corpus.rejected else ""
        raise BadInput(f"empty corpus: no usable rows in {path}{detail}")
    corpus.id_field = id_field
    return corpus


def _default_id(names: Collection[str]) -> str | None:
    return "id" if "id" in names else "_id" if "_id" in names else None


def _check_row(row: dict[str, Any], wanted: Sequence[str], id_field: str | None) -> str | None:
    """Why a parsed row cannot be indexed, or None."""
    for name in wanted:
        if name not in row or row[name] is None:
            return f"missing text: no field {name!r}"
        value = _text_value(row[name])
        if value is None:
            return f"text not a string: field {name!r}"
    if not any(_text_value(row[name]).strip() for name in wanted):
        return "empty text"
    if id_field and (row.get(id_field) is None or not str(row[id_field]).strip()):
        return f"missing id: field {id_field!r}"
    if any("\x00" in v for v in row.values() if isinstance(v, str)):
        return "binary data: NUL bytes"
    if any(_SURROGATE.search(v) for v in row.values() if isinstance(v, str)) or any(
        _SURROGATE.search(k) for k in row
    ):
        return "invalid UTF-8"
    return None
