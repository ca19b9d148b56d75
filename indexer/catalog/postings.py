"""The keyword table's rankings summed from each phrase's matches, kept between queries.

FTS5's ``bm25()`` of an entry for an OR of phrases is the sum, in the phrases' order, of one term
per phrase the entry holds (the phrase's IDF times its saturated frequency in the entry; a phrase
it does not hold adds exactly 0.0), and each term is what ``bm25()`` gives the entry for that
phrase alone. So a phrase's matches and their terms, read once per generation of the catalog,
give every later query holding that phrase FTS5's own numbers, bit for bit, and its own order
(BM25, then row id), without FTS5 scoring every entry that holds a common word again
(``tests/test_keyword_share.py`` compares the two on random queries).

Kept only inside a read transaction checked at a generation (``Catalog.reading_at``): an update
that commits a new generation empties the store. A phrase more than ``ROWS`` entries hold keeps
its count alone, and its queries are ranked by FTS5 itself.
"""

from __future__ import annotations

import sqlite3
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

ROWS = 5_000
"""Entries a phrase may match and still have its terms kept."""
KEPT = 100_000
"""Terms kept over all phrases (the least recently used phrases go first)."""


@dataclass(frozen=True)
class Posting:
    """How many entries match a phrase, and (where at most ``ROWS`` do) row id -> its BM25 term."""

    count: int
    terms: dict[int, float] | None


class Postings:
    """The phrases' postings of one catalog connection, for the one generation they were read at."""

    def __init__(self, rows: int = ROWS, kept: int = KEPT) -> None:
        self.rows, self.kept = rows, kept
        self.generation: int | None = None
        self.entries: int | None = None
        self._found: OrderedDict[str, Posting] = OrderedDict()
        self._held = 0

    def at(self, generation: int) -> Postings:
        """This store for a read at ``generation``: emptied if it was filled at another."""
        if generation != self.generation:
            self.generation, self.entries = generation, None
            self._found.clear()
            self._held = 0
        return self

    def total(self, db: sqlite3.Connection) -> int:
        """The entries the catalog holds."""
        if self.entries is None:
            self.entries = int(db.execute("select count(*) from entries").fetchone()[0])
        return self.entries

    def posting(self, db: sqlite3.Connection, phrase: str) -> Posting:
        """``phrase``'s posting, read from the keyword table the first time it is asked for."""
        found = self._found.get(phrase)
        if found is not None:
            self._found.move_to_end(phrase)
            return found
        scored = "select rowid, bm25(keywords) from keywords where keywords match ? limit ?"
        rows = db.execute(scored, (phrase, self.rows + 1)).fetchall()
        if len(rows) > self.rows:
            count = "select count(*) from keywords where keywords match ?"
            found = Posting(int(db.execute(count, (phrase,)).fetchone()[0]), None)
        else:
            found = Posting(len(rows), {rowid: -bm25 for rowid, bm25 in rows})
        self._found[phrase] = found
        self._held += found.count if found.terms is not None else 0
        while self._held > self.kept and len(self._found) > 1:
            _, dropped = self._found.popitem(last=False)
            self._held -= dropped.count if dropped.terms is not None else 0
        return found


def ranked(terms: Sequence[dict[int, float]], k: int, allowed: Sequence[int] | None = None) -> list[int]:
    """The row ids of the k best entries by the BM25 of the OR of the phrases whose ``terms`` are
    given (in the phrases' order), among ``allowed`` when given: FTS5's ``order by bm25, rowid``.
    Each entry's score is summed as FTS5 sums it, from 0.0 in the phrases' order (a term is
    positive, so an entry's first is its sum so far)."""
    score = dict(terms[0]) if terms else {}
    for phrase in terms[1:]:
        get = score.get
        for rowid, term in phrase.items():
            score[rowid] = get(rowid, 0.0) + term
    if allowed is not None:
        within = set(allowed)
        score = {rowid: value for rowid, value in score.items() if rowid in within}
    order = sorted(score)  # row id order, kept among equal scores by the stable sort below
    order.sort(key=score.__getitem__, reverse=True)
    return order[:k]
