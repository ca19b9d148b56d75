"""Rejections that say a whole file was read the wrong way (its separator, its format, its
encoding) rather than that some of its rows are bad: the rule, and the one line that names the
likely cause and the option that fixes it. A read that meets it writes nothing.

The rule: more than half of a file's rows rejected for one of the reasons in ``_causes``; for
bytes that do not decode, more than a quarter (``UNDECODABLE_SHARE``). Rows rejected for what
they hold (an empty text, a duplicate or missing id) are the rows' own faults, however many.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from indexer.errors import BadInput
from indexer.reading.decoding import UNDECODABLE_SHARE, guess_encoding
from indexer.reading.formats import DELIMITERS
from indexer.reading.tsv import Spans

MISMATCH_SHARE = 0.5
"""More than this share of a file's rows rejected for one format reason: the file is refused."""


def _causes(fmt: str, delimiter: str | None, width: int, spans: Spans) -> dict[str, str]:
    """Each rejection kind that a wrong way of reading makes, with its likely cause and fix.
    ``spans``: quoted fields of several lines read as their lines' rows make rows of another
    width, which ``--quoting csv`` reads as written."""
    split = "tabs" if fmt == "tsv" else f"{DELIMITERS.get(delimiter or ',', repr(delimiter))}s"
    fields = f"{width} field" + ("s" if width != 1 else "")
    fix = (
        "if it is not tab-separated, read it with --format csv (--delimiter names the separator)"
        if fmt == "tsv"
        else f"its fields are separated by something else, or hold {split} unquoted: --delimiter "
        "names the separator (--format the format)"
    )
    if spans.declined:
        quotes = "a quoted field" if spans.declined == 1 else f"{spans.declined} quoted fields"
        fix = (
            f"{quotes} of several lines ({spans.declined_lines()}) read as their lines' rows, quotes "
            f"as text: --quoting csv reads each as one field; {fix}"
        )
    as_tsv = "; if it is tab-separated, --format tsv reads such quotes as text" if fmt == "csv" else ""
    return {
        "wrong field count": f"do not have the header's {fields} when split at {split}: {fix}",
        "unterminated quote": "open a quote they never close: a quote inside a field is written "
        f"twice, in a quoted field{as_tsv}",
        "bad CSV": f"break CSV's quoting: a quote inside a field is written twice, in a quoted field{as_tsv}",
        "invalid JSON": "are not JSON: "
        + (
            "JSON Lines holds one object per line; for a JSON array, use --format json"
            if fmt == "jsonl"
            else "for JSON Lines (one object per line), use --format jsonl"
        ),
        "not a JSON object": "are JSON but not objects: JSON Lines holds one {...} per line; "
        "for lines of plain text, use --format text",
        "not a JSON object or string": "are neither objects nor strings: a JSON array's elements are "
        "rows ({...}) or texts",
        "binary data": "hold NUL bytes: binary data, or text in UTF-16 without a byte order mark "
        "(then try --encoding utf-16-le or utf-16-be)",
    }


def check_mismatch(
    path: Path | str,
    kinds: Counter,
    rows: int,
    *,
    fmt: str,
    delimiter: str | None,
    encoding: str,
    width: int,
    undecodable: bytes,
    spans: Spans,
) -> None:
    """Refuse a file whose rejections (``kinds``: count by kind, of ``rows`` rows) say it was
    read the wrong way; ``width``: a CSV or TSV header's field count; ``undecodable``: bytes of
    rows ``encoding`` could not decode (what to guess the encoding from); ``spans``: its quoted
    fields of several lines."""
    bad = kinds.get(f"invalid {encoding.upper()}", 0)
    if bad > rows * UNDECODABLE_SHARE:
        hint = guess_encoding(undecodable, encoding)
        raise BadInput(f"{path}: {bad} of {rows} rows are not valid {encoding.upper()}; {hint}")
    causes = _causes(fmt, delimiter, width, spans)
    for kind, count in kinds.most_common():
        if kind in causes and count > rows * MISMATCH_SHARE:
            raise BadInput(f"{path}: {count} of {rows} rows {causes[kind]}")


def check_split_header(name: Path | str, header: list[str], fmt: str, delimiter: str | None) -> None:
    """Refuse a CSV or TSV file whose header is one field holding a separator (``DELIMITERS``)
    other than the one it was split at, naming the option that reads it: called when a field
    asked for is missing, which such a header makes for every field."""
    if fmt not in ("csv", "tsv") or len(header) != 1:
        return
    split_at = (delimiter or ",") if fmt == "csv" else "\t"
    held = [char for char in DELIMITERS if char != split_at and char in header[0]]
    if not held:
        return
    likely = max(held, key=header[0].count)
    given = "tab" if likely == "\t" else repr(likely)
    split = f"{DELIMITERS.get(split_at, repr(split_at))}s"
    fix = f"--delimiter {given}" if fmt == "csv" else f"--format csv --delimiter {given}"
    raise BadInput(
        f"{name}: its header is one field, {header[0][:80]!r}, when split at {split}: the "
        f"delimiter is likely wrong (the header holds {DELIMITERS[likely]}s; read it with {fix})"
    )
