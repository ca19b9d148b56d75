"""Metadata filters: ``category = 'billing' AND (year >= 2020 OR tag IN ('a', 'b'))``.

A filter is parsed, never pasted: only conditions on stored fields are accepted, every value
becomes a bound parameter, and the SQL is rebuilt from the parse. The grammar is small enough that
a hand-written parser is shorter and stricter than walking a general SQL parser's tree.

    expr  := term (OR term)*          term := factor (AND factor)*
    factor:= NOT factor | '(' expr ')' | FIELD op VALUE | FIELD [NOT] IN '(' VALUE, ... ')'
           | FIELD IS [NOT] NULL | FIELD [NOT] LIKE 'pattern'
    op    := = == != <> < <= > >=      VALUE := 'text' | number
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from indexer.errors import FilterError

_TOKEN = re.compile(
    r"""\s*(?:(?P<number>-?\d+(?:\.\d+)?)|'(?P<string>(?:[^']|'')*)'|"(?P<quoted>(?:[^"]|"")+)"|"""
    r"""(?P<op><=|>=|!=|<>|==|=|<|>)|(?P<punct>[(),])|(?P<word>[A-Za-z_][A-Za-z0-9_]*))"""
)
_KEYWORDS = {"AND", "OR", "NOT", "IN", "IS", "NULL", "LIKE"}


@dataclass
class Filter:
    """The SQL condition (placeholders only) and its bound parameters."""

    sql: str
    params: list[Any] = field(default_factory=list)


def _tokens(text: str) -> list[tuple[str, Any]]:
    tokens, position = [], 0
    text = text.rstrip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if not match or match.end() == position:
            raise FilterError(f"filter: cannot read {text[position : position + 20]!r}")
        position = match.end()
        kind = match.lastgroup
        value = match.group(kind)
        if kind == "number":
            tokens.append(("value", float(value) if "." in value else int(value)))
        elif kind == "string":
            tokens.append(("value", value.replace("''", "'")))
        elif kind == "quoted":
            tokens.append(("field", value.replace('""', '"')))
        elif kind == "word" and value.upper() in _KEYWORDS:
            tokens.append(("keyword", value.upper()))
        elif kind == "word":
            tokens.append(("field", value))
        else:
            tokens.append((kind, value))
    return tokens


class _Parser:
    def __init__(self, text: str, fields: Collection[str]):
        self.tokens = _tokens(text)
        self.position = 0
        self.fields = fields
        self.params: list[Any] = []

    def peek(self, kind: str, value: str | None = None) -> bool:
        if self.position >= len(self.tokens):
            return False
        token_kind, token_value = self.tokens[self.position]
        return token_kind == kind and (value is None or token_value == value)

    def take(self, kind: str, value: str | None = None, what: str = "") -> Any:
        if not self.peek(kind, value):
            found = self.tokens[self.position][1] if self.position < len(self.tokens) else "the end"
            raise FilterError(f"filter: expected {what or value or kind}, found {found!r}")
        self.position += 1
        return self.tokens[self.position - 1][1]

    def parse(self) -> str:
        sql = self.expr()
        if self.position != len(self.tokens):
            raise FilterError(f"filter: unexpected {self.tokens[self.position][1]!r}")
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

    def factor(self) -> str:
        if self.peek("keyword", "NOT"):
            self.position += 1
            return f"(NOT {self.factor()})"
        if self.peek("punct", "("):
            self.position += 1
            inner = self.expr()
            self.take("punct", ")")
            return inner
        return self.condition()

    def value(self) -> str:
        self.params.append(self.take("value", what="a quoted text or a number"))
        return "?"

    def condition(self) -> str:
        name = self.take("field", what="a field name")
        if name not in self.fields:
            raise FilterError(f"filter: unknown field {name!r}; fields are: {', '.join(sorted(self.fields))}")
        column = '"' + name.replace('"', '""') + '"'
        if self.peek("op"):
            op = {"==": "=", "<>": "!="}.get(self.tokens[self.position][1], self.tokens[self.position][1])
            self.position += 1
            return f"{column} {op} {self.value()}"
        negate = ""
        if self.peek("keyword", "NOT"):
            self.position += 1
            negate = "NOT "
        if self.peek("keyword", "IN"):
            self.position += 1
            self.take("punct", "(")
            marks = [self.value()]
            while self.peek("punct", ","):
                self.position += 1
                marks.append(self.value())
            self.take("punct", ")")
            return f"{column} {negate}IN ({', '.join(marks)})"
        if self.peek("keyword", "LIKE"):
            self.position += 1
            return f"{column} {negate}LIKE {self.value()}"
        if not negate and self.peek("keyword", "IS"):
            self.position += 1
            is_not = "NOT " if self.peek("keyword", "NOT") else ""
            self.position += bool(is_not)
            self.take("keyword", "NULL")
            return f"{column} IS {is_not}NULL"
        raise FilterError(f"filter: expected a comparison after {name!r} (=, !=, <, >, IN, LIKE, IS NULL)")


def parse_filter(text: str, fields: Collection[str]) -> Filter:
    """Parse ``text`` into parameterised SQL over ``fields``; anything else is a clear error."""
    if not text or not text.strip():
        raise FilterError("filter: empty condition")
    parser = _Parser(text, fields)
    return Filter(parser.parse(), parser.params)
