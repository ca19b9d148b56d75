"""Keyword search beside the vectors, and the fusion of the two rankings.

The catalog keeps an FTS5 table of the entries' texts (``indexer.catalog``: BM25 in SQLite). A
sentence model splits a code such as ``E3453C`` into word pieces and ranks its near-misses
(``E3453D``) about as high; a keyword match does not. ``hybrid`` fuses the two: each ranking's
scores are min-max normalised over the entries it returned (``POOL``), and an entry's score is
``(1 - w) * dense + w * keyword`` (a ranking it is missing from gives it 0). On StackFAQ dev this
convex combination at w = 0.15 beat reciprocal rank fusion at every weight, and dense alone
(docs/hybrid.md, ``bench/hybrid.py``). A query holding an identifier (letters and digits in one
word) gives the keywords ``IDENTIFIER_WEIGHT``: on a FAQ of error codes one character apart the
exact code then comes first where dense puts a near-miss there (``tests/test_hybrid.py``).

The user's words are never FTS5 syntax: each whitespace-separated token is quoted as an FTS5
string and the tokens are OR-ed, so quotes, ``*``, ``NEAR``, ``AND``, brackets and colons are
plain words, and a query with no word in it matches nothing (an empty keyword ranking).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from indexer.errors import BadInput

MODES = ("dense", "keyword", "hybrid")
DEFAULT_MODE = "hybrid"
"""The mode that won on StackFAQ dev (docs/hybrid.md)."""
DEFAULT_WEIGHT = 0.15
"""The keyword ranking's share in a hybrid score unless the index stores one (``WEIGHT_KEY``)."""
WEIGHT_KEY = "hybrid_weight"
"""The meta key of an index's own keyword share (``store_hybrid_weight``)."""
WEIGHTS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.5)
"""The keyword shares a sweep measures on the user's labels (``search.sweep``)."""
IDENTIFIER_WEIGHT = 0.5
"""The keyword share for a query holding an identifier (a word of letters and digits: an error
code, a SKU, a version), where the exact word decides and a sentence model sees near-misses."""
POOL = 100
"""Entries taken from each ranking before fusing (at least k)."""

MAX_TERMS = 32
"""Distinct words a query's keyword side ORs at most. FTS5's cost on a long entry grows with the
square of the terms (a word repeated 100 times: 0.8 s on one 200,000-word entry, 30 times: 0.09 s;
``bench/keyword_terms.py``), and the server takes 2,000-character queries."""

_WORD = re.compile(r"\w")
_LETTERS = re.compile(r"[^\W_]+")
_SEPARATOR = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")
_IDENTIFIER = re.compile(r"\b(?=\w*\d)(?=\w*[^\W\d])\w+\b")

Ranking = dict[int, float]
"""Row id -> score, best first."""


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise BadInput(f"mode: {mode!r} is not one of {', '.join(MODES)}")
    return mode


def check_weight(weight: float) -> float:
    if not 0 <= weight <= 1:
        raise BadInput(f"hybrid weight must be in [0, 1], not {weight}")
    return abs(float(weight))  # -0 is 0: stored and shown as 0


def stored_weight(meta: Mapping[str, Any]) -> float:
    """The keyword share an index's meta stores, else ``DEFAULT_WEIGHT``; a value that is not a
    number in [0, 1] (a hand-edited meta) is one line, not a ranking nobody asked for."""
    value = meta.get(WEIGHT_KEY, DEFAULT_WEIGHT)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadInput(f"the index's {WEIGHT_KEY} {value!r} is not a number: store one with --hybrid-weight")
    return check_weight(value)


def store_hybrid_weight(index_dir: str | Path, weight: float, wait: float = 0) -> float:
    """Store ``weight`` as the index's keyword share (a new version, under the writer lock like
    any write), checked first so a bad one writes nothing."""
    from indexer.store import Change, apply_change, writer_lock

    weight = check_weight(weight)
    with writer_lock(Path(index_dir), wait):
        apply_change(index_dir, Change(meta={WEIGHT_KEY: weight}))
    return weight


def match_expression(query: str) -> str | None:
    """The FTS5 query of the user's words, each quoted as a string (never syntax) and OR-ed; None
    when no token holds a letter or digit (nothing to match). Control characters and lone
    surrogates separate words: FTS5 ends a string at a NUL, and SQLite cannot take a surrogate.
    A word repeated (whatever its case or the punctuation around it) is one term, and the first
    ``MAX_TERMS`` terms are taken."""
    words: dict[tuple[str, ...], str] = {}  # a word's letters and digits, lower-cased -> its first spelling
    for token in _SEPARATOR.sub(" ", query).split():
        if _WORD.search(token):
            words.setdefault(tuple(_LETTERS.findall(token.lower())), token)
    tokens = list(words.values())[:MAX_TERMS]
    if not tokens:
        return None
    return " OR ".join('"' + token.replace('"', '""') + '"' for token in tokens)


def normalised(ranking: Ranking) -> Ranking:
    """Scores mapped onto [0, 1] by the ranking's own min and max (all 1 when they are equal)."""
    if not ranking:
        return {}
    low, high = min(ranking.values()), max(ranking.values())
    return {rowid: (score - low) / (high - low) if high > low else 1.0 for rowid, score in ranking.items()}


def fuse(dense: Ranking, keyword: Ranking, weight: float = DEFAULT_WEIGHT) -> Ranking:
    """The convex combination of the two rankings' normalised scores (``weight``: the keyword
    share), best first; ties keep dense order, then keyword order."""
    fused = {rowid: (1 - weight) * score for rowid, score in normalised(dense).items()}
    for rowid, score in normalised(keyword).items():
        fused[rowid] = fused.get(rowid, 0.0) + weight * score
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

    @property
    def share(self) -> float:
        """The keyword share of this query's fusion: ``IDENTIFIER_WEIGHT`` when it holds an
        identifier and that is more than the index's weight."""
        return max(self.weight, IDENTIFIER_WEIGHT) if _IDENTIFIER.search(self.text) else self.weight
