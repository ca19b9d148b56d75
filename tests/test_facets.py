"""Facets (``Catalog.facets``): what the search page builds its filters from. Field names are
user data and reach SQL as quoted identifiers, so hostile names are tested too."""

from __future__ import annotations

from pathlib import Path

from indexer.catalog import Catalog
from indexer.reading.corpus import Entry
from indexer.reading.field_types import detect_types
from search.read.filters import parse_filter

HOSTILE = ['say "hi"', "with space", "catégorie 分类", "x'); drop table entries; --"]


def catalog(tmp_path: Path, rows: list[dict]) -> Catalog:
    entries = [Entry(f"e{i}", f"text {i}", row) for i, row in enumerate(rows)]
    created = Catalog.create(tmp_path / "meta.db", detect_types(e.fields for e in entries))
    created.put(entries, list(range(len(entries))), [1] * len(entries))
    created.commit()
    return created


def test_values_counts_and_ranges(tmp_path):
    rows = [
        {"category": c, "year": y, "price": p, "note": n}
        for c, y, p, n in [
            ("billing", 2020, "9.5", "n/a"),
            ("billing", 2021, "n/a", None),
            ("app", 2021, "12", "a"),
            ("stations", 2024, "3", "b"),
        ]
    ]
    facets = catalog(tmp_path, rows).facets()
    assert facets["category"] == {
        "type": "text",
        "values": [["billing", 2], ["app", 1], ["stations", 1]],
        "repeats": True,
    }
    assert facets["year"] == {
        "type": "integer",
        "values": [[2021, 2], [2020, 1], [2024, 1]],
        "repeats": True,
        "min": 2020,
        "max": 2024,
    }
    # a text value left in a numeric column is a value, but not part of the range
    assert facets["price"]["type"] == "number"
    assert (facets["price"]["min"], facets["price"]["max"]) == (3, 12)
    assert ["n/a", 1] in facets["price"]["values"]
    assert facets["note"]["values"] == [["a", 1], ["b", 1], ["n/a", 1]]  # NULL is no value
    assert facets["note"]["repeats"] is False  # a value per row: nothing to group by


def test_many_distinct_values_give_no_list(tmp_path):
    rows = [{"id": f"id{i}", "kind": "same", "n": i} for i in range(60)]
    opened = catalog(tmp_path, rows)
    facets = opened.facets(max_values=50)
    assert facets["id"] == {"type": "text", "values": None, "repeats": False}
    assert facets["kind"]["values"] == [["same", 60]] and facets["kind"]["repeats"]
    assert facets["n"] == {"type": "integer", "values": None, "repeats": False, "min": 0, "max": 59}
    assert len(opened.facets(max_values=60)["id"]["values"]) == 60


def test_hostile_field_names(tmp_path):
    rows = [{name: f"v{i % 2}" for name in HOSTILE} | {"n'\"": i} for i in range(4)]
    opened = catalog(tmp_path, rows)
    facets = opened.facets()
    assert list(facets) == [*HOSTILE, "n'\""]
    for name in HOSTILE:
        assert facets[name]["values"] == [["v0", 2], ["v1", 2]]
    assert (facets["n'\""]["min"], facets["n'\""]["max"]) == (0, 3)
    assert opened.count() == 4  # nothing was dropped
    # the filter the page builds from a facet: name double-quoted, value single-quoted, doubled
    for name in HOSTILE:
        quoted = '"' + name.replace('"', '""') + '"'
        condition = parse_filter(f"{quoted} = 'v1'", list(facets))
        found = opened.db.execute(f"select count(*) from entries where {condition.sql}", condition.params)
        assert found.fetchone()[0] == 2


def test_empty_and_all_null_fields(tmp_path):
    opened = catalog(tmp_path, [{"a": None, "n": ""}, {"a": None, "n": None}])
    facets = opened.facets()
    assert facets["a"]["values"] == []
    assert facets["n"].get("min") is None
    empty = Catalog.create(tmp_path / "empty.db", {})
    assert empty.facets() == {}


def test_long_values_give_no_list(tmp_path):
    """A few long values are prose (a small FAQ's answers), not a list to choose from."""
    rows = [{"answer": f"{i} " + "long answer " * 20, "short": "x" * 100} for i in range(3)]
    facets = catalog(tmp_path, rows).facets()
    assert facets["answer"]["values"] is None
    assert facets["short"]["values"] == [["x" * 100, 3]]


def test_a_field_with_many_values_that_repeat_can_group(tmp_path):
    """Past the listed values, a field whose values recur (a thread of several entries) still
    groups; one with a value per row does not."""
    rows = [{"thread": f"t{i // 3}", "row": f"r{i}"} for i in range(300)]
    facets = catalog(tmp_path, rows).facets(max_values=50)
    assert facets["thread"]["values"] is None and facets["thread"]["repeats"] is True
    assert facets["row"]["values"] is None and facets["row"]["repeats"] is False
