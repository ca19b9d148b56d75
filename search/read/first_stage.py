"""The first stage of a search: one ranker per mode (dense, exact where the index scores
also-fields; keyword; hybrid, the two rankings fused: ``search.read.hybrid``). A ranker is pure:
``FirstStage.rank`` returns the best entries and the features a no-answer rule reads beside
their scores (``Features``), nothing filled in the caller's hands."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import numpy as np

from indexer.catalog import Catalog
from indexer.embedding.fields import FieldScoring
from indexer.store import StoredIndex
from indexer.vectors.entries import EntryVectors
from search.read.hybrid import (
    DENSE,
    HYBRID,
    KEYWORD,
    Ranking,
    Words,
    code_counts,
    depth,
    hybrid_ranking,
    keyword_matches,
)
from search.read.requests import Allowed

CANDIDATES = 64
"""Entries retrieved (from both vector sets) before an index with also-vectors scores them exactly."""


@dataclass
class Features:
    """What a rule reads of each entry beside its score, as a ranker found it: its own text's
    cosine (where the score is not that alone) and its keyword evidence (``read``: whether the
    ranking read the keywords)."""

    texts: dict[int, float] = field(default_factory=dict)
    keywords: dict[int, float] = field(default_factory=dict)
    read: bool = False

    def keywords_only(self) -> Features:
        """These features less the text cosines: what a reranked score (not a cosine) reads."""
        return Features(keywords=self.keywords, read=self.read)


Ranker = Callable[
    ["FirstStage", np.ndarray, int, "Allowed | None", "Features | None", "Words | None"], Ranking
]
"""A mode's ranker: (the first stage, query vector, k, allowed, the features it notes (None:
none), the query's words) -> the k best. Private to ``FirstStage``, which hands each call its
own ``Features``."""


class FirstStage:
    """The first stage over one snapshot's entries: its ``index``, its rows read at its generation
    (``reading``) and the also-field ``scoring`` of its version."""

    def __init__(
        self,
        index: StoredIndex,
        reading: Callable[[], AbstractContextManager[Catalog]],
        scoring: FieldScoring | None,
    ) -> None:
        self.index, self.reading, self.scoring = index, reading, scoring
        self.entries = EntryVectors(index.vectors, also=scoring is not None)

    def rank(
        self, vector: np.ndarray, k: int, allowed: Allowed | None, words: Words | None, features: bool
    ) -> tuple[Ranking, Features | None]:
        """Row id -> score of the k best entries, best first, by the ranker of the mode of
        ``words`` (None: dense), and (``features``) what a rule reads of each beside its score."""
        noted = Features() if features else None
        ranker = RANKERS[DENSE if words is None else words.mode]  # functions, not bound methods:
        found = ranker(self, vector, k, allowed, noted, words)  # no cycle keeps a snapshot alive
        return found, noted

    def keyword_ranking(self, words: Words, k: int, allowed: Allowed | None) -> tuple[Ranking, Ranking]:
        """Row id -> keyword share, and row id -> keyword score, of the k best keyword matches
        (``search.read.hybrid.keyword_matches``; none when no word can match)."""
        if words.match is None or (allowed is not None and not len(allowed.ids)):
            return {}, {}
        with self.reading() as catalog:
            return keyword_matches(catalog, words, k, None if allowed is None else allowed.ids.tolist())

    def _dense(
        self, vector: np.ndarray, k: int, allowed: Allowed | None, noted: Features | None, _: Words | None
    ) -> Ranking:
        """The k nearest by cosine. With a ``scoring``, candidates come from both vector sets and
        each is scored exactly with both (``_scored``)."""
        if self.scoring is None:
            return self._search(vector, k, allowed)
        pool = self._search(vector, max(2 * k, CANDIDATES), allowed)
        texts = None if noted is None else noted.texts
        return dict(list(self._scored(vector, list(pool), texts).items())[:k])

    def _keyword(
        self, vector: np.ndarray, k: int, allowed: Allowed | None, noted: Features | None, words: Words
    ) -> Ranking:
        """The k best by keywords (``keyword_ranking``), their cosines noted."""
        found = self._keywords(words, k, allowed, noted)
        if noted is not None:  # their cosines: what a rule reads beside
            self._cosines(vector, [r for r in found if r not in noted.texts], noted)
        return found

    def _hybrid(
        self, vector: np.ndarray, k: int, allowed: Allowed | None, noted: Features | None, words: Words
    ) -> Ranking:
        """The k best of the dense and keyword rankings fused (``search.read.hybrid.hybrid_ranking``)."""
        near = self._cosines(vector, None, noted, depth(k), allowed)
        keyword = self._keywords(words, depth(k), allowed, noted)
        return hybrid_ranking(
            near,
            keyword,
            words,
            k,
            lambda rowids: self._cosines(vector, rowids, noted),
            lambda rowids: self._codes(words, rowids),
            exact=noted is None and self.scoring is None,  # near: the exact nearest
        )

    def _keywords(
        self, words: Words, k: int, allowed: Allowed | None, noted: Features | None
    ) -> dict[int, float]:
        """``keyword_ranking``: row id -> the keyword score in keyword mode (BM25 over its bound),
        the share in hybrid (what it fuses); the share (the keyword evidence a rule reads) noted."""
        shares, scores = self.keyword_ranking(words, k, allowed)
        if noted is not None:
            noted.read = True
            noted.keywords.update(shares)
        return scores if words.mode == KEYWORD else shares

    def _codes(self, words: Words, rowids: list[int]) -> dict[int, int]:
        """``search.read.hybrid.code_counts`` of ``rowids``, read at this version."""
        with self.reading() as catalog:
            return code_counts(catalog, words, rowids)

    def _cosines(
        self,
        vector: np.ndarray,
        rowids: list[int] | None,
        noted: Features | None = None,
        k: int = 0,
        allowed: Allowed | None = None,
    ) -> dict[int, float]:
        """Row id -> dense score of the given entries (exactly), or of the k nearest (``rowids``
        None), each one's own text's cosine noted."""
        texts = None if noted is None else noted.texts
        if rowids is None:
            found = self._dense(vector, k, allowed, noted, None)
        elif not rowids:
            return {}
        elif self.scoring is not None:
            return self._scored(vector, rowids, texts)
        else:
            with self.reading() as catalog:
                chunks = catalog.values(rowids, "_chunks")
            held = Allowed(np.array(rowids, dtype=np.int64), int(sum(chunks.values())))
            found = self._search(vector, len(rowids), held)
        if texts is not None and self.scoring is None:
            texts.update(found)
        return found

    def _search(self, vector: np.ndarray, k: int, allowed: Allowed | None) -> dict[int, float]:
        """Row id -> best cosine of the k nearest entries, best first, equal cosines in row id
        (file) order. A chunked entry (or one with an also-vector) may hold several of the
        nearest vectors, and FAISS orders equal scores as it likes, so the search widens until k
        distinct entries are found and no vector left out ties with the k-th (the first, best
        vector gives an entry's score)."""
        index = self.index
        if allowed is None:
            entries, total, ids = index.meta["count"], index.vectors.count, None
        else:
            entries, total, ids = len(allowed.ids), allowed.vectors, allowed.ids
        if entries == 0:
            return {}
        wanted = min(k, entries)
        fetch = min(k + 1 if total == entries else 2 * k, total)  # one more: whether the k-th ties
        while True:
            scores, found = self.entries.search(vector[None, :], fetch, ids)
            best = _best_per_entry(found[0], scores[0])
            ordered = list(best)
            if fetch >= total or (len(ordered) >= wanted and scores[0][-1] < best[ordered[wanted - 1]]):
                return {rowid: best[rowid] for rowid in ordered[:wanted]}
            fetch = min(2 * fetch, total)

    def _scored(
        self, vector: np.ndarray, rowids: list[int], texts: dict[int, float] | None = None
    ) -> dict[int, float]:
        """Row id -> combined score of each candidate, best first: both of its vector sets
        compared with the query (a search restricted to its vectors, so exact), each set's best
        chunk taken, then ``FieldScoring.combine``. ``texts`` gets each one's own text cosine."""
        if not rowids:
            return {}
        with self.reading() as catalog:
            chunks = catalog.values(rowids, "_chunks")
        held = int(sum(chunks.values()))
        text, also = self.entries.both(vector, rowids, held)
        rows = np.array(rowids, dtype=np.int64)
        combined = self.scoring.combine(text, also)
        if texts is not None:
            texts.update(zip(rowids, text.tolist(), strict=True))
        order = np.lexsort((rows, -combined))  # equal scores in row id (file) order
        return {int(rows[i]): float(combined[i]) for i in order}


RANKERS: Mapping[str, Ranker] = {
    DENSE: FirstStage._dense,
    KEYWORD: FirstStage._keyword,
    HYBRID: FirstStage._hybrid,
}
"""The ranker of each mode (``FirstStage.rank``)."""


def _best_per_entry(rowids: np.ndarray, scores: np.ndarray) -> dict[int, float]:
    """Row id -> best score of each entry among a search's results (FAISS's order, best first:
    an entry's first vector is its best), best first, equal scores in row id order."""
    kept = rowids >= 0
    rowids, scores = rowids[kept], scores[kept]
    _, first = np.unique(rowids, return_index=True)
    rowids, scores = rowids[first], scores[first]
    order = np.lexsort((rowids, -scores))
    return dict(zip(rowids[order].tolist(), scores[order].tolist(), strict=True))
