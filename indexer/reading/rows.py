"""Rows given in Python as a corpus: ``build_index`` and ``add_to_index`` take an iterable of dicts
(or of strings, each a text row as a line of a text file is) or a pandas DataFrame as well as a
file path.

Why a spool file: a build reads its corpus twice (a survey of every row, then the parts it
embeds) and a generator can be read only once. Written as JSON Lines, the rows then meet every
check a file's rows meet (ids, text, storable values, field types) in bounded memory, and their
row numbers in rejections are their positions (from 1). pandas stays optional: a DataFrame is
told by its type's module, and pandas' missing values (NaN, NaT, NA) become missing fields.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from collections.abc import Iterable, Mapping
from datetime import date, time
from pathlib import Path
from typing import Any

from indexer.errors import BadInput

ROWS_SOURCE = "rows given in Python"
"""What an index built from rows records as its source (``info``'s ``source``)."""
ROWS_NAME = "the rows given"
"""What a message about rows says where it would name a file."""

CorpusSource = str | os.PathLike | Iterable[Any]
"""A corpus file's path, or rows: dicts (field -> value), strings, or a pandas DataFrame."""


def is_path(corpus: CorpusSource) -> bool:
    return isinstance(corpus, (str, os.PathLike))


def source_name(corpus: CorpusSource) -> str:
    """What the index records as its source: the file's absolute path, or ``ROWS_SOURCE``."""
    return str(Path(corpus).resolve()) if is_path(corpus) else ROWS_SOURCE


class Spool:
    """Rows written to a temporary JSON Lines file (``path``), removed with this object (or at
    exit), as ``tempfile.TemporaryDirectory`` removes its directory."""

    def __init__(self, rows: Iterable[Any]):
        self._directory = tempfile.TemporaryDirectory(prefix="semsearch-rows-")
        self.path = Path(self._directory.name) / "rows.jsonl"
        try:
            with self.path.open("w", encoding="utf-8") as out:
                for number, row in enumerate(_rows(rows), 1):
                    out.write(_line(number, row))
        except BaseException:
            self._directory.cleanup()
            raise


def _rows(corpus: Iterable[Any]) -> Iterable[Any]:
    if isinstance(corpus, bytes | bytearray) or not isinstance(corpus, Iterable):
        given = type(corpus).__name__
        raise BadInput(f"corpus: give a file's path or rows (dicts, strings, a DataFrame), not {given}")
    if type(corpus).__module__.split(".")[0] == "pandas" and hasattr(corpus, "to_dict"):
        return corpus.to_dict("records")
    return corpus


def _line(number: int, row: Any) -> str:
    """One JSON Lines row; a value JSON cannot hold is the caller's error, said with its place."""
    if isinstance(row, str):
        row = {"text": row}
    if not isinstance(row, Mapping):
        raise BadInput(f"row {number} is a {type(row).__name__}: give dicts (field -> value) or strings")
    plain = {str(name): _plain(value) for name, value in row.items()}
    try:
        line = json.dumps(plain, ensure_ascii=False, allow_nan=False, default=_nested) + "\n"
        line.encode("utf-8")  # a lone surrogate is no text a file or the index can hold
        return line
    except UnicodeEncodeError:
        name = next(n for n, v in plain.items() if not _encodes(n) or not _encodes(v))
        raise BadInput(f"row {number}: field {name!r} is not valid UTF-8 text (a lone surrogate)") from None
    except (TypeError, ValueError):
        for name, value in plain.items():
            try:
                json.dumps(value, allow_nan=False, default=_nested)
            except (TypeError, ValueError):
                raise BadInput(
                    f"row {number}: field {name!r} holds a {type(value).__name__}, which an index "
                    "cannot store: give text, a number, a boolean, None, a list or a dict"
                ) from None
        raise


def _encodes(value: Any) -> bool:
    """Whether ``value`` (a name, or a field's value as JSON) is text UTF-8 can write."""
    try:
        json.dumps(value, ensure_ascii=False, default=_nested).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _plain(value: Any) -> Any:
    """A field's value as JSON holds it: NumPy scalars as Python numbers, dates and times as ISO
    text, a missing value (None, NaN, pandas' NaT and NA) as null."""
    if hasattr(value, "item") and type(value).__module__ == "numpy" and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    pandas = sys.modules.get("pandas")
    if pandas is not None and pandas.api.types.is_scalar(value) and pandas.isna(value):
        return None
    if isinstance(value, (date, time)):
        return value.isoformat()
    return value


def _nested(value: Any) -> Any:
    """Inside lists and dicts: NumPy arrays and scalars, dates (``json.dumps``'s ``default``)."""
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (date, time)):
        return value.isoformat()
    raise TypeError(type(value).__name__)
