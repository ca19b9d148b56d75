"""A TSV file's lines -> its records: fields split at tabs, and CSV quoting read where the file
shows a writer quoted, as pandas, Python's csv and spreadsheets write a TSV. Quotes typed by
hand (an inch mark ``27"``, a quotation opened on one row) are text.

Why a quote is not trusted on its own: a quote opening a field and the next quote in the file,
hundreds of lines on, closing one, read as CSV make every row between one field. So a row is
never merged with the next on a guess: in ``auto`` quoting, a quoted field is read as CSV only
when a writer would have written it so (it closes right before a tab or the line's end, it
needed its quotes, its record has the header's width), and one that spans lines only when the
line end it holds breaks a row (its first and last lines, split at tabs, are not both rows of
the header's width, as every line of a typed file is) or its text holds words in quotes doubled
as a writer doubles them (``""stop""``; a typed file has none). What spanned lines, or would have, is
said in ``notes``; ``csv`` and ``none`` decide for a file.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from indexer.errors import BadInput
from indexer.reading import decoding
from indexer.reading.decoding import TooLong, line_text

QUOTING = "auto"
"""The ``--quoting`` default: CSV quoting where the file shows a writer quoted."""
QUOTINGS = (QUOTING, "csv", "none")
"""How a TSV's quotes are read: as the file shows (``auto``), always as CSV quoting, never."""

_LINE_END = ("", "\n", "\r\n", "\r")
_SHOWN = 3
"""Quoted fields of several lines a note names; it counts the rest."""
_QUOTED_TEXT = re.compile('"[^"\t\r\n]+"')
"""Text in quotes, within a line and a field (``"stop"``)."""
_LINE_BREAK = re.compile("[\r\n]")


def check_quoting(quoting: str) -> str:
    """``quoting`` if it is one of ``QUOTINGS``; else one clear error."""
    if quoting not in QUOTINGS:
        raise BadInput(f"unknown quoting {quoting!r}: use one of {', '.join(QUOTINGS)}")
    return quoting


@dataclass
class Spans:
    """The quoted fields that spanned lines (read as one field) and those that would have (read
    as their lines' rows): their counts and the first few of each, as (first line, last line,
    row read from them). Both readers of quoted fields count here (TSV and CSV), so one note says
    what either read."""

    read: int = 0
    first_read: list[tuple[int, int, int]] = field(default_factory=list)
    declined: int = 0
    first_declined: list[tuple[int, int]] = field(default_factory=list)
    lines: int = 0
    """The lines read so far."""
    records: int = 0
    """The records read so far, the header first: the one being read is row ``records``."""

    def add(self, lines: tuple[int, int], read: bool) -> None:
        """Count a quoted field on ``lines`` of the row being read."""
        if read:
            self.read += 1
            if len(self.first_read) < _SHOWN:
                self.first_read.append((*lines, self.records))
        else:
            self.declined += 1
            if len(self.first_declined) < _SHOWN:
                self.first_declined.append(lines)

    def describe(self, name: str, rows: int) -> list[str]:
        """What a reader says about the file once read: the rows read from how many lines, which
        lines a quoted field covers (which row they made), and the option that decides otherwise."""
        said = []
        if self.read:
            fields = "1 quoted field spans" if self.read == 1 else f"{self.read} quoted fields span"
            shown = ", ".join(f"lines {first}-{last} as row {row}" for first, last, row in self.first_read)
            said.append(
                f"{name}: {fields} lines ({shown}{', ...' if self.read > _SHOWN else ''}); read {rows} rows "
                f"from {self.lines} lines (--quoting none reads every quote as text)"
            )
        if self.declined:
            first, last = self.first_declined[0]
            if self.declined == 1:
                said.append(
                    f"{name}: a quote opening a field on line {first} would close on line {last}, "
                    f"joining lines {first}-{last} into one field; read as their {last - first + 1} rows, "
                    "quotes as text (--quoting csv joins them)"
                )
            else:
                said.append(
                    f"{name}: {self.declined} quotes opening a field would close on a later line, "
                    f"joining rows ({self.declined_lines()}); read as the rows of their lines, "
                    "quotes as text (--quoting csv joins them)"
                )
        return said

    def declined_lines(self) -> str:
        """``lines 6-901, 950-953, ...``: the lines the first few declined quoted fields would join."""
        shown = ", ".join(f"{first}-{last}" for first, last in self.first_declined)
        return f"lines {shown}{', ...' if self.declined > _SHOWN else ''}"


def tsv_records(
    lines: Iterator[tuple[int, str]], quoting: str = QUOTING, spans: Spans | None = None, path: str = ""
) -> Iterator[tuple[int, list[str] | str]]:
    """(first line number, fields) of each TSV record in ``lines`` ((number, line) pairs), the
    header first; fields as a string: why the record was rejected (``csv`` quoting that does not
    parse). ``spans`` counts the quoted fields that spanned lines, read or not. A quoted field
    longer than ``decoding.MAX_TEXT`` is refused naming ``path`` in ``csv`` quoting (``TooLong``);
    in ``auto`` its quotes are text."""
    again: deque[tuple[int, str]] = deque()  # lines to read again before the rest of the file
    spans = spans if spans is not None else Spans()

    def next_line() -> tuple[int, str] | None:
        numbered = again.popleft() if again else next(lines, None)
        if numbered is not None:
            spans.lines = max(spans.lines, numbered[0])
        return numbered

    width, quote_all = None, False  # the header's field count; whether its names are all quoted
    while (numbered := next_line()) is not None:
        number, line = numbered
        values: list[str] | str | None = None
        if quoting != "none" and (line.startswith('"') or '\t"' in line):  # a field opens with a quote
            taken = [numbered]
            try:
                parsed = _quoted_record(taken, next_line)
            except TooLong as exc:  # a line too long, or no quote closing within the limit
                if exc.what == "line" or quoting == "csv":
                    raise TooLong.at(path, exc.line, what=exc.what) from None
                parsed = None  # ``auto``: quotes that would make a field this long are text
            if parsed is not None:
                values, quoted = parsed
                if width is None:
                    quote_all = all(quoted)
                values = _as_written(values, quoted, taken, width, quote_all, quoting, spans)
            elif quoting == "csv":
                values = f"quote not closed right before a tab or the line's end: opened on line {number}"
            if values is None or isinstance(values, str):
                again.extendleft(reversed(taken[1:]))
        if values is None:
            values = line_text(line).split("\t")
        if width is None and not isinstance(values, str):
            width = len(values)
        spans.records += 1
        yield number, values


def _as_written(
    values: list[str],
    quoted: list[bool],
    taken: list[tuple[int, str]],
    width: int | None,
    quote_all: bool,
    quoting: str,
    spans: Spans,
) -> list[str] | None:
    """The record's fields read with CSV quoting, if that is how it was written; else None."""
    lines = (taken[0][0], taken[-1][0])
    if quoting == "csv":  # as CSV reads it: a record of another width is rejected for it
        if len(taken) > 1:
            spans.add(lines, read=True)
        return values
    if width not in (None, len(values)):
        return None
    needless = any(q and not _needs_quotes(v) for v, q in zip(values, quoted, strict=True))
    if needless and not quote_all:
        return None
    if len(taken) > 1:
        typed = all(len(line_text(line).split("\t")) == width for _, line in (taken[0], taken[-1]))
        written = doubled_in_text(v for v, q in zip(values, quoted, strict=True) if q)
        if typed and not quote_all and not written:
            spans.add(lines, read=False)
            return None
        spans.add(lines, read=True)
    return values


def doubled_in_text(values: Iterable[str]) -> bool:
    """Whether a field of several lines among ``values`` holds text in quotes (``He said "stop"``,
    written ``He said ""stop""``): a writer's doubling, which a typed file has none of. Between a
    quote typed on one row and one typed rows later, doubled quotes are typed ones (a ditto mark
    ``""``, ``x""``), never around text, and leave those lines rows of their own."""
    return any(_LINE_BREAK.search(value) and _QUOTED_TEXT.search(value) for value in values)


def _needs_quotes(value: str) -> bool:
    """Whether a writer quotes this TSV value (Python's csv and pandas quote no other; an empty
    field is written empty, so ``""`` is two quotes typed, as a ditto mark)."""
    return any(c in value for c in '\t\n\r"')


def _quoted_record(
    taken: list[tuple[int, str]], next_line: Callable[[], tuple[int, str] | None]
) -> tuple[list[str], list[bool]] | None:
    """The fields of the TSV record that starts ``taken[0]`` read with CSV quoting, and which
    were quoted; the lines a quoted field runs on to are appended to ``taken``. None: not CSV
    quoting (a quote closes before more text, or is never closed); ``TooLong``: a quoted field
    runs on past ``decoding.MAX_TEXT``."""
    text, pos = taken[0][1], 0
    values: list[str] = []
    quoted: list[bool] = []
    while True:
        if text.startswith('"', pos):
            search = pos + 1
            while True:  # the closing quote: a quote not doubled
                close = text.find('"', search)
                if close < 0:
                    if len(text) - pos > decoding.MAX_TEXT:
                        raise TooLong.at("", taken[0][0], what="field")
                    more = next_line()
                    if more is None:
                        return None
                    search = len(text)
                    taken.append(more)
                    text += more[1]
                elif text.startswith('"', close + 1):
                    search = close + 2
                else:
                    break
            values.append(text[pos + 1 : close].replace('""', '"'))
            quoted.append(True)
            pos = close + 1
            if text.startswith("\t", pos):
                pos += 1
                continue
            return (values, quoted) if text[pos:] in _LINE_END else None
        tab = text.find("\t", pos)
        values.append(line_text(text[pos:]) if tab < 0 else text[pos:tab])
        quoted.append(False)
        if tab < 0:
            return values, quoted
        pos = tab + 1
