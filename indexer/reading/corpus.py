"""Corpus files -> entries to index (id, text, every field of the row), and the rows rejected.

Formats: CSV and TSV with a header, JSON Lines, a JSON array, plain text (one entry per
line), parsed by ``indexer.reading.formats``; this module decides what each parsed row is. A row that cannot
be used is never dropped silently: it is kept as a Rejection with its row number and reason.
Bytes that are not UTF-8 reject their row only (decoded with ``surrogateescape``, then detected).
A CSV quote left open at the end of the file rejects the row that opened it ("unterminated
quote"); the lines it would have swallowed are read again as rows of their own.

The id is the ``--id-field``, else a field ``id`` (in JSON: in any row), else ``_id``
(BEIR's corpus.jsonl), else the row number. ``_id`` is consumed as the id rather than kept as a
field. An id is a string or an integer, kept as its exact text (``entry_id``): ``"01"``, ``1`` and
``1.0`` are three ids, and ``1.0``, ``true``, a list or an object reject their row. Field names are
SQLite column names, so two names that differ only in case, a name the index uses itself
(``RESERVED``), or more names than SQLite holds (``MAX_FIELDS``) are an error naming them.

A row is stored as text in SQLite, so a NUL or a surrogate anywhere in it (a name or a value, at
any depth: bytes that are not UTF-8, or a JSON ``\\ud83d`` escape cut from its pair) rejects it,
and so does a value nested deeper than ``MAX_DEPTH``.
"""

from __future__ import annotations

import dataclasses
import json
import unicodedata
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from indexer.errors import BadInput
from indexer.reading.decoding import TooLong, check_encoding, open_file, read_lines
from indexer.reading.formats import (
    Rows,
    detect_format,
    file_delimiter,
    json_array_rows,
    json_row,
    parse_rows,
    record_lines,
)
from indexer.reading.mismatch import check_mismatch, check_split_header
from indexer.reading.names import check_field_count, check_field_names, check_header, nearest, spelled
from indexer.reading.rows import ROWS_NAME, CorpusSource, Spool, is_path
from indexer.reading.storable import (
    UNDECODABLE,
    undecodable_chars,
    undecodable_reason,
    unstorable,
)
from indexer.reading.tsv import QUOTING, Spans, check_quoting

_SAMPLE = 256
"""Undecodable characters kept to guess a file's encoding from."""


@dataclass(frozen=True)
class Entry:
    id: str
    text: str
    fields: dict[str, Any]


@dataclass(frozen=True)
class Rejection:
    row: int
    reason: str
    line: int | None = None
    """The file's line the row starts on (as ``wc -l`` counts); None: rows given in Python, or
    a JSON array's element."""

    def place(self) -> str:
        """Where the row is, as a message names it: ``line 901 (row 5)``, or ``row 5``."""
        return f"row {self.row}" if self.line is None else f"line {self.line} (row {self.row})"


@dataclass
class Corpus:
    entries: list[Entry] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    id_field: str | None = None
    """The field the ids came from (given or detected); None: row numbers."""
    notes: list[str] = field(default_factory=list)
    """What the reader said about how the file was read (``CorpusReader.notes``)."""

    @property
    def rows(self) -> int:
        return len(self.entries) + len(self.rejected)

    def rejection_summary(self) -> str:
        return rejection_summary(self.rejected)


def _json_id_field(path: Path, encoding: str, fmt: str) -> str | None:
    """The id field of a JSON Lines file or JSON array: ``id`` if any row has one, else ``_id`` if
    any row has one, else None (row numbers). Decided by the whole file, so that a first row
    without an id is rejected for it rather than switching the file to row numbers."""
    found = None
    with open_file(path) as handle:
        try:
            for row in _json_rows(path, handle, encoding, fmt):
                if not isinstance(row, dict) or unstorable(row):  # a broken row's names are not names
                    continue
                if "id" in row:
                    return "id"
                if "_id" in row:
                    found = "_id"
        except TooLong:  # refused by the read of the rows, which names its row
            pass
    return found


def _json_rows(path: Path, handle: BinaryIO, encoding: str, fmt: str) -> Iterator[dict[str, Any] | str]:
    """The rows of a JSON file that may have an id (a JSON Lines line without ``id"`` is skipped
    unparsed)."""
    if fmt == "json":
        yield from (row for _, row in json_array_rows(path, handle, encoding))
        return
    for line in record_lines(read_lines(path, handle, encoding)):
        if 'id"' in line or "\\u" in line:  # an id key, escaped or not
            yield json_row(0, line.rstrip("\r\n"))[1]


def entry_id(value: Any) -> str | None:
    """An id as text: a string without its surrounding whitespace, or an integer's digits. None
    for anything else (a float, a boolean, null, a list, an object): ids match as exact text, so
    no value may stand for another (``1.0`` for ``1``), nor print differently from its source."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


UNREAD = frozenset({"Cc", "Cf", "Co", "Cn", "Mn", "Me"})
"""Unicode categories a tokenizer keeps nothing of on their own: controls (NUL), format characters
(zero-width spaces, a BOM), private and unassigned code points, combining marks with no letter."""


def blank(text: str) -> bool:
    """A text with nothing a model reads: only whitespace and ``UNREAD`` characters (it would
    tokenise to the special tokens alone, the same vector for all of them). Such a text is empty."""
    if text[:1].isalnum():  # the common text: a letter or digit first is read
        return False
    return all(c.isspace() or c == "\ufffd" or unicodedata.category(c) in UNREAD for c in text)


def _text_value(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


@dataclass(frozen=True)
class CorpusOptions:
    """How a corpus file is read, the same for every command that reads one (``build_index``,
    ``add_to_index``, ``read_corpus``): a new reading option is one field here."""

    text_fields: tuple[str, ...] | None = None
    """Fields joined (by a space) into the embedded text; None: ``text`` (an add: the index's)."""
    id_field: str | None = None
    """The external id; None: ``id`` if rows have one, else ``_id``, else the row number."""
    fmt: str | None = None
    """``csv``, ``tsv``, ``jsonl`` or ``text``; None: told from the file's extension."""
    encoding: str = "utf-8"
    """The file's encoding."""
    delimiter: str | None = None
    """A CSV file's field separator; None: told from its header."""
    quoting: str = QUOTING
    """How a TSV's quotes are read (``indexer.reading.tsv``): ``auto`` where the file shows a
    writer quoted, ``csv`` always, ``none`` never (quotes are text)."""

    def __post_init__(self) -> None:
        fields = self.text_fields
        if isinstance(fields, str):  # comma-separated, as on the command line
            fields = [name.strip() for name in fields.split(",") if name.strip()]
        elif fields is not None and not isinstance(fields, Iterable):
            raise BadInput(f"text fields: give field names, not {type(fields).__name__}")
        if fields is not None:
            object.__setattr__(self, "text_fields", tuple(fields))

    @classmethod
    def of(cls, options: CorpusOptions | None = None, **given: Any) -> CorpusOptions:
        """``options`` (default: every field's default) with the fields ``given`` as keywords set:
        how the functions that take options also take their fields as keywords."""
        known = [f.name for f in dataclasses.fields(cls)]
        for name in given:
            if name not in known:
                raise BadInput(
                    f"unknown option {name!r}: a corpus is read with {', '.join(known)}; how it "
                    "embeds is a Strategy(model=...) and EmbeddingOptions"
                )
        return dataclasses.replace(options or cls(), **given)


class CorpusReader:
    """A corpus file read row by row, in bounded memory (a block of the file at a time; the ids
    seen so far, to reject duplicates across the whole file). Iterating gives each usable row as
    an ``Entry`` and each other row as a ``Rejection``, in file order; the checks that need the
    whole file (a file read the wrong way: ``indexer.reading.mismatch``; field names, an empty
    corpus) raise ``BadInput`` at the end of the iteration.
    Every iteration reads the file again and gives the same items."""

    def __init__(
        self,
        path: CorpusSource,
        options: CorpusOptions | None = None,
        *,
        first_row_id: int | None = None,
        check: Callable[[dict[str, Any]], str | None] | None = None,
        columns: bool = True,
        **given: Any,
    ):
        """``options``: how to read the file (``CorpusOptions``), or its fields as keywords.
        ``columns``: the rows' fields become an index's SQLite columns, so their names are checked
        as columns (``encode`` stores none: 'Text' and 'text' are two fields there)."""
        options = CorpusOptions.of(options, **given)
        fmt = options.fmt
        self.name: str | None = None
        """What messages call rows given in Python (None: a file, named by its path)."""
        if not is_path(path):  # rows: read from a spool file as JSON Lines (indexer.reading.rows)
            self._spool = Spool(path)
            path, fmt, self.name = self._spool.path, "jsonl", ROWS_NAME
        self.path = Path(path)
        open_file(self.path).close()  # a missing or unreadable file is the first error
        self.encoding = check_encoding(options.encoding)
        self.fmt = detect_format(self.path, fmt, self.encoding)
        self.delimiter = file_delimiter(self.path, self.fmt, options.delimiter, self.encoding)
        """A CSV file's field separator, given or told from its header; None for other formats."""
        self.quoting = check_quoting(options.quoting)
        self.notes: list[str] = []
        """What the last full read has to say about how the file was read (quoted fields that
        span lines), one line each."""
        self.text_fields = list(options.text_fields or ["text"])
        self.id_field = options.id_field
        """The field the ids come from (given, or detected by the first iteration); None: row numbers."""
        self.first_row_id = first_row_id
        """Ids are row numbers counted from this, whatever fields the rows have (an ``add`` to an
        index built on row numbers: its next unused one); None: from ``id_field`` or detected."""
        self.columns = columns
        self.ids_from: str | None = None
        """The field the current read takes ids from, as soon as it is known (before its first
        row: a streamed build types that column as text from its first part on)."""
        self.check = check
        """A further check of each row that would be an entry (an ``add``: does it fit the index's
        columns): the reason it cannot be, or None."""

    def __iter__(self) -> Iterator[Entry | Rejection]:
        path, fmt, id_field = self.path, self.fmt, self.id_field
        if self.first_row_id is not None:
            id_field = None
        elif fmt in ("jsonl", "json") and id_field is None:
            id_field = _json_id_field(path, self.encoding, fmt)
        tally = _Tally()
        with open_file(path) as handle:
            header, rows = parse_rows(
                handle, fmt, path, self.encoding, self.delimiter, self.quoting, tally.spans
            )
            wanted = self.text_fields
            if header:
                check_header(header, path, self.columns)
                tally.names.update(dict.fromkeys(header))
                if id_field is None and self.first_row_id is None:
                    id_field = _default_id(header)
                wanted, id_field = [spelled(n, header) for n in wanted], spelled(id_field, header)
            self.ids_from = id_field
            yield from self._items(rows, wanted, id_field, tally)
        self._finish(tally, wanted, id_field, len(header))

    def _items(
        self, rows: Rows, wanted: list[str], id_field: str | None, tally: _Tally
    ) -> Iterator[Entry | Rejection]:
        """Each parsed row as an entry or a rejection: the per-row work of a read, kept to the
        checks every row needs (a row whose fields are named as asked skips the spelling)."""
        first, check = self.first_row_id, self.check
        lines = not self.name  # rows given in Python have no lines
        asked = {*wanted, *([id_field] if id_field else [])}
        names, seen, kinds = tally.names, tally.seen, tally.kinds
        for number, line, row in _naming(rows, self.name or self.path, lines):
            row_wanted, row_id = wanted, id_field
            line = line if lines else None
            if isinstance(row, str):
                reason = row
            else:
                reason = unstorable(row)
                if not reason:  # the names of a row with a NUL or a surrogate are not names
                    names.update(dict.fromkeys(row))
                    if not row.keys() >= asked:  # JSON Lines: names as this row has them
                        row_wanted, row_id = [spelled(n, row) for n in wanted], spelled(id_field, row)
                    reason = _check_row(row, row_wanted, row_id) or (check and check(row))
            if not reason:
                key = entry_id(row[row_id]) if row_id else str(number + (first or 1) - 1)
                if key in seen:
                    reason = f"duplicate id: {key!r} (first at row {seen[key]})"
            if reason == UNDECODABLE:
                found = undecodable_chars(row)
                tally.undecodable += found[: max(0, _SAMPLE - len(tally.undecodable))]
                reason = undecodable_reason(found, self.encoding)
            if reason:
                kinds[_kind(reason)] += 1
                yield Rejection(number, reason, line)
                continue
            seen[key] = number
            joined = field_text(row, row_wanted)
            if row_id == "_id":
                row = {k: v for k, v in row.items() if k != "_id"}
            tally.entries += 1
            yield Entry(key, joined, row)

    def _finish(self, tally: _Tally, wanted: list[str], id_field: str | None, width: int) -> None:
        """The checks that need the whole file, once it is read (module and class docstrings)."""
        path, names, kinds = self.path, tally.names, tally.kinds
        rows = tally.entries + kinds.total()
        self.notes = tally.spans.describe(str(self.name or path), rows)
        check_mismatch(
            self.name or path,
            kinds,
            rows,
            fmt=self.fmt,
            delimiter=self.delimiter,
            encoding=self.encoding,
            width=width,
            undecodable=bytes(ord(char) - 0xDC00 for char in tally.undecodable),  # surrogateescape's bytes
            spans=tally.spans,
        )
        wanted, id_field = [spelled(n, names) for n in wanted], spelled(id_field, names)
        if self.columns:
            check_field_names(names, id_field)
            shown = self.name or path
            check_field_count(len(names) - ("_id" in names), f"the rows of {shown} have {len(names)} fields")
        missing = [f for f in [*wanted, *([id_field] if id_field else [])] if names and f not in names]
        if missing:
            check_split_header(self.name or path.name, list(names), self.fmt, self.delimiter)
            raise BadInput(
                f"no row of {self.name or path.name} has field {', '.join(map(repr, missing))}"
                f"{nearest(missing[0], names)}; fields are: {', '.join(sorted(names))} "
                "(choose with --text-field / --id-field)"
            )
        self.text_fields = wanted
        if not tally.entries:
            detail = f" ({_summary(kinds)})" if kinds else ""
            raise BadInput(f"empty corpus: no usable rows in {self.name or path}{detail}")
        self.id_field = id_field


@dataclass
class _Tally:
    """What one read of a corpus counts as it goes, for the checks at its end."""

    names: dict[str, None] = field(default_factory=dict)
    """Every field name, in order of appearance."""
    seen: dict[str, int] = field(default_factory=dict)
    """Each id given so far -> its row number."""
    kinds: Counter = field(default_factory=Counter)
    """Rejections by kind."""
    entries: int = 0
    undecodable: str = ""
    """The characters that stand for bytes the encoding could not decode (a sample)."""
    spans: Spans = field(default_factory=Spans)


def _naming(rows: Rows, name: Path | str, lines: bool) -> Rows:
    """``rows``, a line or field too long among them refused naming the row it is in (the one
    after the last given) and the file as ``name``."""
    number = 0
    try:
        for number, line, row in rows:
            yield number, line, row
    except TooLong as exc:
        raise exc.named(name, number + 1, lines) from None


def field_text(row: dict[str, Any], names: Sequence[str]) -> str:
    """The named fields' text values, stripped and joined by a space (absent or non-text: skipped)."""
    if len(names) == 1:  # the common case, without a join
        value = _text_value(row.get(names[0]))
        return "" if value is None else value.strip()
    values = (_text_value(row.get(name)) for name in names)
    return " ".join(part for part in (v.strip() for v in values if v is not None) if part)


def read_corpus(
    path: CorpusSource,
    options: CorpusOptions | None = None,
    *,
    first_row_id: int | None = None,
    check: Callable[[dict[str, Any]], str | None] | None = None,
    **given: Any,
) -> Corpus:
    """Read a whole corpus file into memory (``CorpusReader`` streams it): ``options`` (or its
    fields as keywords) say how. Ids are row numbers counted from ``first_row_id``, if given,
    whatever the fields; ``check``: a further check of each row."""
    reader = CorpusReader(path, options, first_row_id=first_row_id, check=check, **given)
    corpus = Corpus()
    for item in reader:
        (corpus.entries if isinstance(item, Entry) else corpus.rejected).append(item)
    corpus.id_field, corpus.notes = reader.id_field, reader.notes
    return corpus


def _kind(reason: str) -> str:
    return reason.split(":")[0]


def rejection_summary(rejected: Iterable[Rejection]) -> str:
    """'2 empty text, 1 duplicate id': reasons grouped by their kind (the part before ':')."""
    return _summary(Counter(_kind(r.reason) for r in rejected))


def _summary(kinds: Counter) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())


def _default_id(names: Collection[str]) -> str | None:
    return "id" if "id" in names else "_id" if "_id" in names else None


def _check_row(row: dict[str, Any], wanted: Sequence[str], id_field: str | None) -> str | None:
    """Why a parsed row (storable: ``unstorable``) cannot be indexed, or None."""
    read = False  # whether a text so far has something a model reads (one pass over the fields)
    absent = []  # the wanted fields the row lacks (or holds null): empty parts of a joined text
    for name in wanted:
        if row.get(name) is None:
            absent.append(name)
            continue
        value = _text_value(row[name])
        if value is None:
            return f"text not a string: field {name!r}"
        read = read or not blank(value)
    if len(absent) == len(wanted):  # a field named alone, or none of the joined ones
        near = nearest(absent[0], row) if len(absent) == 1 and absent[0] not in row else ""
        return f"missing text: no field {' or '.join(map(repr, absent))}{near}"
    if not read:
        return "empty text"
    if id_field:
        value = row.get(id_field)
        key = entry_id(value)
        if value is None or key == "":
            return f"missing id: field {id_field!r}{'' if id_field in row else nearest(id_field, row)}"
        if key is None:
            return f"bad id: {json.dumps(value)[:60]} in field {id_field!r} (an id is a string or an integer)"
    return None
