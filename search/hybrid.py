"""Keyword search beside the vectors, and the fusion of the two rankings, on one scale.

The catalog keeps an FTS5 table of the entries' texts (``indexer.catalog``: BM25 in SQLite). A
sentence model splits a code such as ``E3453C`` into word pieces and ranks its near-misses
(``E3453D``) about as high; a keyword match does not.

Every mode scores on a scale that means the same for every query and every index (docs/hybrid.md):

- dense: the cosine of the query and the entry (with ``--also``, the index's mix of its fields');
- keyword: the entry's keyword evidence, its BM25 over the BM25 an entry of average length
  holding each of the query's words once would get (``best_bm25``: the sum of the words' IDFs),
  capped at 1: about the share of the query's words, weighted by their rarity, the entry holds.
  0 for no word, 1 for all of them; ranked as BM25 ranks;
- hybrid: ``(1 - w) * cosine + w * evidence`` over the ``POOL`` best of each ranking (an entry
  only the keywords found gets its exact cosine). Nothing is normalised per query, so an
  off-topic query scores about as low as its cosine and an exact match high, and one threshold
  (``--min-score``, the no-answer rule) means the same for every query.

``w`` is ``DEFAULT_WEIGHT`` unless the index stores its own; a query holding an identifier
(letters and digits in one word) gives the keywords ``IDENTIFIER_WEIGHT``: on a FAQ of error codes
one character apart the exact code then comes first where dense puts a near-miss there
(``tests/test_hybrid.py``).

The user's words are never FTS5 syntax: each whitespace-separated token is quoted as an FTS5
string and the tokens are OR-ed, so quotes, ``*``, ``NEAR``, ``AND``, brackets and colons are
plain words, and a query with no word in it matches nothing (an empty keyword ranking).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from indexer.errors import BadInput

if TYPE_CHECKING:
    from indexer.catalog import Catalog

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


def query_terms(query: str) -> list[str]:
    """The user's words as keyword search matches them: control characters and lone surrogates
    separate words (FTS5 ends a string at a NUL, and SQLite cannot take a surrogate), a word
    repeated (whatever its case or the punctuation around it) is one term, a token with no letter
    or digit is none, and the first ``MAX_TERMS`` terms are taken."""
    words: dict[tuple[str, ...], str] = {}  # a word's letters and digits, lower-cased -> its first spelling
    for token in _SEPARATOR.sub(" ", query).split():
        if _WORD.search(token):
            words.setdefault(tuple(_LETTERS.findall(token.lower())), token)
    return list(words.values())[:MAX_TERMS]


def _phrase(term: str) -> str:
    """``term`` as an FTS5 string: quoted, never syntax."""
    return '"' + term.replace('"', '""') + '"'


def match_expression(query: str) -> str | None:
    """The FTS5 query of ``query_terms``, each quoted as a string and OR-ed; None when there is
    no term (nothing to match)."""
    terms = query_terms(query)
    return " OR ".join(map(_phrase, terms)) if terms else None


def best_bm25(total: int, matching: Sequence[int]) -> float:
    """The BM25 of an entry of average length holding each word once, among ``total`` entries of
    which ``matching`` hold each word: the sum of the words' IDFs as FTS5 computes them
    (log((N - n + 0.5) / (n + 0.5)), at least 1e-6), a word no entry holds counting fully."""
    return sum(max(math.log((total - n + 0.5) / (n + 0.5)), 1e-6) for n in matching)


def keyword_scores(catalog: Catalog, words: Words, k: int, allowed: Sequence[int] | None = None) -> Ranking:
    """Row id -> keyword evidence in [0, 1] of the k best keyword matches (BM25 order, among
    ``allowed`` row ids when given): BM25 over ``best_bm25`` of the query's words, capped at 1."""
    if words.match is None:
        return {}
    found = catalog.keyword_search(words.match, k, allowed)
    if not found:
        return {}
    best = best_bm25(*catalog.keyword_frequencies(words.phrases))
    return {rowid: min(1.0, score / best) if best > 0 else 0.0 for rowid, score in found}


def fuse(dense: Ranking, keyword: Ranking, weight: float = DEFAULT_WEIGHT) -> Ranking:
    """``(1 - weight) * cosine + weight * evidence`` of each entry, best first; ``dense`` holds the
    cosine of every entry of either ranking, an entry missing from ``keyword`` has evidence 0.
    Ties keep dense order."""
    fused = {rowid: (1 - weight) * score + weight * keyword.get(rowid, 0.0) for rowid, score in dense.items()}
    return dict(sorted(fused.items(), key=lambda item: -item[1]))


def ranked(
    mode: str,
    k: int,
    dense: Callable[[int], Ranking],
    keyword: Callable[[int], Ranking],
    cosines: Callable[[list[int]], Ranking],
    weight: float,
) -> Ranking:
    """The k best entries in ``mode``, given each ranking as a function of how many to fetch and
    the exact cosines of given row ids (for the entries only the keywords found)."""
    if mode == "dense":
        return dense(k)
    if mode == "keyword":
        return keyword(k)
    pool = max(k, POOL)
    near, words = dense(pool), keyword(pool)
    missing = [rowid for rowid in words if rowid not in near]
    if missing:
        near = {**near, **cosines(missing)}
    return dict(list(fuse(near, words, weight).items())[:k])


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
    def phrases(self) -> list[str]:
        """Each term of the query's match as the FTS5 string it is matched with (what its IDF is
        counted with, ``best_bm25``): the same terms, so the best possible score is the one of
        the expression that runs."""
        return [_phrase(term) for term in query_terms(self.text)]

    @property
    def share(self) -> float:
        """The keyword share of this query's fusion: ``IDENTIFIER_WEIGHT`` when it holds an
        identifier and that is more than the index's weight."""
        return max(self.weight, IDENTIFIER_WEIGHT) if _IDENTIFIER.search(self.text) else self.weight
