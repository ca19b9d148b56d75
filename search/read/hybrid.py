"""Keyword search beside the vectors, and the fusion of the two rankings, on one scale.

The catalog keeps an FTS5 table of the entries' texts (``indexer.catalog``: BM25 in SQLite). A
sentence model splits a code such as ``E3453C`` into word pieces and ranks its near-misses
(``E3453D``) about as high; a keyword match does not.

Every mode scores on a scale that means the same for every query and every index (docs/hybrid.md):

- dense: the cosine of the query and the entry (with ``--also``, the index's mix of its fields');
- keyword: ranked by BM25 (which weighs how rare the words are, and how often and in how short an
  entry they appear: the better ranker, ``docs/hybrid.md``), scored by the entry's BM25 over the
  most BM25 the query's words could give (``indexer.catalog.postings.most``: each word's IDF times
  k1 + 1, FTS5's), in [0, 1): the share of the most keyword evidence the words could give, so the
  hits stand in the order of their scores. 0 for every entry where no word of the query weighs
  anything (``weightless``);
- the share (hybrid's keyword evidence, and what a no-answer rule reads as ``keyword``): of the
  query's words the entry holds, each word weighted by its rarity (``word_weight``: BM25's IDF
  above a common word's, floored at 0, so a word a quarter of the entries or more hold weighs
  nothing): the weights of the words it holds over the weights of all of them, in [0, 1];
- hybrid: ``(1 - w) * cosine + w * share`` over the ``POOL`` best of each ranking (an entry
  only the keywords found gets its exact cosine), ``w`` the index's one weight for every
  query. Nothing is normalised per query, so an off-topic query scores about as low as its
  cosine and an exact match high, and one threshold (``--min-score``, the no-answer rule) means
  the same for every query.

``w`` is ``DEFAULT_WEIGHT`` unless the index stores its own, whatever the query. A query holding a
code (a word of letters and digits: an error code, a SKU, a version) changes the order, not the
scale: hybrid ranks the entries holding more of its codes first, each by its score, so on a FAQ
of error codes one character apart the exact code comes first where dense puts a near-miss
there (``tests/test_hybrid.py``).

The user's words are never FTS5 syntax: each whitespace-separated token is quoted as an FTS5
string and the tokens are OR-ed, so quotes, ``*``, ``NEAR``, ``AND``, brackets and colons are
plain words, and a query with no word in it matches nothing (an empty keyword ranking).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from indexer.errors import BadInput

if TYPE_CHECKING:
    from indexer.catalog import Catalog

DENSE, KEYWORD, HYBRID = "dense", "keyword", "hybrid"
MODES = (DENSE, KEYWORD, HYBRID)
"""The search modes, each named once here."""
DEFAULT_MODE = HYBRID
"""The mode that won on StackFAQ dev (docs/hybrid.md)."""
DEFAULT_WEIGHT = 0.15
"""The keyword ranking's share in a hybrid score unless the index stores one (``WEIGHT_KEY``)."""
WEIGHT_KEY = "hybrid_weight"
"""The meta key of an index's own keyword share (``search.studies.calibration.store_hybrid_weight``)."""
WEIGHTS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.5)
"""The keyword shares a sweep measures on the user's labels (``search.studies.sweep``)."""
POOL = 100
"""Entries taken from each ranking before fusing (at least k)."""
RERANK_DEPTH = 50
"""The first stage's best entries a reranker re-orders unless a request says (at least k:
``search.read.requests.SearchRequest``). A cross-encoder reads each pair whole, so a query's cost
grows with the depth (50 pairs: about one batch's tokens on the CPU); deeper only pays where the
first stage leaves right answers past its 50 best."""
MAX_RERANK_DEPTH = 1000
"""The most candidates one query may have reranked: a bound on the model work one search causes."""

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


COMMON_SHARE = 0.25
"""A word held by this share of the entries or more weighs nothing in a question: it tells an
entry from too few of the others ("how", "do", "it" in a FAQ), so a question of only such words
is no keyword evidence, however many of them an entry holds."""


def _idf(total: int, holding: float) -> float:
    """BM25's IDF as Lucene writes it, positive for every word: ln(1 + (N - n + 0.5) / (n + 0.5))."""
    return math.log(1 + (total - holding + 0.5) / (holding + 0.5))


@functools.lru_cache(maxsize=4096)  # a few words' counts recur in every query of an index
def word_weight(total: int, holding: int) -> float:
    """A word's weight in a question, among ``total`` entries of which ``holding`` hold it: BM25's
    IDF (``_idf``) above that of a word ``COMMON_SHARE`` of the entries hold, floored at 0. A word
    a quarter of the entries or more hold weighs nothing; a rarer word weighs more, smoothly, and
    a word no entry holds most (it is part of the question no entry holds). In an index of a few
    entries, where a quarter is under two, the reference is one and a half entries (at most all
    of them): a word one entry of two or more holds counts."""
    common = min(max(COMMON_SHARE * total, 1.5), total)
    return max(_idf(total, holding) - _idf(total, common), 0.0)


def word_weights(catalog: Catalog, words: Words) -> list[float]:
    """The weight (``word_weight``) of each of the query's terms (``Words.phrases``) in ``catalog``."""
    total, holding = catalog.keyword_frequencies(words.phrases)
    return [word_weight(total, n) for n in holding]


WEIGHTLESS = (
    "no keyword evidence: every word of this question is in a quarter of the entries or more, so each "
    "weighs 0 and every keyword score is 0 (the hits stand in BM25's order)"
)
"""What a keyword search says where the query has words but none weighs anything."""


def weightless(catalog: Catalog, words: Words) -> bool:
    """Whether the query has words to match but none weighs anything: every share is 0."""
    return words.match is not None and not any(word_weights(catalog, words))


def keyword_matches(
    catalog: Catalog, words: Words, k: int, allowed: Sequence[int] | None = None
) -> tuple[Ranking, Ranking]:
    """The k best keyword matches (BM25 order, then file order; among ``allowed`` row ids when
    given): row id -> keyword share (the weights, ``word_weight``, of the query's words an entry
    holds over the weights of all of them, in [0, 1]: hybrid's keyword evidence), and row id ->
    keyword score (its BM25 over the most the query's words could give, ``most``, in [0, 1): what
    keyword mode shows, in the same order). Both 0 for every entry when no word of the query
    weighs anything (``weightless``)."""
    from indexer.catalog.postings import most  # it imports NumPy, which the CLI never loads to start

    if words.match is None:
        return {}, {}
    total, holding = catalog.keyword_frequencies(words.phrases)
    weights = [word_weight(total, n) for n in holding]
    whole, bound = sum(weights), most(total, holding)
    found = catalog.keyword_ranking(words.phrases, k, allowed, weights)
    if whole <= 0:  # no keyword evidence: every entry scores 0, in BM25's order
        nothing = {rowid: 0.0 for rowid, _, _ in found}
        return nothing, dict(nothing)
    shares = {rowid: held / whole for rowid, held, _ in found}
    return shares, {rowid: bm25 / bound for rowid, _, bm25 in found}


def keyword_scores(catalog: Catalog, words: Words, k: int, allowed: Sequence[int] | None = None) -> Ranking:
    """Row id -> keyword share of the k best keyword matches (``keyword_matches``)."""
    return keyword_matches(catalog, words, k, allowed)[0]


def code_counts(catalog: Catalog, words: Words, rowids: Sequence[int]) -> dict[int, int]:
    """Row id -> how many of the query's codes (``Words.codes``) each of ``rowids`` holds, for
    those holding any."""
    codes = words.codes
    if not codes or not rowids:
        return {}
    found = catalog.keyword_ranking(codes, len(rowids), rowids, [1.0] * len(codes))
    return {rowid: round(held) for rowid, held, _ in found}


def _fused_scores(dense: Ranking, keyword: Ranking, weight: float) -> dict[int, float]:
    """``(1 - weight) * cosine + weight * share`` of each entry of ``dense``."""
    return {rowid: (1 - weight) * score + weight * keyword.get(rowid, 0.0) for rowid, score in dense.items()}


def _best_first(scores: dict[int, float]) -> list[int]:
    """The row ids of ``scores``, best first, equal scores in row id (file) order."""
    order = sorted(scores)  # row id order, kept among equal scores by the stable sort below
    order.sort(key=scores.__getitem__, reverse=True)
    return order


def depth(k: int) -> int:
    """How many entries each ranking is fetched for the k best hybrid ones: ``POOL``, at least k."""
    return max(k, POOL)


def missing(dense: Ranking, keyword: Ranking) -> list[int]:
    """The entries only the keyword ranking found: their exact cosines complete ``dense`` before
    ``fused`` (every entry of either ranking is scored on both)."""
    return [rowid for rowid in keyword if rowid not in dense]


def reachable(
    dense: Ranking, keyword: Ranking, candidates: list[int], weight: float, k: int, fetched: int
) -> list[int]:
    """The ``candidates`` (entries only the keyword ranking found) that can still be among the k
    best fused ones. ``dense`` is the exact ``fetched`` nearest: an entry it left out has a cosine
    below its last, so one whose share cannot lift that to the k-th fused score of the entries
    already scored is left unscored (its exact cosine would not change the k best). Where the
    dense ranking holds fewer than ``fetched`` entries, every candidate is kept."""
    if not candidates or len(dense) < max(fetched, k):
        return candidates
    floor = min(dense.values())
    known = [(1 - weight) * score + weight * keyword.get(rowid, 0.0) for rowid, score in dense.items()]
    known.sort()
    kth = known[-k]
    return [rowid for rowid in candidates if (1 - weight) * floor + weight * keyword[rowid] >= kth]


def fused(
    dense: Ranking, keyword: Ranking, weight: float, k: int, codes: Mapping[int, int] | None = None
) -> Ranking:
    """The k best hybrid entries from the two rankings, each fetched ``depth(k)`` deep:
    ``dense`` holds the cosine of every entry of either (completed with ``missing``), each scored
    ``(1 - weight) * cosine + weight * share`` (share 0 where ``keyword`` lacks it), ties in row
    id (file) order. ``codes`` (where the query holds a code): how many of the query's codes each
    entry holds; an entry holding more of them ranks first, each by its fused score."""
    scores = _fused_scores(dense, keyword, weight)
    order = _best_first(scores)
    if codes:  # a stable sort: by score within each count
        order.sort(key=lambda rowid: -codes.get(rowid, 0))
    return {rowid: scores[rowid] for rowid in order[:k]}


def hybrid_ranking(
    near: Ranking,
    keyword: Ranking,
    words: Words,
    k: int,
    cosines: Callable[[list[int]], Ranking],
    codes: Callable[[list[int]], Mapping[int, int]],
    *,
    exact: bool = False,
    weight: float | None = None,
) -> Ranking:
    """The hybrid ranker: the k best entries from the dense ranking ``near`` and the keyword
    ranking ``keyword`` (shares), each fetched ``depth(k)`` deep. The entries only the keywords
    found get their exact cosine (``cosines`` of their row ids), those that cannot reach the k best
    left out (``reachable``) where ``near`` is the exact nearest (``exact``) and the query holds no
    code; ``codes`` counts the query's codes each entry holds (read only where it has codes);
    then ``fused`` at ``weight`` (None: the query's own, ``Words.weight``). A search
    (``search.read.lookup``) and a sweep (``search.studies.sweep``) rank with it alike."""
    weight = words.weight if weight is None else weight
    wanted = missing(near, keyword)
    if exact and not words.codes:
        wanted = reachable(near, keyword, wanted, weight, k, depth(k))
    near = {**near, **cosines(wanted)}
    held = codes(list(near)) if words.codes else None
    return fused(near, keyword, weight, k, held)


@dataclass(frozen=True)
class Words:
    """One query's keyword side: its text, the mode it runs in and the keyword weight of a fusion."""

    text: str
    mode: str
    weight: float = DEFAULT_WEIGHT

    @functools.cached_property
    def terms(self) -> list[str]:
        """``query_terms`` of the text, split once however often a search reads them."""
        return query_terms(self.text)

    @property
    def match(self) -> str | None:
        return " OR ".join(self.phrases) if self.terms else None

    @functools.cached_property
    def phrases(self) -> list[str]:
        """Each term of the query's match as the FTS5 string it is matched with (what its weight
        is counted with, ``word_weight``): the same terms, so the share is of the words searched."""
        return [_phrase(term) for term in self.terms]

    @functools.cached_property
    def codes(self) -> list[str]:
        """The ``phrases`` of the query's codes: words of letters and digits (an error code, a
        SKU, a version), where the exact word decides and a sentence model sees near-misses."""
        return [_phrase(term) for term in self.terms if _IDENTIFIER.search(term)]
