"""Query files, read one way for ``query --queries`` and the retrieval evaluation.

CSV or TSV with a header (told by the extension, as a corpus's format is: ``.csv``, ``.tsv``,
``.tab``, also gzipped; read by the corpus reader, with columns ``id`` and ``text``), JSON Lines
(ours ``{"id", "text"}`` or BEIR's ``{"_id", "text"}``; ``query`` is also read as the text) or
plain lines, one query each. A query id is always a string: the id as text, else the line (a
table's: the row) number, so ids from a file match the string ids of qrels and of the index. Two
queries with one id are an error: judgements are per id, so one of the two would be scored
against the other's answers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from indexer.errors import BadInput
from indexer.reading.corpus import CorpusReader, Entry, entry_id
from indexer.reading.decoding import lines_of, open_file
from indexer.reading.formats import named_format, parse_rows
from indexer.reading.names import spelled

ID_KEYS = ("id", "_id")
TEXT_KEYS = ("text", "query")


def check_text(text: str, what: str = "text") -> str:
    """``text`` if it can be embedded and stored. Undecodable bytes in an argument or on stdin
    arrive as lone surrogates (so does ``"\\ud800"`` in JSON), which no tokenizer or database takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadInput(f"{what} is not valid UTF-8 text (undecodable bytes or a lone surrogate)") from None
    return text


@dataclass(frozen=True)
class Query:
    id: str
    text: str


def read_lines(path: str, encoding: str = "utf-8") -> list[str]:
    """Lines of a file, or of stdin for ``-``, split as a corpus's lines are (``formats.lines_of``)."""
    return lines_of(path, encoding)


def _json_query(row: Any, number: int) -> Query | None:
    """The query of one parsed JSON line, or None when the line has no usable text."""
    if not isinstance(row, dict):
        return None
    text = next((row[key] for key in TEXT_KEYS if key in row), None)
    if not isinstance(text, str) or not text.strip():
        return None
    query_id = entry_id(next((row[key] for key in ID_KEYS if row.get(key) is not None), number))
    return Query(query_id, text.strip()) if query_id else None  # an id as the index reads one


def read_queries(path: str, encoding: str = "utf-8") -> list[Query]:
    """Every query of ``path`` (``-`` = stdin) in order; blank lines are skipped.

    A ``.csv``/``.tsv`` file is a table (``table_queries``); otherwise the file is JSON Lines when
    its first non-blank line starts with ``{``, else plain lines. A line that cannot be read, or
    a second query with an id already seen, is an error naming it: a query is never dropped silently.
    """
    if path != "-" and named_format(Path(path)) in ("csv", "tsv"):
        return table_queries(Path(path), encoding)
    lines = read_lines(path, encoding)
    numbered = [(n, line.strip()) for n, line in enumerate(lines, 1) if line.strip()]
    if not numbered:
        raise BadInput(f"no queries in {path}")
    if not numbered[0][1].startswith("{"):
        return [Query(str(n), line) for n, line in numbered]
    queries: dict[str, tuple[int, Query]] = {}
    for number, line in numbered:
        try:
            query = _json_query(json.loads(line), number)
        except (ValueError, RecursionError):  # RecursionError: nested past what json can read
            query = None
        if query is None:
            raise BadInput(
                f"{path} line {number}: expected a JSON object with a non-empty 'text' (and 'id' or '_id', "
                "a string or an integer)"
            )
        if query.id in queries:
            raise BadInput(
                f"{path} line {number}: duplicate id: {query.id!r} (first at line {queries[query.id][0]})"
            )
        queries[query.id] = number, query
    return [query for _, query in queries.values()]


def table_queries(path: Path, encoding: str = "utf-8") -> list[Query]:
    """The queries of a CSV or TSV file with a header, read as a corpus is (its delimiter told from
    the header, quotes, gzip): the text from column ``text`` (else ``query``), the id from ``id``
    (else ``_id``, else the row number). A row that cannot be read (a duplicate id among them) is
    an error naming its line and row; blank lines are skipped, as in the other forms."""
    reader = CorpusReader(path, encoding=encoding, columns=False)
    with open_file(path) as handle:
        header, _ = parse_rows(handle, reader.fmt, path, reader.encoding, reader.delimiter, reader.quoting)
    text = next((key for key in TEXT_KEYS if spelled(key, header) in header), None)
    if text is None:
        raise BadInput(
            f"{path.name} has no column 'text' (nor 'query'); its columns are: {', '.join(header)} "
            "(a queries table has columns id and text)"
        )
    if text != "text":
        reader = CorpusReader(path, encoding=encoding, columns=False, text_fields=(text,))
    queries = []
    for item in reader:
        if isinstance(item, Entry):
            queries.append(Query(item.id, item.text))
        elif item.reason != "empty line":
            raise BadInput(f"{path} {item.place()}: {item.reason}")
    return queries
