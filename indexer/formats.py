"""A corpus file's bytes -> its lines -> (row number, row) pairs, per format: CSV and TSV with a
header, JSON Lines, plain text. What a row means (its id, its text, whether it can be stored) is
``indexer.corpus``'s job; a row this module cannot parse is the reason why, as a string.

CSV, TSV and JSON Lines records end at ``\n`` or ``\r`` only; plain text splits lines as
``str.splitlines`` does. Files are read in blocks, so memory is bounded by the longest line.
"""

from __future__ import annotations

import codecs
import csv
import json
import re
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

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
MAX_DEPTH = 100
"""Levels of lists and objects a JSON value may nest; a deeper row is rejected (storing it as JSON
text recurses once per level)."""
TOO_DEEP = f"nested too deeply: more than {MAX_DEPTH} levels of lists and objects"
SURROGATE = re.compile("[\udc80-\udcff]")
"""What bytes that are not UTF-8 decode to (``surrogateescape``)."""
csv.field_size_limit(1 << 30)
_BLOCK = 1 << 20
LINE_ENDS = "\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
"""What ``str.splitlines`` ends a line at."""


def detect_format(path: Path, fmt: str | None) -> str:
    """The format asked for, else the one the file's extension names; neither: one clear error."""
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


def open_file(path: Path) -> BinaryIO:
    """The file opened for reading in binary, or why it cannot be, as one ``BadInput`` line."""
    if not path.exists():
        raise BadInput(f"no such file: {path}")
    if not path.is_file():
        raise BadInput(f"not a file: {path}")
    try:
        return path.open("rb")
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror}") from None


def read_lines(path: Path, handle: BinaryIO) -> Iterator[str]:
    """The file's lines with their ends, as ``str.splitlines(keepends=True)`` splits the whole
    text, read in blocks (memory bounded by the longest line): ``\r\n`` across two blocks stays
    one end. A leading BOM is dropped; bytes that are not UTF-8 become surrogates (row checks)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
    held, first = "", True
    while True:
        try:
            block = handle.read(_BLOCK)
        except OSError as exc:
            raise BadInput(f"cannot read {path}: {exc.strerror}") from None
        text = held + decoder.decode(block, final=not block)
        if first and text:
            text, first = text.removeprefix("\ufeff"), False
        if not block:
            yield from text.splitlines(keepends=True)
            return
        pieces = text.splitlines(keepends=True)
        held = pieces.pop() if pieces else ""
        if held.endswith("\r") or not held.endswith(tuple(LINE_ENDS)):
            yield from pieces  # the last piece may go on (or be \r of a \r\n) in the next block
        else:
            yield from pieces
            yield held
            held = ""


def record_lines(lines: Iterator[str]) -> Iterator[str]:
    """Lines of JSON Lines, CSV and TSV, which end at ``\n`` (or ``\r``) only: a U+2028 or a
    form feed inside a JSON string or a cell is part of its line, not the end of one."""
    held = ""
    for line in lines:
        held += line
        if held.endswith(("\n", "\r")):
            yield held
            held = ""
    if held:
        yield held


Rows = Iterator[tuple[int, "dict[str, Any] | str"]]


def parse_rows(lines: Iterator[str], fmt: str, path: Path) -> tuple[list[str], Rows]:
    """The header's field names (empty for formats without one) and (row number, row) pairs;
    a string row is the reason it could not be parsed."""
    if fmt == "text":
        return [], ((n, {"text": line.rstrip(LINE_ENDS)}) for n, line in enumerate(lines, 1))
    if fmt == "jsonl":
        return [], (json_row(n, line.rstrip(LINE_ENDS)) for n, line in enumerate(record_lines(lines), 1))
    records = _csv_records(record_lines(lines), fmt)
    header = next(records, None)
    if not isinstance(header, list) or not any(h.strip() for h in header):
        raise BadInput(f"{path} has no header row")
    header = [h.strip() for h in header]

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


def _csv_records(lines: Iterator[str], fmt: str) -> Iterator[list[str] | str]:
    """CSV/TSV records; a string is why a record was rejected. Parsing is strict, so a quote
    open until the end of the file, or closed lines later by a quote that is followed by more text,
    is an error rather than one field holding the rows after it: that record is rejected and
    parsing resumes on the line after the one it started on (the lines the failed record took are
    read again; only they are held)."""
    dialect = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if fmt == "tsv" else {}
    again: deque[str] = deque()  # lines to read again before the rest of the file
    taken: list[str] = []  # lines of the record being read

    def feed() -> Iterator[str]:
        while True:
            line = again.popleft() if again else next(lines, None)
            if line is None:
                return
            taken.append(line)
            yield line

    start = 0  # lines before the current reader's first
    while True:
        reader = csv.reader(feed(), strict=True, **dialect)
        consumed = 0  # lines taken by the records read so far
        try:
            for values in reader:
                taken.clear()
                yield values
                consumed = reader.line_num
            return
        except csv.Error as exc:
            opened = start + consumed + 1
            ran_on = reader.line_num - consumed > 1 or "".join(taken).count('"') % 2  # a quote left open
            yield f"unterminated quote: opened on line {opened}" if ran_on else f"bad CSV: {exc}"
            again.extendleft(reversed(taken[1:]))
            taken.clear()
            start += consumed + 1


def json_row(number: int, line: str) -> tuple[int, dict[str, Any] | str]:
    if not line.strip():
        return number, "empty line"
    try:
        row = json.loads(line)
    except ValueError:
        return number, "invalid JSON" + (" (not UTF-8)" if SURROGATE.search(line) else "")
    except RecursionError:
        return number, TOO_DEEP
    return number, row if isinstance(row, dict) else "not a JSON object"



