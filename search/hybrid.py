"""Keyword search beside the vectors, and the fusion of the two rankings.

The catalog keeps an FTS5 table of the entries' texts (``indexer.catalog``: BM25 in SQLite). A
sentence model splits a code such as ``E3453C`` into word pieces and ranks its near-misses
(``E3453D``) about as high; a keyword match does not. ``hybrid`` fuses the two rankings by
reciprocal rank fusion, weighted: an entry's score is ``(1 - w) / (RRF_K + dense rank) + w /
(RRF_K + keyword rank)`` (a ranking it is missing from adds nothing). Rank fusion beat a convex
combination of min-max normalised scores on StackFAQ dev (docs/hybrid.md, ``bench/hybrid.py``).

The user's words are never FTS5 syntax: each whitespace-separated token is quoted as an FTS5
string and the tokens are OR-ed, so quotes, ``*``, ``NEAR``, ``AND``, brackets and colons are
plain words, and a query with no word in it matches nothing (an empty keyword ranking).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from indexer.errors import BadInput

MODES = ("dense", "keyword", "hybrid")
DEFAULT_MODE = "hybrid"
"""The mode that won on StackFAQ dev (docs/hybrid.md)."""
DEFAULT_WEIGHT = 0.5
"""The keyword ranking's share in a hybrid score unless the index stores one (``sweep``)."""
RRF_K = 60
"""Reciprocal rank fusion's constant (Cormack et al. 2009): damps the head of each ranking."""
POOL = 100
"""Entries taken from each ranking before fusing (at least k)."""

_WORD = re.compile(r"\w")

Ranking = dict[int, float]
"""Row id -> score, best first."""


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise BadInput(f"mode: {mode!r} is not one of {', '.join(MODES)}")
    return mode


def check_weight(weight: float) -> float:
    if not 0 <= weight <= 1:
        raise BadInput(f"hybrid weight must be in [0, 1], not {weight}")
    return float(weight)


def match_expression(query: str) -> str | None:
    """The FTS5 query of the user's words, each quoted as a string (never syntax) and OR-ed; None
    when no token holds a letter or digit (nothing to match)."""
    tokens = [token for token in query.split() if _WORD.search(token)]
    if not tokens:
        return None
    return " OR ".join('"' + token.replace('"', '""') + '"' for token in tokens)


def fuse(dense: Ranking, keyword: Ranking, weight: float = DEFAULT_WEIGHT) -> Ranking:
    """The two rankings fused by weighted reciprocal rank (``weight``: the keyword share)."""
    fused: dict[int, float] = {}
    for share, ranking in ((1 - weight, dense), (weight, keyword)):
        for rank, rowid in enumerate(ranking, 1):
            fused[rowid] = fused.get(rowid, 0.0) + share / (RRF_K + rank)
    return dict(sorted(fused.items(), key=lambda item: -item[1]))


def ranked(
    mode: str, k: int, dense: Callable[[int], Ranking], keyword: Callable[[int], Ranking], weight: float
) -> Ranking:
    """The k best entries in ``mode``, given each ranking as a function of how many to fetch."""
    if mode == "dense":
        return dense(k)
    if mode == "keyword":
        return keyword(k)
    pool = max(k, POOL)
    return dict(list(fuse(dense(pool), keyword(pool), weight).items())[:k])


@dataclass(frozen=True)
class Words:
    """One query's keyword side: its text, the mode it runs in and the keyword share of a fusion."""

    text: str
    mode: str
    weight: float = DEFAULT_WEIGHT

    @property
    def match(self) -> str | None:
        return match_expression(self.text)
