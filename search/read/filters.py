"""Metadata filters: ``category = 'billing' AND (year >= 2020 OR tag IN ('a', 'b'))``.

A filter is parsed, never pasted: only conditions on stored fields are accepted, every value
becomes a bound parameter, and the SQL is rebuilt from the parse. The grammar is small enough that
a hand-written parser is shorter and stricter than walking a general SQL parser's tree.

    expr  := term (OR term)*          term := factor (AND factor)*
    factor:= NOT factor | '(' expr ')' | FIELD op VALUE | FIELD [NOT] IN '(' VALUE, ... ')'
           | FIELD IS [NOT] NULL | FIELD [NOT] LIKE 'pattern'
    op    := = == != <> < <= > >=      VALUE := 'text' | number

Numbers compare as numbers (the catalog stores numeric columns as numbers); a text value left in
a numeric column ("n/a") counts as unknown, like NULL, in ``<``, ``<=``, ``>``, ``>=`` with a number.
An integer past 64 bits compares as a real, as SQLite reads such a literal.
    FIELD := name (letters in any script, digits, _) | "any name" (double quotes)

A filter is user input that reaches SQLite, so its size is bounded: at most ``MAX_FILTER_LENGTH``
characters, ``MAX_DEPTH`` levels of parentheses and NOT, ``MAX_TERMS`` conditions and
``MAX_VALUES`` values. Within those bounds SQLite accepts every filter the parser does (its own
limit is an expression depth of 1000), and a deep filter cannot exhaust Python's stack.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from indexer.errors import BadInput, FilterError
from indexer.reading.corpus import nearest, spelled
from search.read.queries import check_text

MAX_FILTER_LENGTH = 8000
MAX_DEPTH = 32
MAX_TERMS = 64
MAX_VALUES = 500
INT64 = (-(1 << 63), (1 << 63) - 1)  # the integers SQLite stores

_TOKEN = re.compile(
    r"""\s*(?:(?P<number>-?\d+(?:\.\d+)?)|'(?P<string>(?:[^']|'')*)'|"(?P<quoted>(?:[^"]|"")+)"|"""
    r"""(?P<op><=|>=|!=|<>|==|=|<|>)|(?P<punct>[(),])|(?P<word>[^\W\d]\w*))"""
)
_KEYWORDS = {"AND", "OR", "NOT", "IN", "IS", "NULL", "LIKE"}
_ORDERINGS = {"<", "<=", ">", ">="}
_QUOTING = (
    "values go in single quotes ('billing'), "
    'field names with spaces or symbols in double quotes ("my field")'
)


@dataclass
class Filter:
    """The SQL condition (placeholders only) and its bound parameters."""

    sql: str
    params: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class _Token:
    kind: str  # value, field, keyword, op, punct
    value: Any
    quoted: bool = False  # a field name written in double quotes


def _tokens(text: str) -> list[_Token]:
    tokens, position = [], 0
    text = text.rstrip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if not match or match.end() == position:
            raise FilterError(f"filter: cannot read {text[position : position + 20]!r}: {_QUOTING}")
        position = match.end()
        kind = match.lastgroup
        value = match.group(kind)
        if kind == "number":
            tokens.append(_Token("value", _number(value)))
        elif kind == "string":
            tokens.append(_Token("value", value.replace("''", "'")))
        elif kind == "quoted":
            tokens.append(_Token("field", value.replace('""', '"'), quoted=True))
        elif kind == "word" and value.upper() in _KEYWORDS:
            tokens.append(_Token("keyword", value.upper()))
        elif kind == "word":
            tokens.append(_Token("field", value))
        else:
            tokens.append(_Token(kind, value))
    return tokens


def _number(text: str) -> int | float:
    """An integer SQLite can bind (64 bits) stays exact; past that, like SQLite reading such a
    literal, it is a real (``int()`` would also refuse more than 4,300 digits)."""
    if "." not in text and len(text.lstrip("-")) <= 19:
        number = int(text)
        if INT64[0] <= number <= INT64[1]:
            return number
    return float(text)


class _Parser:
    def __init__(self, text: str, fields: Collection[str]):
        self.tokens = _tokens(text)
        self.position = 0
        self.fields = fields
        self.params: list[Any] = []
        self.depth = 0
        self.terms = 0

    def peek(self, kind: str, value: str | None = None) -> bool:
        if self.position >= len(self.tokens):
            return False
        token = self.tokens[self.position]
        return token.kind == kind and (value is None or token.value == value)

    def found(self) -> str:
        return repr(self.tokens[self.position].value) if self.position < len(self.tokens) else "the end"

    def take(self, kind: str, value: str | None = None, what: str = "") -> Any:
        if not self.peek(kind, value):
            raise FilterError(f"filter: expected {what or value or kind}, found {self.found()}")
        self.position += 1
        return self.tokens[self.position - 1].value

    def parse(self) -> str:
        sql = self.expr()
        if self.position != len(self.tokens):
            raise FilterError(f"filter: unexpected {self.found()}")
        return sql

    def expr(self) -> str:
        parts = [self.term()]
        while self.peek("keyword", "OR"):
            self.position += 1
            parts.append(self.term())
        return parts[0] if len(parts) == 1 else "(" + " OR ".join(parts) + ")"

    def term(self) -> str:
        parts = [self.factor()]
        while self.peek("keyword", "AND"):
            self.position += 1
            parts.append(self.factor())
        return parts[0] if len(parts) == 1 else "(" + " AND ".join(parts) + ")"

    def nest(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise FilterError(f"filter: nested deeper than {MAX_DEPTH} levels of parentheses and NOT")

    def factor(self) -> str:
        if self.peek("keyword", "NOT"):
            self.position += 1
            self.nest()
            inner = self.factor()
            self.depth -= 1
            return f"(NOT {inner})"
        if self.peek("punct", "("):
            self.position += 1
            self.nest()
            inner = self.expr()
            self.take("punct", ")")
            self.depth -= 1
            return inner
        self.terms += 1
        if self.terms > MAX_TERMS:
            raise FilterError(f"filter: more than {MAX_TERMS} conditions (use IN (...) for many values)")
        return self.condition()

    def value(self, name: str) -> str:
        if self.peek("field") and self.tokens[self.position].quoted:
            text = self.tokens[self.position].value.replace("'", "''")
            raise FilterError(
                f"filter: values take single quotes: {name} = '{text}' (double quotes name a field)"
            )
        self.params.append(self.take("value", what="a quoted text or a number"))
        if len(self.params) > MAX_VALUES:
            raise FilterError(f"filter: more than {MAX_VALUES} values")
        return "?"

    def condition(self) -> str:
        if self.peek("value"):
            raise FilterError(f"filter: expected a field name, found {self.found()}: {_QUOTING}")
        asked = self.take("field", what="a field name")
        name = spelled(asked, self.fields) or asked  # a field name matches whatever its case
        if name not in self.fields:
            raise FilterError(
                f"filter: unknown field {asked!r}{nearest(asked, self.fields)}; fields are: "
                f"{', '.join(sorted(self.fields))} (a name with spaces or symbols goes in double quotes)"
            )
        column = '"' + name.replace('"', '""') + '"'
        if self.peek("op"):
            op = self.take("op")
            op = {"==": "=", "<>": "!="}.get(op, op)
            compared = f"{column} {op} {self.value(name)}"
            if op in _ORDERINGS and isinstance(self.params[-1], (int, float)):
                # SQLite orders text after every number: text in a numeric column is unknown here
                return f"(CASE WHEN typeof({column}) IN ('integer', 'real') THEN {compared} END)"
            return compared
        negate = ""
        if self.peek("keyword", "NOT"):
            self.position += 1
            negate = "NOT "
        if self.peek("keyword", "IN"):
            self.position += 1
            self.take("punct", "(")
            marks = [self.value(name)]
            while self.peek("punct", ","):
                self.position += 1
                marks.append(self.value(name))
            self.take("punct", ")")
            return f"{column} {negate}IN ({', '.join(marks)})"
        if self.peek("keyword", "LIKE"):
            self.position += 1
            return f"{column} {negate}LIKE {self.value(name)}"
        if not negate and self.peek("keyword", "IS"):
            self.position += 1
            is_not = "NOT " if self.peek("keyword", "NOT") else ""
            self.position += bool(is_not)
            self.take("keyword", "NULL")
            return f"{column} IS {is_not}NULL"
        raise FilterError(
            f"filter: expected a comparison after {name!r} (=, !=, <, >, IN, LIKE, IS NULL), "
            f"found {self.found()}: {_QUOTING}"
        )


def parse_filter(text: str, fields: Collection[str]) -> Filter:
    """Parse ``text`` into parameterised SQL over ``fields``; anything else is a clear error."""
    if not isinstance(text, str):
        raise FilterError(f"filter: a condition is text, not {type(text).__name__}")
    if not text.strip():
        raise FilterError("filter: empty condition")
    if len(text) > MAX_FILTER_LENGTH:
        raise FilterError(f"filter: longer than {MAX_FILTER_LENGTH} characters")
    try:
        check_text(text, "filter: the condition")
    except BadInput as exc:
        raise FilterError(str(exc)) from None
    parser = _Parser(text, fields)
    return Filter(parser.parse(), parser.params)
