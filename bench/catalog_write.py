"""The catalog's own SQLite code against sqlite-utils doing the same work, in the same run: writing
a 30k-entry build's ``entries`` table (create with types, insert every row, commit) and reading a
query's hits back (10 rows by row id, as every query does).

    .venv/bin/python bench/catalog_write.py [--rows 30000] [--repeats 5] [--reads 2000]

Rows are FAQ-like: an id, a question, its hash, one chunk, and three fields (an answer of ~40
words, a category, a price). Both sides store the values ``Catalog.put`` stores (its typing rules
are not sqlite-utils'): only the SQLite calls differ. Runs alternate; medians are reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from indexer.catalog import Catalog, content_hash  # noqa: E402
from indexer.reading.corpus import Entry  # noqa: E402
from indexer.reading.field_types import stored_value  # noqa: E402

TYPES = {"answer": "text", "category": "text", "price": "number"}
SQLITE_UTILS_TYPES = {"_rowid": int, "_id": str, "_text": str, "_hash": str, "_chunks": int}


def entries(count: int) -> list[Entry]:
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(500)]
    return [
        Entry(
            str(i),
            " ".join(rng.choice(words, 12)),
            {"answer": " ".join(rng.choice(words, 40)), "category": f"c{i % 7}", "price": f"{i % 100}.5"},
        )
        for i in range(count)
    ]


def write_catalog(path: Path, rows: list[Entry]) -> float:
    started = time.perf_counter()
    catalog = Catalog.create(path, TYPES)
    catalog.put(rows, range(len(rows)), [1] * len(rows))
    catalog.commit()
    catalog.close()
    return time.perf_counter() - started


def write_sqlite_utils(path: Path, rows: list[Entry]) -> float:
    import sqlite_utils

    started = time.perf_counter()
    db = sqlite_utils.Database(path)
    columns = {**SQLITE_UTILS_TYPES, "answer": str, "category": str, "price": float}
    db["meta"].create({"key": str, "value": str}, pk="key")
    db["entries"].create(columns, pk="_rowid", not_null={"_id"})
    db["entries"].create_index(["_id"], unique=True)
    db["entries"].insert_all(
        (
            {
                "_rowid": i,
                "_id": e.id,
                "_text": e.text,
                "_hash": content_hash(e.text),
                "_chunks": 1,
                **{name: stored_value(value, TYPES[name]) for name, value in e.fields.items()},
            }
            for i, e in enumerate(rows)
        ),
        replace=True,
    )
    db.conn.commit()
    db.close()
    return time.perf_counter() - started


def read_catalog(path: Path, asked: list[list[int]]) -> float:
    catalog = Catalog(path)
    started = time.perf_counter()
    for rowids in asked:
        catalog.rows(rowids)
    elapsed = time.perf_counter() - started
    catalog.close()
    return elapsed


def read_sqlite_utils(path: Path, asked: list[list[int]]) -> float:
    import sqlite_utils

    db = sqlite_utils.Database(path)
    table = db["entries"]
    started = time.perf_counter()
    for rowids in asked:
        {
            row["_rowid"]: row
            for row in table.rows_where("_rowid in (select value from json_each(?))", [json.dumps(rowids)])
        }
    elapsed = time.perf_counter() - started
    db.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=30000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--reads", type=int, default=2000)
    args = parser.parse_args()
    rows = entries(args.rows)
    rng = np.random.default_rng(1)
    asked = [rng.choice(args.rows, 10, replace=False).tolist() for _ in range(args.reads)]
    times: dict[str, list[float]] = {"catalog write": [], "sqlite-utils write": []}
    reads: dict[str, list[float]] = {"catalog read": [], "sqlite-utils read": []}
    with tempfile.TemporaryDirectory() as scratch:
        for run in range(args.repeats):
            ours, theirs = Path(scratch, f"c{run}.db"), Path(scratch, f"s{run}.db")
            times["catalog write"].append(write_catalog(ours, rows))
            times["sqlite-utils write"].append(write_sqlite_utils(theirs, rows))
            reads["catalog read"].append(read_catalog(ours, asked))
            reads["sqlite-utils read"].append(read_sqlite_utils(theirs, asked))
    for name, measured in times.items():
        ms = statistics.median(measured) * 1000
        print(f"{name}: {ms:.0f} ms for {args.rows} rows (median of {args.repeats})")
    for name, measured in reads.items():
        per = statistics.median(measured) / args.reads * 1e6
        print(f"{name}: {per:.0f} us per query's 10 rows (median of {args.repeats} x {args.reads})")


if __name__ == "__main__":
    main()
