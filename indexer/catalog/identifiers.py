"""How a field's name reaches SQL: as a quoted identifier, so any name (quotes, spaces, SQL) is a
name, never syntax."""

from __future__ import annotations


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
