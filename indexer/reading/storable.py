"""Why a parsed row's values cannot be stored as SQLite text: a NUL, a surrogate (bytes the
file's encoding could not decode, or a JSON ``\\ud83d`` escape cut from its pair), or nesting
deeper than ``MAX_DEPTH``; and the bytes that did not decode, named as a rejection names them."""

from __future__ import annotations

import codecs
import json
import re
from typing import Any

from indexer.reading.decoding import SURROGATE, bytes_named
from indexer.reading.formats import MAX_DEPTH, TOO_DEEP

UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
"""Characters SQLite cannot take as text: NUL, and any surrogate (UTF-8 cannot encode one)."""


UNDECODABLE = "undecodable"
"""``unstorable``'s reason for bytes the encoding could not decode, said by ``undecodable_reason``."""


def undecodable_reason(found: str, encoding: str) -> str:
    """Why a row whose bytes ``encoding`` could not decode is rejected, naming the bytes
    (``found``: the characters ``surrogateescape`` made of them)."""
    label = f"invalid {encoding.upper()}: " + bytes_named(ord(char) - 0xDC00 for char in found)
    if codecs.lookup(encoding).name == "cp1252":  # one of the five bytes cp1252 leaves undefined
        return label + ", which cp1252 has no character for"
    return label


def undecodable_chars(row: dict[str, Any]) -> str:
    """The characters in a row that stand for bytes its encoding could not decode."""
    try:
        return "".join(SURROGATE.findall(json.dumps(row, ensure_ascii=False)))
    except RecursionError:
        return ""


def unstorable(row: dict[str, Any]) -> str | None:
    """Why a row's names or values cannot be stored as text (a NUL, a surrogate, nesting deeper
    than ``MAX_DEPTH``), looking at every level without recursing; or None."""
    try:  # the common row, names and values all strings: one search over them all
        flat = "".join(row) + "".join(row.values())
    except TypeError:  # a number, a null, a list or an object: every level, below
        pass
    else:  # ASCII holds no surrogate: only a NUL is left to look for, without the regex
        if "\x00" not in flat if flat.isascii() else not UNSTORABLE.search(flat):
            return None
    pending: list[tuple[Any, int]] = [(row, 0)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                return TOO_DEEP
            items = value.items() if isinstance(value, dict) else enumerate(value)
            pending.extend((part, depth + 1) for pair in items for part in pair)
        elif isinstance(value, str) and (found := UNSTORABLE.search(value)):
            char = found.group()
            if char == "\x00":
                return "binary data: NUL bytes"
            if SURROGATE.match(char):
                return UNDECODABLE
            return f"invalid text: lone surrogate \\u{ord(char):04x} (half of a character, cut in two?)"
    return None
