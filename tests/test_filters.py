"""Metadata filters as a hostile user writes them: bounded size and depth, clear messages on how
to quote, and every accepted filter runnable by SQLite (no "Expression tree is too large")."""

from __future__ import annotations

import sqlite3

import pytest

from indexer.errors import BadInput, FilterError
from search.read.filters import MAX_DEPTH, MAX_FILTER_LENGTH, MAX_TERMS, MAX_VALUES, parse_filter

FIELDS = ["category", "year", "catégorie", "my field"]


def run_on_sqlite(where: str) -> list[int]:
    """Parse ``where`` and run it on a small real SQLite table: the SQL must be accepted."""
    condition = parse_filter(where, FIELDS)
    db = sqlite3.connect(":memory:")
    db.execute('create table t (id integer, category text, year integer, "catégorie" text, "my field" text)')
    db.executemany(
        "insert into t values (?, ?, ?, ?, ?)",
        [(1, "a", 2019, "x", "p"), (2, "b", 2020, "y", "q"), (3, "a", 2021, "x", "r")],
    )
    return [r[0] for r in db.execute(f"select id from t where {condition.sql} order by id", condition.params)]


def test_filter_errors_are_bad_input():
    with pytest.raises(FilterError) as caught:
        parse_filter("nope = 1", FIELDS)
    assert isinstance(caught.value, BadInput)


@pytest.mark.parametrize(
    ("where", "said"), [(5, "a condition is text, not int"), (["a"], "a condition is text, not list")]
)
def test_a_filter_that_is_not_text_says_so(where, said):
    # before: "filter: empty condition", for a condition that was there but not a string
    with pytest.raises(FilterError, match=f"filter: {said}"):
        parse_filter(where, FIELDS)


@pytest.mark.parametrize(
    "where",
    [
        "(" * 490 + "year = 1" + ")" * 490,  # RecursionError before
        "NOT " * 248 + "year = 1",  # SQLite: Expression tree is too large
        " OR ".join(["year = 1"] * 1001),  # SQLite: Expression tree is too large
        " AND ".join(["year = 1"] * (MAX_TERMS + 1)),
        "year IN (" + ", ".join(["1"] * (MAX_VALUES + 1)) + ")",
        "category = '" + "x" * MAX_FILTER_LENGTH + "'",
    ],
    ids=["nested-parens", "nots", "ors", "ands", "in-values", "length"],
)
def test_oversized_filters_are_refused_with_a_filter_error(where):
    with pytest.raises(FilterError, match="filter: "):
        parse_filter(where, FIELDS)


def test_filters_at_the_bounds_run_on_sqlite():
    """The bounds are low enough that SQLite takes everything the parser accepts."""
    nested = "(" * (MAX_DEPTH - 1) + "year = 2020" + ")" * (MAX_DEPTH - 1)
    assert run_on_sqlite(nested) == [2]
    nots = "NOT " * (MAX_DEPTH - 2) + "year = 2020"  # an even number of NOTs
    assert run_on_sqlite(nots) == ([2] if (MAX_DEPTH - 2) % 2 == 0 else [1, 3])
    ors = " OR ".join([f"year = {y}" for y in range(MAX_TERMS - 1)] + ["year = 2021"])
    assert run_on_sqlite(ors) == [3]
    values = "year IN (" + ", ".join(str(v) for v in range(2000, 2000 + MAX_VALUES)) + ")"
    assert run_on_sqlite(values) == [1, 2, 3]


def test_unicode_field_names_work_without_quotes():
    assert run_on_sqlite("catégorie = 'x'") == [1, 3]
    assert run_on_sqlite("\"my field\" = 'q'") == [2]


def test_a_value_in_double_quotes_says_how_to_quote():
    with pytest.raises(FilterError, match="single quotes") as caught:
        parse_filter('category = "a"', FIELDS)
    assert "'a'" in str(caught.value)


def test_an_unreadable_field_name_says_how_to_quote():
    with pytest.raises(FilterError, match="double quotes"):
        parse_filter("my field = 'q'", FIELDS)
    with pytest.raises(FilterError, match="double quotes"):
        parse_filter("price-eur < 3", [*FIELDS, "price-eur"])


def test_numeric_comparisons_skip_text_in_a_mixed_column():
    """SQLite orders text after every number: without a guard, 'n/a' would pass ``price > 10``."""
    db = sqlite3.connect(":memory:")
    db.execute("create table t (id integer, price numeric)")
    db.executemany("insert into t values (?, ?)", [(1, 5), (2, 15), (3, "n/a"), (4, 9.5), (5, None)])

    def ids(where: str) -> list[int]:
        condition = parse_filter(where, ["price"])
        return [
            r[0] for r in db.execute(f"select id from t where {condition.sql} order by id", condition.params)
        ]

    assert ids("price > 10") == [2]
    assert ids("price <= 10") == [1, 4]
    assert ids("NOT price > 10") == [1, 4]
    assert ids("price = 'n/a'") == [3]
    assert ids("price > 'm'") == [3]  # a text value compares as text


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("year < 9223372036854775808", [1, 2, 3]),  # 2^63: past SQLite's integers (OverflowError)
        ("year > -9223372036854775809", [1, 2, 3]),
        ("year < -99999999999999999999999", []),
        ("year IN (2020, 18446744073709551616)", [2]),
        ("year < " + "9" * 5000, [1, 2, 3]),  # past Python's int-from-text digit limit (ValueError)
        ("year <= 9223372036854775807", [1, 2, 3]),  # the largest integer SQLite stores, kept exact
    ],
)
def test_numbers_past_sqlite_integers_compare_as_numbers(where, expected):
    """SQLite reads an integer literal past 64 bits as a real: the filter does the same, so a huge
    number is an ordinary comparison, not an OverflowError on the bound parameter."""
    assert run_on_sqlite(where) == expected


def test_field_names_match_whatever_their_case_and_a_miss_names_the_nearest():
    assert run_on_sqlite("Category = 'a'") == run_on_sqlite("category = 'a'") == [1, 3]
    assert run_on_sqlite("YEAR >= 2020 and CATÉGORIE = 'y'") == [2]
    with pytest.raises(FilterError, match="unknown field 'categry'.*did you mean 'category'"):
        parse_filter("categry = 'a'", FIELDS)
