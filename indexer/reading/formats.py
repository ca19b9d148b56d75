"""A corpus file's bytes -> its lines -> (row number, row) pairs, per format: CSV and TSV with a
header, JSON Lines, a JSON array, plain text. What a row means (its id, its text, whether it can be stored) is
``indexer.reading.corpus``'s job; a row this module cannot parse is the reason why, as a string.

A line ends at ``\n`` (``\r\n`` is one end), as ``wc -l`` counts, in every format and on stdin;
CSV, TSV and JSON Lines records also end at a lone ``\r``. Files are read in blocks, so memory is
bounded by the longest line (a JSON array's: by its largest element), and a line, a field or an
element longer than ``decoding.MAX_TEXT`` is refused (``TooLong``) before it is read whole.
"""

from __future__ import annotations

import csv
import json
import re
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from indexer.errors import BadInput
from indexer.reading import decoding
from indexer.reading.decoding import (
    GZIP_SUFFIX,
    SURROGATE,
    Decoding,
    TooLong,
    blocks,
    line_text,
    open_file,
    read_lines,
)
from indexer.reading.tsv import QUOTING, Spans, doubled_in_text, tsv_records

FORMATS = ("csv", "tsv", "jsonl", "json", "text")
_SUFFIXES = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".tab": "tsv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".txt": "text",
    ".text": "text",
}
MAX_DEPTH = 100
"""Levels of lists and objects a JSON value may nest; a deeper row is rejected (storing it as JSON
text recurses once per level)."""
TOO_DEEP = f"nested too deeply: more than {MAX_DEPTH} levels of lists and objects"


def detect_format(path: Path, fmt: str | None, encoding: str = "utf-8") -> str:
    """The format asked for, else the one the file's extension names (``corpus.tsv.gz``: the one
    before ``.gz``); neither: one clear error. JSON that starts with ``{`` rather than ``[`` is
    JSON Lines (many ``.json`` exports are)."""
    if fmt and fmt not in FORMATS:
        raise BadInput(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    found = fmt or named_format(path)
    if found is None:
        raise BadInput(
            f"cannot tell the format of {path.name!r} from its extension: use --format {'|'.join(FORMATS)}"
        )
    if found == "json" and _first_character(path, encoding) == "{":
        return "jsonl"
    return found


def named_format(path: Path) -> str | None:
    """The format ``path``'s extension names (``corpus.tsv.gz``: the one before ``.gz``), or None."""
    named = Path(path.stem) if path.suffix.lower() == GZIP_SUFFIX else path
    return _SUFFIXES.get(named.suffix.lower())


def _first_character(path: Path, encoding: str) -> str:
    """The first character of the file that is not white space ("" for none)."""
    with open_file(path) as handle:
        for text in blocks(path, handle, encoding, Decoding(path, encoding)):
            if text.strip():
                return text.strip()[0]
    return ""


_LONE_CR = re.compile("(?<=\r)(?!\n)")


def record_lines(lines: Iterator[str]) -> Iterator[str]:
    """Lines of JSON Lines, CSV and TSV, which also end at a lone ``\r`` (an old Mac line end):
    a U+2028 or a form feed inside a JSON string or a cell is part of its line, as in text."""
    return (piece for _, piece in numbered_records(lines))


def numbered_records(lines: Iterator[str]) -> Iterator[tuple[int, str]]:
    """``record_lines`` with the number of the file's line each is on (as ``wc -l`` counts)."""
    for number, line in enumerate(lines, 1):
        if "\r" in line.removesuffix("\r\n"):
            yield from ((number, piece) for piece in _LONE_CR.split(line) if piece)
        else:
            yield number, line


Rows = Iterator[tuple[int, "int | None", "dict[str, Any] | str"]]
"""(row number, the file's line it starts on (None: a JSON array's element), the row or why not)."""


DELIMITERS = {",": "comma", ";": "semicolon", "\t": "tab", "|": "pipe"}
"""What a CSV file's fields may be separated by, told from its header when not given."""


def check_delimiter(delimiter: str | None) -> str | None:
    """A CSV field separator as given (``\\t`` or ``tab`` for a tab), or one clear error."""
    if delimiter is None:
        return None
    named = {name: char for char, name in DELIMITERS.items()} | {"\\t": "\t"}
    delimiter = named.get(delimiter.lower(), delimiter)
    if len(delimiter) != 1 or delimiter in '"\r\n':
        raise BadInput(f"a delimiter is one character (not a quote or a line end), not {delimiter!r}")
    return delimiter


def delimiter_of(header: str) -> str:
    """The separator a CSV header line uses: the most frequent of ``DELIMITERS`` outside quotes,
    a comma when none is (one column) or on a tie."""
    unquoted = "".join(header.split('"')[::2])
    return max(DELIMITERS, key=unquoted.count)


def file_delimiter(path: Path, fmt: str, delimiter: str | None, encoding: str = "utf-8") -> str | None:
    """The separator a CSV file is read with: ``delimiter`` if given, else ``delimiter_of`` its
    first line; None for the other formats."""
    if fmt != "csv":
        return None
    if delimiter is not None:
        return check_delimiter(delimiter)
    with open_file(path) as handle:
        return delimiter_of(next(read_lines(path, handle, encoding), ""))


def delimiter_note(path: Path, fmt: str | None, delimiter: str | None, encoding: str = "utf-8") -> str | None:
    """One line saying what a CSV file's fields are read as separated by, when it is told from
    its header and is not a comma; else None."""
    if delimiter is not None or detect_format(path, fmt) != "csv":
        return None
    found = file_delimiter(path, "csv", None, encoding)
    if found == ",":
        return None
    told = "told from its header; --delimiter to choose"
    return f"reading {path.name} as {DELIMITERS[found]}-separated ({told})"


def parse_rows(
    handle: BinaryIO,
    fmt: str,
    path: Path,
    encoding: str = "utf-8",
    delimiter: str | None = None,
    quoting: str = QUOTING,
    spans: Spans | None = None,
) -> tuple[list[str], Rows]:
    """The header's field names (empty for formats without one) and (row number, line number,
    row) triples of the open file; a string row is the reason it could not be parsed.
    ``delimiter``: a CSV file's separator (``file_delimiter``); ``quoting``: how a TSV's quotes
    are read, ``spans`` counting its quoted fields of several lines (``indexer.reading.tsv``)."""
    if fmt == "json":
        return [], ((n, None, row) for n, row in json_array_rows(path, handle, encoding))
    lines = read_lines(path, handle, encoding)
    if fmt == "text":
        return [], ((n, n, {"text": line_text(line)}) for n, line in enumerate(lines, 1))
    if fmt == "jsonl":
        numbered = enumerate(numbered_records(lines), 1)
        return [], ((n, at, json_row(n, line.rstrip("\r\n"))[1]) for n, (at, line) in numbered)
    if fmt == "tsv":
        records = tsv_records(numbered_records(lines), quoting, spans, str(path))
    else:
        records = _csv_records(numbered_records(lines), delimiter or ",", quoting, spans, path)
    _, header = next(records, (0, None))
    if not isinstance(header, list) or not any(h.strip() for h in header):
        raise BadInput(f"{path} has no header row")
    header = [h.strip() for h in header]

    def rows() -> Rows:
        for number, (line, values) in enumerate(records, 1):
            if isinstance(values, str):
                yield number, line, values
            elif not values or not any(v.strip() for v in values):
                yield number, line, "empty line"
            elif len(values) != len(header):
                yield number, line, f"wrong field count: {len(values)} fields, header has {len(header)}"
            else:
                yield number, line, dict(zip(header, values, strict=True))

    return header, rows()


def _csv_records(
    lines: Iterator[tuple[int, str]],
    delimiter: str,
    quoting: str = QUOTING,
    spans: Spans | None = None,
    path: Path | str = "",
) -> Iterator[tuple[int, list[str] | str]]:
    """(first line number, fields) of each CSV record; fields as a string: why the record was
    rejected. Parsing is strict, so a quote open until the end of the file, or closed lines later
    by a quote that is followed by more text, is an error rather than one field holding the rows
    after it: that record is rejected and parsing resumes on the line after the one it started on
    (the lines the failed record took are read again; only they are held). In ``auto`` quoting, a
    quoted field of three lines or more whose every line is on its own a row of the header's width
    is a typed quote closed by another, not a writer's (unless its text holds words in quotes
    doubled as a writer doubles them: ``doubled_in_text``): its first line is read as typed
    (``typed_fields``) and the others again. ``spans`` counts the quoted fields of several lines,
    read or not. A field longer than ``decoding.MAX_TEXT`` is refused (``TooLong``, naming ``path``)."""
    again: deque[tuple[int, str]] = deque()  # lines to read again before the rest of the file
    taken: list[tuple[int, str]] = []  # lines of the record being read
    spans = spans if spans is not None else Spans()
    quote = {"quoting": csv.QUOTE_NONE} if quoting == "none" else {}
    csv.field_size_limit(decoding.MAX_TEXT)  # process-wide, so set where it is relied on

    def feed() -> Iterator[str]:
        while True:
            numbered = again.popleft() if again else next(lines, None)
            if numbered is None:
                return
            spans.lines = max(spans.lines, numbered[0])
            taken.append(numbered)
            yield numbered[1]

    width = None
    while True:
        reader = csv.reader(feed(), strict=True, delimiter=delimiter, **quote)
        try:
            for values in reader:
                first, record = taken[0][0], list(taken)
                taken.clear()
                last = record[-1][0]
                if width is None:
                    width = len(values)
                elif quoting == QUOTING and len(record) > 2 and not doubled_in_text(values):
                    typed = [typed_fields(line, delimiter) for _, line in record]
                    if all(len(fields) == width for fields in typed):
                        spans.add((first, last), read=False)
                        again.extendleft(reversed(record[1:]))
                        values, last = typed[0], first
                if last > first:
                    spans.add((first, last), read=True)
                spans.records += 1
                yield first, values
            return
        except csv.Error as exc:
            opened = taken[0][0]
            if "field limit" in str(exc):  # "field larger than field limit (N)"
                raise TooLong.at(path, opened, what="field") from None
            ran_on = len(taken) > 1 or "".join(line for _, line in taken).count('"') % 2  # a quote left open
            yield opened, f"unterminated quote: opened on line {opened}" if ran_on else f"bad CSV: {exc}"
            again.extendleft(reversed(taken[1:]))
            taken.clear()


def typed_fields(line: str, delimiter: str) -> list[str]:
    """A CSV line's fields read on their own: quoted fields that close on the line as CSV, and
    from a quote that does not, the rest of the line as text split at the delimiter."""
    text, pos, fields = line_text(line), 0, []
    closed = re.compile(f'"((?:[^"]|"")*)"(?={re.escape(delimiter)}|$)')
    while True:
        if text.startswith('"', pos):
            if (found := closed.match(text, pos)) is None:
                return fields + text[pos:].split(delimiter)
            fields.append(found.group(1).replace('""', '"'))
            pos = found.end()
        else:
            end = text.find(delimiter, pos)
            fields.append(text[pos:] if end < 0 else text[pos:end])
            pos = len(text) if end < 0 else end
        if pos >= len(text):
            return fields
        pos += 1


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


_SPACE = re.compile("[ \t\n\r]*")
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[][{},]')
_NEAR_END = 16
"""A JSON error this close to the end of the text read so far may be the element cut by the block."""


def json_array_rows(path: Path, handle: BinaryIO, encoding: str = "utf-8") -> Rows:
    """The elements of a JSON array, numbered from 1: an object is a row, a string the row
    ``{"text": string}``, anything else the reason it is not. The file is decoded in blocks and
    each element parsed with ``raw_decode`` from a buffer holding only the text not yet parsed,
    so memory is bounded by the largest element, and one longer than ``decoding.MAX_TEXT`` is
    refused (``TooLong``) once the buffer passes it. An element that is not JSON is rejected and
    the array read on from the next ``,`` at its own depth."""
    array = _JsonArray(path, handle, encoding)
    if array.following() == "":
        return
    if array.text[array.pos] != "[":
        raise BadInput(f"{path} is not a JSON array (of objects or strings) nor JSON Lines")
    array.pos += 1
    mark = ","
    if array.following() == "]":
        array.pos, mark = array.pos + 1, "]"
    while mark == ",":
        array.number += 1
        array.following()
        ok, found = array.value()
        if ok:
            mark = array.following()
            if mark in (",", "]"):
                array.pos += 1
            elif mark:  # no comma after the element: it and what follows, to the next one, are broken
                ok, found, mark = False, "invalid JSON: no , between elements", array.skip()
        else:
            mark = array.skip()
        if not ok or isinstance(found, dict):
            yield array.number, found
        elif isinstance(found, str):
            yield array.number, {"text": found}
        else:
            yield array.number, "not a JSON object or string"
    if mark == "":
        yield array.number + 1, "unclosed JSON array: the file ends before its ]"
    elif array.following():
        yield array.number + 1, "text after the JSON array's end"
    array.check.end()


class _JsonArray:
    """A JSON array's text read a block at a time (``json_array_rows``): ``text`` holds what is
    read and not yet dropped, ``pos`` where the next element starts, ``number`` the element read."""

    def __init__(self, path: Path, handle: BinaryIO, encoding: str):
        self.path = path
        self.check = Decoding(path, encoding)
        self.texts = blocks(path, handle, encoding, self.check)
        self.decoder = json.JSONDecoder()
        self.text, self.pos, self.number = "", 0, 0

    def more(self) -> bool:
        """Read a block onto the buffer, dropping the text before ``pos`` (which becomes 0)."""
        if len(self.text) - self.pos > decoding.MAX_TEXT:  # an element (or the space before one) too long
            raise TooLong.at(self.path, None, max(self.number, 1), what="element")
        block = next(self.texts, None)
        if block is None:
            return False
        self.text, self.pos = self.text[self.pos :] + block, 0
        return True

    def following(self) -> str:
        """The next character that is not white space, at ``pos`` ("" at the end of the file)."""
        while True:
            self.pos = _SPACE.match(self.text, self.pos).end()
            if self.pos < len(self.text):
                return self.text[self.pos]
            if not self.more():
                return ""

    def value(self) -> tuple[bool, Any]:
        """(True, the value at ``pos``), ``pos`` moved past it; else (False, why not)."""
        while True:
            try:
                found, end = self.decoder.raw_decode(self.text, self.pos)
            except json.JSONDecodeError as exc:
                cut = exc.pos + _NEAR_END >= len(self.text) or exc.msg.startswith("Unterminated string")
                if cut and self.more():
                    continue
                return False, f"invalid JSON: {exc.msg}"
            except RecursionError:
                return False, TOO_DEEP
            if end == len(self.text) and self.more():  # a number may go on in the next block
                continue
            self.check.line(self.text[self.pos : end])
            self.pos = end
            return True, found

    def skip(self) -> str:
        """Move ``pos`` past a broken element to the ``,`` or ``]`` after it at its own depth;
        that character ("" at the end of the file)."""
        while True:
            depth, last, text = 0, self.pos, self.text
            for token in _JSON_TOKEN.finditer(text, self.pos):
                if '"' in text[last : token.start()] and self.more():  # a string cut by the block's end
                    break
                last, mark = token.end(), token.group()
                if mark in "[{":
                    depth += 1
                elif depth and mark in "]}":
                    depth -= 1
                elif not depth and mark in ",]":
                    self.check.line(text[self.pos : token.start()])
                    self.pos = token.end()
                    return mark
            else:
                if self.more():
                    continue
                self.pos = len(self.text)
                return ""
