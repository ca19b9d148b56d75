"""A TSV file's lines -> its records: fields split at tabs, and CSV quoting read where the file
shows a writer quoted, as pandas, Python's csv and spreadsheets write a TSV. Quotes typed by
hand (an inch mark ``27"``, a quotation opened on one row) are text.

Why a quote is not trusted on its own: a quote opening a field and the next quote in the file,
hundreds of lines on, closing one, read as CSV make every row between one field. So a row is
never merged with the next on a guess: in ``auto`` quoting, a quoted field is read as CSV only
when a writer would have written it so (it closes right before a tab or the line's end, it
needed its quotes, its record has the header's width), and one that spans lines only when the
line end it holds breaks a row (its first and last lines, split at tabs, are not both rows of
the header's width, as every line of a typed file is). What spanned lines, or would have, is
said in ``notes``; ``csv`` and ``none`` decide for a file.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from indexer.errors import BadInput
from indexer.reading.decoding import line_text

QUOTING = "auto"
"""The ``--quoting`` default: CSV quoting where the file shows a writer quoted."""
QUOTINGS = (QUOTING, "csv", "none")
"""How a TSV's quotes are read: as the file shows (``auto``), always as CSV quoting, never."""

_LINE_END = ("", "\n", "\r\n", "\r")


def check_quoting(quoting: str) -> str:
    """``quoting`` if it is one of ``QUOTINGS``; else one clear error."""
    if quoting not in QUOTINGS:
        raise BadInput(f"unknown quoting {quoting!r}: use one of {', '.join(QUOTINGS)}")
    return quoting


@dataclass
class Spans:
    """The quoted fields that spanned lines (read as one field) and those that would have (read
    as their lines' rows): their counts and the first of each, as (first line, last line)."""

    read: int = 0
    first_read: tuple[int, int] | None = None
    declined: int = 0
    first_declined: tuple[int, int] | None = None
    lines: int = 0
    """The lines read so far."""

    def add(self, lines: tuple[int, int], read: bool) -> None:
        if read:
            self.read += 1
            self.first_read = self.first_read or lines
        else:
            self.declined += 1
            self.first_declined = self.first_declined or lines

    def describe(self, name: str, rows: int) -> list[str]:
        """What a reader says about the file once read: the rows read from how many lines, which
        lines a quoted field covers, and the option that decides otherwise."""
        said = []
        if self.read:
            first, last = self.first_read
            fields = "1 quoted field spans" if self.read == 1 else f"{self.read} quoted fields span"
            said.append(
                f"{name}: {fields} lines (the first: lines {first}-{last}); read {rows} rows from "
                f"{self.lines} lines (--quoting none reads every quote as text)"
            )
        if self.declined:
            first, last = self.first_declined
            if self.declined == 1:
                said.append(
                    f"{name}: a quote opening a field on line {first} would close on line {last}, "
                    f"joining lines {first}-{last} into one field; read as their {last - first + 1} rows, "
                    "quotes as text (--quoting csv joins them)"
                )
            else:
                said.append(
                    f"{name}: {self.declined} quotes opening a field would close on a later line, "
                    f"joining rows (the first: lines {first}-{last}); read as the rows of their lines, "
                    "quotes as text (--quoting csv joins them)"
                )
        return said


def tsv_records(
    lines: Iterator[tuple[int, str]], quoting: str = QUOTING, spans: Spans | None = None
) -> Iterator[tuple[int, list[str] | str]]:
    """(first line number, fields) of each TSV record in ``lines`` ((number, line) pairs), the
    header first; fields as a string: why the record was rejected (``csv`` quoting that does not
    parse). ``spans`` counts the quoted fields that spanned lines, read or not."""
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
            parsed = _quoted_record(taken, next_line)
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
        if typed and not quote_all:
            spans.add(lines, read=False)
            return None
        spans.add(lines, read=True)
    return values


def _needs_quotes(value: str) -> bool:
    """Whether a writer quotes this TSV value (Python's csv and pandas quote no other; an empty
    field is written empty, so ``""`` is two quotes typed, as a ditto mark)."""
    return any(c in value for c in '\t\n\r"')


def _quoted_record(
    taken: list[tuple[int, str]], next_line: Callable[[], tuple[int, str] | None]
) -> tuple[list[str], list[bool]] | None:
    """The fields of the TSV record that starts ``taken[0]`` read with CSV quoting, and which
    were quoted; the lines a quoted field runs on to are appended to ``taken``. None: not CSV
    quoting (a quote closes before more text, or is never closed)."""
    text, pos = taken[0][1], 0
    values: list[str] = []
    quoted: list[bool] = []
    while True:
        if text.startswith('"', pos):
            search = pos + 1
            while True:  # the closing quote: a quote not doubled
                close = text.find('"', search)
                if close < 0:
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
