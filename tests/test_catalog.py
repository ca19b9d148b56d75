"""The catalog (SQLite half of an index): field types detected at build so numbers compare as
numbers, document semantics for upserts, and operations on any number of ids."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from indexer import Strategy, build_index
from indexer.reading.corpus import Entry
from indexer.store import open_index, write_index
from indexer.writing.update import add_to_index, delete_from_index
from search import SearchEngine

PRICES = [("a", "9.5", "999"), ("b", "10", "2020"), ("c", "12", "2021")]


def corpus(tmp_path: Path, fmt: str, rows=PRICES) -> Path:
    path = tmp_path / f"c.{fmt}"
    if fmt == "jsonl":
        lines = [
            json.dumps({"id": i, "text": f"item {i}", "price": float(p), "year": int(y)}) for i, p, y in rows
        ]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    else:
        sep = "," if fmt == "csv" else "\t"
        lines = [sep.join(["id", "text", "price", "year"])] + [
            sep.join([i, f"item {i}", p, y]) for i, p, y in rows
        ]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def ids(engine: SearchEngine, where: str) -> set[str]:
    return {h.id for h in engine.search("item", k=50, where=where)}


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl"])
def test_numeric_fields_compare_as_numbers(tmp_path, tiny_model, fmt):
    build_index(corpus(tmp_path, fmt), tmp_path / "idx", Strategy(model=tiny_model))
    engine = SearchEngine(tmp_path / "idx")
    assert ids(engine, "price < 10") == {"a"}
    assert ids(engine, "year >= 2020") == {"b", "c"}
    assert ids(engine, "price >= 9.5 AND price <= 10") == {"a", "b"}
    hit = engine.search("item b", k=3, where="id = 'b'")[0]
    assert hit.fields["year"] == 2020 and type(hit.fields["year"]) is int
    assert hit.fields["price"] == 10 and type(hit.fields["price"]) is int  # NUMERIC: 10.0 comes back as 10


def test_empty_cells_and_text_in_a_numeric_column(tmp_path, tiny_model):
    rows = [
        ("a", "9.5", "999"),
        ("b", "", "2020"),
        ("c", "n/a", "2021"),
        ("d", "12", "2022"),
        ("e", "10", ""),
    ]
    build_index(corpus(tmp_path, "csv", rows), tmp_path / "idx", Strategy(model=tiny_model))
    engine = SearchEngine(tmp_path / "idx")
    assert ids(engine, "price < 11") == {"a", "e"}  # 'n/a' and the empty cell are not numbers below 11
    assert ids(engine, "price IS NULL") == {"b"} and ids(engine, "year IS NULL") == {"e"}
    assert engine.search("item c", k=1, where="id = 'c'")[0].fields["price"] == "n/a"
    assert open_index(tmp_path / "idx").info()["fields"]["price"] == "number"


def test_added_rows_keep_the_column_types(tmp_path, tiny_model):
    build_index(corpus(tmp_path, "csv"), tmp_path / "idx", Strategy(model=tiny_model))
    more = tmp_path / "more.csv"
    more.write_text("id,text,price,year,stock\nd,item d,7.5,1999,3\n", encoding="utf-8")
    add_to_index(tmp_path / "idx", more)
    engine = SearchEngine(tmp_path / "idx")
    assert ids(engine, "price < 9") == {"d"} and ids(engine, "year < 2000") == {"a", "d"}
    assert ids(engine, "stock > 2") == {"d"}  # a new column gets its type from the added rows
    fields = engine.search("item d", k=1, where="id = 'd'")[0].fields
    assert fields["price"] == 7.5 and type(fields["stock"]) is int


def test_jsonl_integers_stay_integers(tmp_path, tiny_model):
    rows = [{"id": "a", "text": "x", "n": 9.5, "m": 3}, {"id": "b", "text": "y", "n": 10, "m": 4}]
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    build_index(path, tmp_path / "idx", Strategy(model=tiny_model))
    got = {r["_id"]: r for r in open_index(tmp_path / "idx").rows([1, 2]).values()}
    assert (got["a"]["n"], got["b"]["n"], got["b"]["m"]) == (9.5, 10, 4)
    assert type(got["b"]["n"]) is int and type(got["b"]["m"]) is int


def test_upsert_replaces_the_fields_of_an_entry(tmp_path, tiny_model):
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "a", "text": "x", "colour": "red", "size": 3}\n', encoding="utf-8")
    build_index(path, tmp_path / "idx", Strategy(model=tiny_model))
    update = tmp_path / "u.jsonl"
    update.write_text('{"id": "a", "text": "x", "size": 4}\n', encoding="utf-8")
    report = add_to_index(tmp_path / "idx", update)
    assert report.updated == 1
    row = open_index(tmp_path / "idx").rows([1])[1]
    assert (row["size"], row["colour"]) == (4, None)
    again = add_to_index(tmp_path / "idx", update)
    assert (again.updated, again.unchanged) == (0, 1)
    update.write_text('{"id": "a", "text": "x"}\n', encoding="utf-8")  # dropping a field is a change too
    assert add_to_index(tmp_path / "idx", update).updated == 1
    assert open_index(tmp_path / "idx").rows([1])[1]["size"] is None


LOWERED_LIMIT = 999
"""Bound parameters a statement may hold in the test below: SQLite's default before 3.32 (32,766
since, 250,000 in Debian's build), low enough that a thousand ids cross it."""


def test_delete_and_read_any_number_of_ids(tmp_path, tiny_model, monkeypatch):
    """Past SQLite's bound-parameter limit (lowered to 999 on every connection the index opens, so
    a small index crosses it as a 100,000-entry one crosses the installed limit): one call deletes
    600 ids among 1,600 unknown ones, and rows() reads 2,600 row ids."""
    connect = sqlite3.connect

    def limited(*args, **kwargs) -> sqlite3.Connection:
        db = connect(*args, **kwargs)
        db.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, LOWERED_LIMIT)
        return db

    monkeypatch.setattr(sqlite3, "connect", limited)
    with pytest.raises(sqlite3.OperationalError, match="too many SQL variables"):  # the limit holds
        sqlite3.connect(":memory:").execute("select " + ", ".join("?" * 1000), range(1000))
    n = 1_000
    rng = np.random.default_rng(0)
    entries = [Entry(f"e{i}", f"t{i}", {"id": f"e{i}"}) for i in range(n)]
    index_dir = tmp_path / "idx"
    index_dir.mkdir()
    write_index(
        index_dir,
        Strategy(model=tiny_model),
        entries,
        rng.normal(size=(n, 8)).astype(np.float32),
        np.arange(n),
        source={"path": "generated", "text_fields": ["text"]},
        index_kind="flat",
    )
    assert len(open_index(index_dir).rows(list(range(1, 2_601)))) == n
    gone = [f"e{i}" for i in range(400, n)] + [f"unknown{i}" for i in range(1_600)]
    report = delete_from_index(index_dir, gone)
    assert (report.deleted, len(report.not_found), report.count) == (600, 1_600, 400)
    live = open_index(index_dir)
    assert live.vectors.count == 400 and live.rows([1])[1]["_id"] == "e0"


def test_beir_corpus_builds_with_its_ids(tmp_path, tiny_model):
    rows = [
        {"_id": "doc1", "title": "Parking", "text": "Bikes park at the station.", "metadata": {}},
        {"_id": "doc2", "title": "", "text": "We accept all major cards.", "metadata": {"src": "faq"}},
    ]
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    build_index(path, tmp_path / "idx", Strategy(model=tiny_model), text_fields=["title", "text"])
    top = SearchEngine(tmp_path / "idx").search("We accept all major cards.", k=1)[0]
    assert (top.id, top.text, top.fields["title"]) == ("doc2", "We accept all major cards.", "")
    assert top.fields["metadata"] == {"src": "faq"} and "_id" not in top.fields
    assert open_index(tmp_path / "idx").info()["id_field"] == "_id"
    more = tmp_path / "more.jsonl"
    more.write_text(json.dumps({"_id": "doc2", "title": "Cards", "text": "Visa only."}) + "\n")
    report = add_to_index(tmp_path / "idx", more)  # the same id field: an update, not a new entry
    assert (report.added, report.updated, report.count) == (0, 1, 2)


def test_codes_and_ids_stay_text(tmp_path, tiny_model):
    """A value that would not come back as written if stored as a number (a leading zero, a
    plus sign, more digits than 64 bits hold) is text, and makes its column text; the id column is
    text whatever its values, so "01" and "1" stay two ids with their own field values."""
    path = tmp_path / "c.csv"
    path.write_text(
        "id,text,zip,phone,big\n1,alpha,02134,+4420,1\n2,beta,90210,4420,2\n3,gamma,10001,4421,3\n"
        "01,delta,20001,4422,99999999999999999999999\n",
        encoding="utf-8",
    )
    build_index(path, tmp_path / "idx", Strategy(model=tiny_model))
    types = open_index(tmp_path / "idx").info()["fields"]
    assert (types["id"], types["zip"], types["phone"], types["big"]) == ("text", "text", "text", "text")
    engine = SearchEngine(tmp_path / "idx")
    fields = {h.id: h.fields for h in engine.search("alpha", k=4)}
    assert (fields["1"]["id"], fields["01"]["id"], fields["1"]["zip"]) == ("1", "01", "02134")
    assert (fields["1"]["phone"], fields["01"]["big"]) == ("+4420", "99999999999999999999999")
    assert ids(engine, "zip = '02134'") == {"1"} and ids(engine, "id = '01'") == {"01"}
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text('{"id": 1, "text": "x", "n": 99999999999999999999999}\n{"id": 2, "text": "y", "n": 5}\n')
    build_index(jsonl, tmp_path / "j", Strategy(model=tiny_model))
    row = open_index(tmp_path / "j").rows([1])[1]
    assert (row["id"], row["n"]) == ("1", 99999999999999999999999)  # a JSON number: a number
    again = add_to_index(tmp_path / "j", jsonl)  # the same file again changes nothing
    assert (again.added, again.updated, again.unchanged) == (0, 0, 2)


BIG, LOW = 99999999999999999999999, -(2**70)
EXACT = [
    {"id": "a", "text": "item a", "n": BIG, "z": -0.0},
    {"id": "b", "text": "item b", "n": 5, "z": 1.5},
    {"id": "c", "text": "item c", "n": LOW, "z": 0.0},
]


def test_jsonl_numbers_sqlite_cannot_hold_come_back_as_written(tmp_path, tiny_model):
    """A JSON integer past 64 bits and -0.0 come back as written (Python hits, their JSON), the
    other rows of their columns keep their number types, filters compare them as numbers, and an
    update sees a change to one (to -0.0 from 0, to another integer past 64 bits)."""
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in EXACT), encoding="utf-8")
    build_index(path, tmp_path / "idx", Strategy(model=tiny_model))
    types = open_index(tmp_path / "idx").info()["fields"]
    assert (types["n"], types["z"]) == ("integer", "number")
    engine = SearchEngine(tmp_path / "idx")
    hits = {h.id: h for h in engine.search("item", k=3)}
    got = {i: (h.fields["n"], h.fields["z"]) for i, h in hits.items()}
    assert got == {"a": (BIG, -0.0), "b": (5, 1.5), "c": (LOW, 0)}
    assert [type(got[i][0]) for i in "abc"] == [int, int, int]
    shown = json.dumps(hits["a"].to_dict()["fields"])  # what query --json prints
    assert shown == f'{{"id": "a", "text": "item a", "n": {BIG}, "z": -0.0}}'
    assert json.dumps(hits["c"].fields["z"]) == "0"
    from fastapi.testclient import TestClient

    from search.server import create_app

    with TestClient(create_app(tmp_path / "idx")) as client:
        answered = client.post("/search", json={"query": "item", "k": 3})
    assert f'"n":{BIG},"z":-0.0' in answered.text and f'"n":{LOW},"z":0' in answered.text
    assert ids(engine, "n > 1000") == {"a"} and ids(engine, "n < 0") == {"c"}
    assert ids(engine, "z = 0") == {"a", "c"} and ids(engine, "z < 1") == {"a", "c"}
    again = add_to_index(tmp_path / "idx", path)
    assert (again.updated, again.unchanged) == (0, 3)
    changed = [{**EXACT[0], "n": BIG + 1, "z": 0.0}, EXACT[1], {**EXACT[2], "z": -0.0}]
    path.write_text("".join(json.dumps(r) + "\n" for r in changed), encoding="utf-8")
    report = add_to_index(tmp_path / "idx", path)
    assert (report.updated, report.unchanged) == (2, 1)
    rows = {r["_id"]: r for r in open_index(tmp_path / "idx").rows([1, 2, 3]).values()}
    assert [(rows[i]["n"], json.dumps(rows[i]["z"])) for i in "ac"] == [(BIG + 1, "0"), (LOW, "-0.0")]


def test_added_code_in_a_number_column_is_rejected_not_converted(tmp_path, tiny_model):
    path = tmp_path / "c.csv"
    path.write_text("id,text,zip\na,alpha,90210\nb,beta,10001\n", encoding="utf-8")
    build_index(path, tmp_path / "idx", Strategy(model=tiny_model))
    more = tmp_path / "more.csv"
    more.write_text("id,text,zip\nc,gamma,02134\nd,delta,20001\ne,eps,n/a\n", encoding="utf-8")
    report = add_to_index(tmp_path / "idx", more)
    assert (report.added, [r.row for r in report.rejected]) == (2, [1])
    assert "'zip'" in report.rejected[0].reason and "02134" in report.rejected[0].reason
    rows = {r["_id"]: r for r in open_index(tmp_path / "idx").rows(range(1, 10)).values()}
    assert (rows["d"]["zip"], rows["e"]["zip"]) == (20001, "n/a") and "c" not in rows


def test_catalog_reads_texts_groups_and_filter_matches(tmp_path):
    """The catalog alone (no model): distinct texts by hash, the largest group of entries sharing
    one text, and the (row id, vectors) a filter condition admits."""
    from indexer.catalog import Catalog, content_hash

    catalog = Catalog.create(tmp_path / "meta.db", {"price": "number"})
    assert catalog.largest_text_group() == 0 and catalog.texts_by_hash() == {}
    entries = [Entry("a", "same", {"price": 3}), Entry("b", "same", {"price": 9}), Entry("c", "other", {})]
    catalog.put(entries, [0, 1, 2], [1, 2, 1])
    assert catalog.texts_by_hash() == {content_hash("same"): "same", content_hash("other"): "other"}
    assert catalog.largest_text_group() == 2
    assert sorted(catalog.matching('"price" > ?', [2])) == [(0, 1), (1, 2)]


NESTED = [
    {"id": "a", "text": "item a", "metadata": {}, "tags": ["x", {"k": 1}], "note": "{}", "raw": "[1, 2]"},
    {"id": "b", "text": "item b", "metadata": {"k": [1, 2.5, None, True]}, "tags": [], "note": "plain"},
]


def test_nested_json_fields_come_back_as_json(tmp_path, tiny_model):
    """A JSON object or array comes back as one from every search (CLI and HTTP hits are these),
    a string that reads as JSON as the string; filters and groups see the JSON text."""
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in NESTED), encoding="utf-8")
    build_index(path, tmp_path / "idx", Strategy(model=tiny_model))
    engine = SearchEngine(tmp_path / "idx")
    fields = {h.id: h.fields for h in engine.search("item", k=5)}
    shown = [fields["a"][k] for k in ("metadata", "tags", "note", "raw")]
    assert shown == [{}, ["x", {"k": 1}], "{}", "[1, 2]"]
    assert fields["b"]["metadata"] == {"k": [1, 2.5, None, True]} and fields["b"]["tags"] == []
    assert (type(fields["a"]["note"]), type(fields["a"]["raw"]), fields["b"]["raw"]) == (str, str, None)
    assert ids(engine, "metadata = '{}'") == {"a"} and ids(engine, "tags LIKE '%\"k\"%'") == {"a"}
    assert len(engine.search("item", k=5, group_by="metadata")) == 2

    update = tmp_path / "u.jsonl"
    swapped = [{**NESTED[0], "metadata": "{}", "note": {}}, NESTED[1]]  # the same JSON text, other kinds
    update.write_text("".join(json.dumps(r) + "\n" for r in swapped), encoding="utf-8")
    report = add_to_index(tmp_path / "idx", update)
    assert (report.updated, report.unchanged) == (1, 1)
    rows = {r["_id"]: r for r in open_index(tmp_path / "idx").rows([1, 2]).values()}
    assert (rows["a"]["metadata"], rows["a"]["note"], rows["b"]["tags"]) == ("{}", {}, [])


def test_a_nested_value_json_answers_cannot_carry_stays_its_text(tmp_path):
    """NaN inside a list (JSON Lines reads it) would make an HTTP answer fail: it comes back as
    its text; an update still sees it unchanged."""
    from indexer.catalog import Catalog
    from indexer.reading.field_types import comparable

    catalog = Catalog.create(tmp_path / "meta.db", {"m": "text"})
    fields = {"m": [float("nan"), 1]}
    catalog.put([Entry("a", "t", fields), Entry("b", "t", {"m": [1]})], [1, 2], [1, 1])
    rows = catalog.rows([1, 2])
    assert (rows[1]["m"], rows[2]["m"]) == ("[NaN, 1]", [1])
    assert catalog.fingerprints(["a"])["a"][1] == comparable(fields, {"m": "text"})
