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
its count alone, and its queries are ranked by FTS5 itself. The store is bounded in bytes
(``KEPT``), each phrase's own counted: phrases come from users' queries, and a stream of long
made-up words must cost no more than a stream of common ones.
"""

from __future__ import annotations

import math
import sqlite3
import sys
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

ROWS = 5_000
"""Entries a phrase may match and still have its terms kept."""
KEPT = 16 << 20
"""Bytes the kept postings may hold over all phrases (the least recently used go first): about a
million matches (16 bytes each), or some 38,000 short words no entry holds."""
ENTRY = 100
"""Bytes a kept phrase costs besides its text, its posting and its arrays: its slot and link in
the store's ordered dict (about 70, measured with ``tracemalloc``)."""


K1 = 1.2
"""FTS5's ``bm25()`` k1: a phrase's term is its IDF times ``tf * (K1 + 1) / (tf + K1 * (1 - b + b *
dl / avgdl))``, below its IDF times ``K1 + 1`` whatever the entry."""


def idf(total: int, holding: int) -> float:
    """FTS5's IDF of a phrase ``holding`` of ``total`` entries match: ln((N - n + 0.5) / (n + 0.5)),
    1e-6 where that is not positive (a phrase half the entries or more hold)."""
    value = math.log((total - holding + 0.5) / (holding + 0.5))
    return value if value > 0.0 else 1e-6


def most(total: int, holding: Sequence[int]) -> float:
    """The most BM25 (FTS5's ``bm25()``, negated) an entry can get for the OR of phrases that
    ``holding`` of ``total`` entries match (one count per phrase, as ``bm25()`` sums one term per
    phrase): the sum of each one's IDF times ``K1 + 1``, which no entry reaches. An entry's BM25
    over it is in [0, 1) and in BM25's order."""
    return sum(idf(total, n) * (K1 + 1.0) for n in holding)


@dataclass(frozen=True, slots=True)
class Posting:
    """How many entries match a phrase and, where at most ``ROWS`` do, their row ids (ascending)
    and the phrase's BM25 term for each."""

    count: int
    rows: np.ndarray | None = None
    terms: np.ndarray | None = None


class Postings:
    """The phrases' postings of one catalog connection, for the one generation they were read at."""

    def __init__(self, rows: int = ROWS, kept: int = KEPT) -> None:
        """``kept``: the bytes the postings may hold (``KEPT``)."""
        self.rows, self.kept = rows, kept
        self.generation: int | None = None
        self.entries: int | None = None
        self._found: OrderedDict[str, Posting] = OrderedDict()
        self.held = 0  # the bytes the kept postings hold, as ``_size`` counts them

    def at(self, generation: int) -> Postings:
        """This store for a read at ``generation``: emptied if it was filled at another."""
        if generation != self.generation:
            self.generation, self.entries = generation, None
            self._found.clear()
            self.held = 0
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
            found = Posting(int(db.execute(count, (phrase,)).fetchone()[0]))
        else:
            rows.sort()
            found = Posting(
                len(rows),
                np.array([rowid for rowid, _ in rows], dtype=np.int64),
                np.array([-bm25 for _, bm25 in rows], dtype=np.float64),
            )
        self._found[phrase] = found
        self.held += _size(phrase, found)
        while self.held > self.kept and len(self._found) > 1:
            self.held -= _size(*self._found.popitem(last=False))
        return found

    def __len__(self) -> int:
        """The phrases kept."""
        return len(self._found)


def _size(phrase: str, found: Posting) -> int:
    """The bytes a kept posting holds against ``KEPT``: its phrase (a word no entry holds, or too
    many do, is kept too), the posting, its arrays and its place in the store."""
    arrays = sum(sys.getsizeof(a) for a in (found.rows, found.terms) if a is not None)
    return sys.getsizeof(phrase) + sys.getsizeof(found) + arrays + ENTRY


def ranked(
    postings: Sequence[Posting], k: int, allowed: Sequence[int] | None, weights: Sequence[float]
) -> list[tuple[int, float, float]]:
    """(row id, the summed ``weights`` of the phrases it holds, its BM25) of the k best entries by the BM25
    of the OR of the phrases whose ``postings`` are given (in the phrases' order, each with its
    ``rows``), among ``allowed`` when given: FTS5's ``order by bm25, rowid``, its ``-bm25()``, and
    ``KeywordTable.keyword_search``'s sums. Both sums run from 0.0 in the phrases' order, one
    addition per phrase an entry holds, as FTS5 and ``keyword_search`` add (a phrase it does not
    hold adds exactly 0.0)."""
    parts = [
        (found.rows, found.terms, float(weight)) for found, weight in zip(postings, weights, strict=True)
    ]
    span = 1 + max((int(rows[-1]) for rows, _, _ in parts if len(rows)), default=-1)
    if span <= SPAN * (sum(len(rows) for rows, _, _ in parts) + 128):
        rows, score, held = _by_row_id(parts, span)
    else:
        rows, score, held = _by_position(parts)
    order = np.lexsort((rows, -score))  # BM25 (FTS5's bm25() is minus the score), then row id
    if allowed is not None:
        order = order[np.isin(rows[order], np.asarray(allowed, dtype=np.int64))]
    best = order[:k]
    return list(zip(rows[best].tolist(), held[best].tolist(), score[best].tolist(), strict=True))


SPAN = 8
"""Row ids per matched entry up to which ``ranked`` sums in arrays indexed by row id."""


def _by_row_id(parts: list[tuple[Any, Any, float]], span: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The matched row ids (ascending), their BM25 scores and held weights, summed in arrays of
    ``span`` row ids (each phrase's rows are distinct: one addition per row and phrase)."""
    score, held = np.zeros(span), np.zeros(span)
    for rows, terms, weight in parts:
        score[rows] += terms
        if weight > 0:  # a word of no weight adds nothing
            held[rows] += weight
    rows = np.flatnonzero(score)  # every term is positive
    return rows, score[rows], held[rows]


def _by_position(parts: list[tuple[Any, Any, float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_by_row_id`` for row ids spread too far for arrays indexed by them: summed by each
    matched row's position among them."""
    rows, inverse = np.unique(np.concatenate([part[0] for part in parts]), return_inverse=True)
    score = np.bincount(inverse, weights=np.concatenate([part[1] for part in parts]), minlength=len(rows))
    held = np.zeros(len(rows))
    start = 0
    for found, _, weight in parts:
        if weight > 0:
            held[inverse[start : start + len(found)]] += weight
        start += len(found)
    return rows, score, held
