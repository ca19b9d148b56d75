"""Query files, read one way for ``query --queries`` and the retrieval evaluation.

JSON Lines (ours ``{"id", "text"}`` or BEIR's ``{"_id", "text"}``; ``query`` is also read as the
text) or plain lines, one query each. A query id is always a string: the JSON id as text, else the
line number, so ids from a file match the string ids of qrels and of the index.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from indexer.errors import BadInput
from indexer.reading.corpus import entry_id
from indexer.reading.decoding import lines_of

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

    The file is JSON Lines when its first non-blank line starts with ``{``, else plain lines.
    A line that cannot be read is an error naming it: a query is never dropped silently.
    """
    lines = read_lines(path, encoding)
    numbered = [(n, line.strip()) for n, line in enumerate(lines, 1) if line.strip()]
    if not numbered:
        raise BadInput(f"no queries in {path}")
    if not numbered[0][1].startswith("{"):
        return [Query(str(n), line) for n, line in numbered]
    queries = []
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
        queries.append(query)
    return queries
