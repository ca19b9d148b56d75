"""How one snapshot ranks its entries for a query, in stages: the first stage, one ranker per mode
(dense, exact where the index scores also-fields; keyword; hybrid, the two rankings fused:
``search.read.hybrid``), filtered and grouped; the rerank (a cross-encoder re-orders the first
stage's best ``depth``, before grouping); then each hit marked by the no-answer rule of its mode and
score or a minimum score. ``Snapshot.run`` and ``Snapshot.neighbourhoods`` are the way in; this
module has no entry of its own."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from indexer.catalog import RESERVED, Catalog
from indexer.embedding.fields import FieldScoring
from indexer.store import StoredIndex
from indexer.vectors.entries import EntryVectors
from search.read.confidence import NEIGHBOURS, Neighbourhood, Rule
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
from search.read.requests import Allowed, Hit
from search.read.reranked import Reranking, reranked

if TYPE_CHECKING:
    from indexer.encoders.rerankers import Reranker

Ranker = Callable[..., Ranking]
"""A mode's first stage: (query vector, k, allowed, signals, the query's words) -> the k best."""

CANDIDATES = 64
"""Entries retrieved (from both vector sets) before an index with also-vectors scores them exactly."""


@dataclass
class Signals:
    """What a rule reads of each entry beside its score, noted as a search ranks: its own text's
    cosine (where the score is not that alone) and its keyword evidence (``read``: whether the
    ranking read the keywords)."""

    texts: dict[int, float] = field(default_factory=dict)
    keywords: dict[int, float] = field(default_factory=dict)
    read: bool = False


class Lookup:
    """The rankings of one snapshot's entries: its ``index``, its rows read at its generation
    (``reading``: ``Snapshot.reading``), the also-field ``scoring`` and no-answer ``rules`` of
    its version."""

    def __init__(
        self,
        index: StoredIndex,
        reading: Callable[[], AbstractContextManager[Catalog]],
        scoring: FieldScoring | None,
        rules: Mapping[str, Rule],
    ) -> None:
        self.index, self.reading, self.scoring, self.rules = index, reading, scoring, rules
        self.entries = EntryVectors(index.vectors, also=scoring is not None)
        self.rankers: dict[str, Ranker] = {DENSE: self._dense, KEYWORD: self._keyword, HYBRID: self._hybrid}

    def hits(
        self,
        vectors: np.ndarray,
        queries: Sequence[str],
        k: int,
        allowed: Allowed | None,
        min_score: float | None,
        group_by: str | None,
        words: Sequence[Words] | None,
        reranking: Reranking | None = None,
        key: str = DENSE,
    ) -> list[list[Hit]]:
        """Top-k hits of each query (its text and its vector: a plan ``Snapshot.plan`` checked).
        ``reranking``: the first stage's best ``depth`` re-ordered by the cross-encoder, each hit
        scored by it (the first stage's score kept as ``first_score``). Each hit is marked
        ``answered`` by the stored rule of ``key`` (``search.read.confidence.rule_key``; with its
        ``confidence``) or, given ``min_score``, by its score; neither: ``answered`` is None.
        ``group_by`` (a field ``Snapshot.grouping`` checked): the best hit of each of the k best
        groups. ``words``: each query's keyword side (``Snapshot.said``); None: dense."""
        asked = [None] * len(vectors) if words is None else words
        return [
            self._lookup(vector, query, k, allowed, min_score, group_by, said, reranking, key)
            for vector, query, said in zip(vectors, queries, asked, strict=True)
        ]

    def neighbourhoods(
        self,
        vectors: np.ndarray,
        allowed: Allowed | None,
        count: int,
        words: Sequence[Words] | None,
        queries: Sequence[str] = (),
        reranking: Reranking | None = None,
    ) -> list[Neighbourhood]:
        """Each vector's nearest ``count`` entries, ranked by the mode of its ``words`` (None:
        dense), or (``reranking``) the first stage's best ``max(count, depth)`` re-ordered by the
        cross-encoder for its query (``queries``) and the first ``count`` of them: what a
        confidence is computed from."""
        found = []
        asked = [None] * len(vectors) if words is None else words
        for i, (vector, said) in enumerate(zip(vectors, asked, strict=True)):
            signals = Signals()
            if reranking is None:
                found.append(
                    self._neighbourhood(self._nearest(vector, count, allowed, signals, said), signals)
                )
                continue
            first = self._nearest(vector, max(count, reranking.depth), allowed, signals, said)
            best = dict(list(self._reranked(queries[i], first, reranking.reranker)[0].items())[:count])
            found.append(self._neighbourhood(best, Signals(keywords=signals.keywords, read=signals.read)))
        return found

    def keyword_ranking(self, words: Words, k: int, allowed: Allowed | None) -> tuple[Ranking, Ranking]:
        """Row id -> keyword share, and row id -> keyword score, of the k best keyword matches
        (``search.read.hybrid.keyword_matches``; none when no word can match)."""
        if words.match is None or (allowed is not None and not len(allowed.ids)):
            return {}, {}
        with self.reading() as catalog:
            return keyword_matches(catalog, words, k, None if allowed is None else allowed.ids.tolist())

    def _neighbourhood(self, best: dict[int, float], signals: Signals) -> Neighbourhood:
        """``best`` (row id -> score) with each entry's text hash, its own text's cosine where the
        score is not that alone, and its keyword evidence where the ranking read it (``signals``,
        which ``_nearest`` fills)."""
        rowids = list(best)
        with self.reading() as catalog:
            hashes = catalog.values(rowids, "_hash")
        own = np.array([signals.texts[r] for r in rowids]) if signals.texts else None
        keywords = np.array([signals.keywords.get(r, 0.0) for r in rowids]) if signals.read else None
        scores = np.array(list(best.values()))
        return Neighbourhood(rowids, scores, [hashes[r] for r in rowids], own, keywords)

    def _nearest(
        self,
        vector: np.ndarray,
        k: int,
        allowed: Allowed | None,
        signals: Signals | None = None,
        words: Words | None = None,
    ) -> Ranking:
        """Row id -> score of the k best entries, best first, by the ranker of the mode of
        ``words`` (None: dense). ``signals``, when given, gets each entry's own text's cosine where
        the score is not that alone, and its keyword evidence."""
        return self.rankers[DENSE if words is None else words.mode](vector, k, allowed, signals, words)

    def _dense(
        self, vector: np.ndarray, k: int, allowed: Allowed | None, signals: Signals | None, _: Words | None
    ) -> Ranking:
        """The k nearest by cosine. With a ``scoring``, candidates come from both vector sets and
        each is scored exactly with both (``_scored``)."""
        if self.scoring is None:
            return self._search(vector, k, allowed)
        pool = self._search(vector, max(2 * k, CANDIDATES), allowed)
        texts = None if signals is None else signals.texts
        return dict(list(self._scored(vector, list(pool), texts).items())[:k])

    def _keyword(
        self, vector: np.ndarray, k: int, allowed: Allowed | None, signals: Signals | None, words: Words
    ) -> Ranking:
        """The k best by keywords (``keyword_ranking``), their cosines noted in ``signals``."""
        found = self._keywords(words, k, allowed, signals)
        if signals is not None:  # their cosines: what a rule reads beside
            self._cosines(vector, [r for r in found if r not in signals.texts], signals)
        return found

    def _hybrid(
        self, vector: np.ndarray, k: int, allowed: Allowed | None, signals: Signals | None, words: Words
    ) -> Ranking:
        """The k best of the dense and keyword rankings fused (``search.read.hybrid.hybrid_ranking``)."""
        near = self._cosines(vector, None, signals, depth(k), allowed)
        keyword = self._keywords(words, depth(k), allowed, signals)
        return hybrid_ranking(
            near,
            keyword,
            words,
            k,
            lambda rowids: self._cosines(vector, rowids, signals),
            lambda rowids: self._codes(words, rowids),
            exact=signals is None and self.scoring is None,  # near: the exact nearest
        )

    def _reranked(self, query: str, first: Ranking, reranker: Reranker) -> tuple[Ranking, Ranking]:
        """``search.read.reranked.reranked`` of ``first``'s entries' texts."""
        with self.reading() as catalog:
            texts = catalog.values(list(first), "_text")
        return reranked(query, first, [texts[rowid] for rowid in first], reranker)

    def _keywords(
        self, words: Words, k: int, allowed: Allowed | None, signals: Signals | None
    ) -> dict[int, float]:
        """``keyword_ranking``: row id -> the keyword score in keyword mode (BM25 over its bound),
        the share in hybrid (what it fuses); the share (the keyword evidence a rule reads) noted in
        ``signals`` when given."""
        shares, scores = self.keyword_ranking(words, k, allowed)
        if signals is not None:
            signals.read = True
            signals.keywords.update(shares)
        return scores if words.mode == KEYWORD else shares

    def _codes(self, words: Words, rowids: list[int]) -> dict[int, int]:
        """``search.read.hybrid.code_counts`` of ``rowids``, read at this version."""
        with self.reading() as catalog:
            return code_counts(catalog, words, rowids)

    def _cosines(
        self,
        vector: np.ndarray,
        rowids: list[int] | None,
        signals: Signals | None = None,
        k: int = 0,
        allowed: Allowed | None = None,
    ) -> dict[int, float]:
        """Row id -> dense score of the given entries (exactly), or of the k nearest (``rowids``
        None), each one's own text's cosine noted in ``signals`` when given."""
        texts = None if signals is None else signals.texts
        if rowids is None:
            found = self._nearest(vector, k, allowed, signals)
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

    def _lookup(
        self,
        vector: np.ndarray,
        query: str,
        k: int,
        allowed: Allowed | None,
        min_score: float | None,
        group_by: str | None,
        words: Words | None = None,
        reranking: Reranking | None = None,
        key: str = DENSE,
    ) -> list[Hit]:
        """One query's hits, stage by stage: the first stage (grouped where asked), the rerank,
        the confidence, the rows."""
        rule = self.rules.get(key)  # None: ``Snapshot.mode`` let it by, or its score has no rule
        wide = max(k, NEIGHBOURS) if rule and rule.reads_neighbours else k
        if reranking is not None:
            wide = max(wide, reranking.depth)
        signals = None if rule is None else Signals()  # what the rule reads beside the scores
        if group_by is None:
            best = self._nearest(vector, wide, allowed, signals, words)
            heads, others = list(range(min(k, len(best)))), None
        else:
            best, heads, others = self._grouped(vector, k, wide, allowed, group_by, signals, words)
        first: Ranking | None = None
        own: Ranking = {}
        if reranking is not None:
            # the candidates: the first stage's best ``wide`` and each of its k groups' best
            order = list(best)
            pool = order[:wide] + [order[i] for i in heads if i >= wide]
            first = {rowid: best[rowid] for rowid in pool}
            best, own = self._reranked(query, first, reranking.reranker)
            if group_by is None:
                heads = list(range(min(k, len(best))))
            else:  # grouped after the rerank: each group's best by the reranker
                heads, others = self._heads(list(best), k, allowed, group_by)
            if signals is not None:  # the score is the reranker's: no text cosine beside it
                signals = Signals(keywords=signals.keywords, read=signals.read)
            wide = len(best)
        ranked = list(best.items())
        top = [ranked[i] for i in heads]
        with self.reading() as catalog:
            rows = catalog.rows([rowid for rowid, _ in top])
        confidence = self._confidence(vector, ranked, heads, wide, allowed, signals, words, rule, reranking)
        hits: list[Hit] = []
        for place, ((rowid, score), sure) in enumerate(zip(top, confidence, strict=True)):
            row = rows[rowid]
            fields = {name: value for name, value in row.items() if name not in RESERVED}
            if min_score is not None:
                answered: bool | None = score >= min_score
            else:
                answered = None if sure is None else sure >= rule.threshold
            more = None if others is None else others[place]
            scores = (None, None) if first is None else (first[rowid], own[rowid])
            hit = Hit(
                len(hits) + 1, row["_id"], float(score), row["_text"], fields, answered, sure, more, *scores
            )
            hits.append(hit)
        return hits

    def _confidence(
        self,
        vector: np.ndarray,
        ranked: list[tuple[int, float]],
        heads: list[int],
        wide: int,
        allowed: Allowed | None,
        signals: Signals | None,
        words: Words | None,
        rule: Rule | None,
        reranking: Reranking | None,
    ) -> list[float | None]:
        """The rule's confidence in each head of ``ranked`` (None each without a rule), measured
        against the query's neighbourhood: its first ``wide`` entries (reranked: the candidates)."""
        if rule is None or signals is None or not heads:
            return [None] * len(heads)
        near = self._neighbourhood(dict(ranked[: max(wide, heads[-1] + 1)]), signals)
        # a hit is measured against the query's whole neighbourhood: a filter never changes it
        # (reranked: against its candidates, which the filter chose)
        whole = near
        if allowed is not None and rule.reads_neighbours and reranking is None:
            unfiltered = Signals()
            whole = self._neighbourhood(self._nearest(vector, wide, None, unfiltered, words), unfiltered)
        features = whole.features_of(
            near.scores[heads], [near.groups[i] for i in heads], near.own[heads], near.evidence[heads]
        )
        return rule.confidence(features).tolist()

    def _grouped(
        self,
        vector: np.ndarray,
        k: int,
        wanted: int,
        allowed: Allowed | None,
        group_by: str,
        signals: Signals | None = None,
        words: Words | None = None,
    ) -> tuple[dict[int, float], list[int], list[int]]:
        """The nearest entries (row id -> score, best first, at least ``wanted``), the positions
        in them of the best entry of each of the k best groups, and how many other entries (the
        filter admits) each of those groups holds. An entry without a value is a group of its
        own. The search widens until k groups are found or none is left: at most the whole
        index, like a filter that admits few entries. ``signals``: as ``_nearest``."""
        within = None if allowed is None else allowed.ids.tolist()
        with self.reading() as catalog:
            available = catalog.group_count(group_by, within)
        fetch = max(wanted, 4 * k)
        while True:
            found = self._nearest(vector, fetch, allowed, signals, words)
            with self.reading() as catalog:
                values = catalog.values(list(found), group_by)
            heads = _group_heads(list(found), values, k)
            if len(heads) >= min(k, available) or len(found) < fetch:
                break
            fetch *= 2
        return found, heads, self._others(group_by, [values[list(found)[i]] for i in heads], within)

    def _heads(
        self, order: list[int], k: int, allowed: Allowed | None, group_by: str
    ) -> tuple[list[int], list[int]]:
        """The positions in ``order`` (row ids, best first) of the best entry of each of its k best
        groups, and how many other entries (the filter admits) each of those groups holds."""
        with self.reading() as catalog:
            values = catalog.values(order, group_by)
        heads = _group_heads(order, values, k)
        within = None if allowed is None else allowed.ids.tolist()
        return heads, self._others(group_by, [values[order[i]] for i in heads], within)

    def _others(self, group_by: str, named: list, within: list[int] | None) -> list[int]:
        """How many other entries (of ``within``) each group of ``named`` (its value) holds."""
        with self.reading() as catalog:
            sizes = catalog.group_sizes(group_by, [v for v in named if v is not None], within)
        return [0 if value is None else sizes.get(value, 1) - 1 for value in named]


def _group_heads(order: list[int], values: Mapping[int, object], k: int) -> list[int]:
    """The positions in ``order`` of the first entry of each of its first k groups (a value; an
    entry without one a group of its own)."""
    heads: list[int] = []
    seen: set[object] = set()
    for position, rowid in enumerate(order):
        value = values[rowid]
        if value is None or value not in seen:
            seen.add(value)
            heads.append(position)
            if len(heads) == k:
                break
    return heads


def _best_per_entry(rowids: np.ndarray, scores: np.ndarray) -> dict[int, float]:
    """Row id -> best score of each entry among a search's results (FAISS's order, best first:
    an entry's first vector is its best), best first, equal scores in row id order."""
    kept = rowids >= 0
    rowids, scores = rowids[kept], scores[kept]
    _, first = np.unique(rowids, return_index=True)
    rowids, scores = rowids[first], scores[first]
    order = np.lexsort((rowids, -scores))
    return dict(zip(rowids[order].tolist(), scores[order].tolist(), strict=True))
