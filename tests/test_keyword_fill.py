"""A new version's keyword table reads its rows part by part as they are put: at the commit it
holds every row once, exactly as FTS5 would read them all, whatever the parts were."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from indexer.catalog import Catalog
from indexer.reading.corpus import Entry

WORDS = ["apple", "pear", "plum", "fig", "kiwi", "lime"]


def entries(start: int, count: int, shift: int = 0) -> list[Entry]:
    """Rows of made-up texts; another ``shift``: other texts for the same row ids."""
    rows = range(start, start + count)
    return [
        Entry(
            f"e{i}", f"{WORDS[(i + shift) % 6]} and {WORDS[(i * 5) % 6]} number {i}", {"note": WORDS[i % 4]}
        )
        for i in rows
    ]


def hits(db: sqlite3.Connection, word: str) -> list[int]:
    return [
        r for (r,) in db.execute("select rowid from keywords where keywords match ? order by rowid", (word,))
    ]


@pytest.mark.parametrize(
    "parts",
    [
        [(1, 40), (41, 25), (66, 1)],  # runs of new row ids, as a build puts them
        [(1, 40), (30, 20)],  # a row put again: the commit reads them all
        [(5, 10), (1, 4)],  # row ids going back
    ],
)
@pytest.mark.parametrize("also", [(), ("note",)], ids=["text", "text+also"])
def test_a_bulk_keyword_table_holds_every_row_once(tmp_path: Path, parts, also) -> None:
    catalog = Catalog.create(tmp_path / "c.db", {"note": "text"}, list(also), bulk=True)
    for shift, (start, count) in enumerate(parts):  # a row put again has another text
        catalog.put(entries(start, count, shift), list(range(start, start + count)), [1] * count)
    catalog.commit()
    db = catalog.db
    db.execute("insert into keywords(keywords) values ('integrity-check')")  # raises where it is not exact
    kept = db.execute("select _rowid, _text, note from entries order by _rowid").fetchall()
    for word in WORDS:  # a word is found in the text, and in the also field where it is read
        assert hits(db, word) == [r for r, t, n in kept if word in t.split() or (also and n == word)], word
    catalog.put(entries(500, 1), [500], [1])  # after the commit the triggers keep it exact
    catalog.delete([1])
    catalog.commit()
    db.execute("insert into keywords(keywords) values ('integrity-check')")
    assert 500 in hits(db, WORDS[500 % 6]) and 1 not in hits(db, WORDS[1])
    catalog.close()


def test_a_bulk_table_with_rows_deleted_before_the_commit_reads_them_all(tmp_path: Path) -> None:
    catalog = Catalog.create(tmp_path / "c.db", {"note": "text"}, [], bulk=True)
    catalog.put(entries(1, 12), list(range(1, 13)), [1] * 12)
    catalog.delete([2, 3])
    catalog.commit()
    catalog.db.execute("insert into keywords(keywords) values ('integrity-check')")
    assert 2 not in hits(catalog.db, WORDS[2]) and 8 in hits(catalog.db, WORDS[2])
    catalog.close()


@pytest.mark.parametrize("also", [(), ("note",)], ids=["text", "text+also"])
def test_a_large_put_keeps_the_keyword_table_exact_without_its_triggers(tmp_path: Path, also) -> None:
    """A put of many rows into a live catalog (an ``add``): the rows it replaces leave the
    keyword table and its rows enter it by two statements; the triggers are back after it."""
    from indexer.catalog.keywords import MANY_ROWS

    catalog = Catalog.create(tmp_path / "c.db", {"note": "text"}, list(also))  # kept by its triggers
    catalog.put(entries(1, 300), list(range(1, 301)), [1] * 300)
    catalog.commit()
    triggers = catalog.db.execute("select name, sql from sqlite_master where type = 'trigger' order by name")
    kept = triggers.fetchall()
    many = MANY_ROWS + 50  # rows 201..300 replaced with other texts, the rest new
    catalog.put(entries(201, many, shift=1), list(range(201, 201 + many)), [1] * many)
    catalog.commit()
    db = catalog.db
    db.execute("insert into keywords(keywords) values ('integrity-check')")
    assert (
        db.execute("select name, sql from sqlite_master where type = 'trigger' order by name").fetchall()
        == kept
    )
    rows = db.execute("select _rowid, _text, note from entries order by _rowid").fetchall()
    for word in WORDS:
        assert hits(db, word) == [r for r, t, n in rows if word in t.split() or (also and n == word)], word
    catalog.put(entries(250, 3, shift=2), [250, 251, 252], [1] * 3)  # a small put: the triggers
    catalog.delete([1, 260])
    catalog.commit()
    db.execute("insert into keywords(keywords) values ('integrity-check')")
    rows = db.execute("select _rowid, _text, note from entries order by _rowid").fetchall()
    for word in WORDS:
        assert hits(db, word) == [r for r, t, n in rows if word in t.split() or (also and n == word)], word
    catalog.close()


def test_a_large_put_never_committed_leaves_the_triggers_and_the_table(tmp_path: Path) -> None:
    """A writer killed after a large put, before its commit: the catalog reads as before it, its
    triggers in place (dropping them is part of the put's transaction)."""
    from indexer.catalog.keywords import MANY_ROWS

    catalog = Catalog.create(tmp_path / "c.db", {"note": "text"}, [])
    catalog.put(entries(1, 10), list(range(1, 11)), [1] * 10)
    catalog.commit()
    catalog.put(entries(5, MANY_ROWS, shift=1), list(range(5, 5 + MANY_ROWS)), [1] * MANY_ROWS)
    catalog.close()  # no commit: rolled back
    again = Catalog(tmp_path / "c.db", readonly=False)
    triggers = again.db.execute(
        "select name from sqlite_master where type = 'trigger' and name like 'keywords%'"
    )
    assert len(triggers.fetchall()) == 3
    assert again.db.execute("select count(*) from entries").fetchone() == (10,)
    again.db.execute("insert into keywords(keywords) values ('integrity-check')")
    again.put(entries(11, 1), [11], [1])  # kept by the triggers still
    again.commit()
    assert 11 in hits(again.db, WORDS[11 % 6])
    again.close()
