"""What a search page builds its filters from: each stored field's type, common values, ranges
and whether its values repeat (``GET /fields``). ``Catalog`` takes ``facets`` from ``FieldFacets``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from indexer.catalog.identifiers import quote

if TYPE_CHECKING:
    import sqlite3

MAX_FACET_VALUES = 50  # distinct values up to which a field gets a value list (a select on a page)
MAX_FACET_CHARS = 100  # a longer value is prose (an answer), not something to pick from a list
REPEATS_SAMPLE = 10_000  # entries read to tell whether a field's values repeat (bounded work a field)


class Facet(TypedDict):
    """One stored field as ``Catalog.facets`` describes it (the JSON of ``GET /fields``)."""

    type: str  # integer, number or text
    values: list[list[Any]] | None  # [value, count] pairs, most common first; None: too many or long
    repeats: bool  # a value stands in more than one entry (of a bounded sample): a field to group by
    min: NotRequired[int | float | None]  # numeric fields only: None when no value is a number
    max: NotRequired[int | float | None]


class FieldFacets:
    """``facets`` on a catalog's connection (``db``) and its typed fields."""

    db: sqlite3.Connection

    def field_types(self) -> dict[str, str]:
        """The user fields and their types (``Catalog.field_types``)."""
        raise NotImplementedError

    def facets(self, max_values: int = MAX_FACET_VALUES) -> dict[str, Facet]:
        """Each user field: its ``type``; ``values`` (``[value, count]`` pairs, most common first)
        when it holds at most ``max_values`` distinct non-NULL values, none longer than
        ``MAX_FACET_CHARS``, else None; ``repeats``, whether a value stands in more than one of its
        first ``REPEATS_SAMPLE`` entries (a field to group by); and for numeric fields
        ``min``/``max`` of the numbers in it. What a search page builds its filters from.

        Bounded work: the distinct values are read through ``LIMIT max_values + 1``, so a field
        with many values costs one partial scan and is never grouped or counted."""
        facets = {}
        for name, field_type in self.field_types().items():
            column = quote(name)
            distinct = self.db.execute(
                f"select count(*) from (select distinct {column} from entries"
                f" where {column} is not null limit ?)",
                (max_values + 1,),
            ).fetchone()[0]
            values = None
            if distinct <= max_values:
                values = [
                    list(row)
                    for row in self.db.execute(
                        f"select {column}, count(*) from entries where {column} is not null"
                        f" group by {column} order by count(*) desc, {column}"
                    )
                ]
                if any(len(str(value)) > MAX_FACET_CHARS for value, _ in values):
                    values = None
            rows, different = self.db.execute(
                f"select count(*), count(distinct {column}) from (select {column} from entries"
                f" where {column} is not null limit ?)",
                (REPEATS_SAMPLE,),
            ).fetchone()
            facet = Facet(type=field_type, values=values, repeats=different < rows)
            if field_type != "text":
                low, high = self.db.execute(
                    f"select min({column}), max({column}) from entries"
                    f" where typeof({column}) in ('integer', 'real')"
                ).fetchone()
                facet.update(min=low, max=high)
            facets[name] = facet
        return facets
