"""How one snapshot answers a batch of questions, in phases, each over the whole batch (one
question is a batch of one): the first stage (``search.read.first_stage``: one ranker per mode,
filtered) and the grouping; the rerank (``search.read.reranked``: every candidate pair of the
batch scored together, each once, before the grouping is redone on the reranked order); the
confidence (each hit marked by the no-answer rule of its mode and score, or a minimum score) and
the rows. ``Snapshot.run`` and ``Snapshot.neighbourhoods`` are the way in; this module has no
entry of its own."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import numpy as np

from indexer.catalog import RESERVED, Catalog
from indexer.embedding.fields import FieldScoring
from indexer.store import StoredIndex
from search.read.confidence import NEIGHBOURS, Neighbourhood, Rule
from search.read.first_stage import Features, FirstStage
from search.read.hybrid import DENSE, Ranking, Words
from search.read.requests import Allowed, Hit
from search.read.reranked import Reranking, rerank_batch


@dataclass
class Candidates:
    """One question's ranking between phases: row id -> score, best first (``ranking``), what a
    rule reads beside (``features``; None: no rule reads them), the positions of its hits in it
    (``heads``), each hit's group's other entries (``others``; None: not grouped), how many of
    it a confidence is measured against (``wide``) and, once reranked, the first stage's and the
    reranker's own scores of its candidates (``first``, ``own``)."""

    ranking: Ranking
    features: Features | None
    heads: list[int]
    others: list[int] | None
    wide: int
    first: Ranking | None = None
    own: Ranking = field(default_factory=dict)


class Lookup:
    """The phases over one snapshot's entries: its rows read at its generation (``reading``:
    ``Snapshot.reading``), the also-field ``scoring`` and no-answer ``rules`` of its version."""

    def __init__(
        self,
        index: StoredIndex,
        reading: Callable[[], AbstractContextManager[Catalog]],
        scoring: FieldScoring | None,
        rules: Mapping[str, Rule],
    ) -> None:
        self.reading, self.rules = reading, rules
        self.first_stage = FirstStage(index, reading, scoring)

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
        rule = self.rules.get(key)  # None: ``Snapshot.mode`` let it by, or its score has no rule
        wide = max(k, NEIGHBOURS) if rule and rule.reads_neighbours else k
        if reranking is not None:
            wide = max(wide, reranking.depth)
        asked = _each(words, len(vectors))
        found = [
            self._first(vector, k, wide, allowed, group_by, said, rule is not None)
            for vector, said in zip(vectors, asked, strict=True)
        ]
        if reranking is not None:
            found = self._reranked(queries, found, k, allowed, group_by, reranking)
        return [
            self._marked(vector, candidates, allowed, said, rule, min_score)
            for vector, candidates, said in zip(vectors, found, asked, strict=True)
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
        cross-encoder for its query (``queries``, the batch's pairs scored together) and the
        first ``count`` of them: what a confidence is computed from."""
        deep = count if reranking is None else max(count, reranking.depth)
        firsts = [
            self.first_stage.rank(vector, deep, allowed, said, True)
            for vector, said in zip(vectors, _each(words, len(vectors)), strict=True)
        ]
        if reranking is None:
            return [self._neighbourhood(best, noted) for best, noted in firsts]
        rankings = [best for best, _ in firsts]
        reranked = rerank_batch(queries, rankings, self._texts(rankings), reranking)
        return [
            self._neighbourhood(dict(list(best.items())[:count]), noted.keywords_only())
            for (best, _), (_, noted) in zip(reranked, firsts, strict=True)
        ]

    def keyword_ranking(self, words: Words, k: int, allowed: Allowed | None) -> tuple[Ranking, Ranking]:
        """``FirstStage.keyword_ranking``."""
        return self.first_stage.keyword_ranking(words, k, allowed)

    def _first(
        self,
        vector: np.ndarray,
        k: int,
        wide: int,
        allowed: Allowed | None,
        group_by: str | None,
        words: Words | None,
        features: bool,
    ) -> Candidates:
        """The first phase of one question: its best ``wide`` in its mode, grouped where asked."""
        if group_by is None:
            best, noted = self.first_stage.rank(vector, wide, allowed, words, features)
            return Candidates(best, noted, list(range(min(k, len(best)))), None, wide)
        best, noted, heads, others = self._grouped(vector, k, wide, allowed, group_by, words, features)
        return Candidates(best, noted, heads, others, wide)

    def _reranked(
        self,
        queries: Sequence[str],
        found: Sequence[Candidates],
        k: int,
        allowed: Allowed | None,
        group_by: str | None,
        reranking: Reranking,
    ) -> list[Candidates]:
        """The rerank phase over the batch: each question's candidates (its best ``wide`` and its
        k groups' best) re-ordered (``search.read.reranked.rerank_batch``), grouped again on the
        reranked order. The score is the reranker's: no text cosine beside it."""
        pools = []
        for candidates in found:
            order = list(candidates.ranking)
            pool = order[: candidates.wide] + [order[i] for i in candidates.heads if i >= candidates.wide]
            pools.append({rowid: candidates.ranking[rowid] for rowid in pool})
        done = []
        reranked = rerank_batch(queries, pools, self._texts(pools), reranking)
        for candidates, first, (best, own) in zip(found, pools, reranked, strict=True):
            if group_by is None:
                heads, others = list(range(min(k, len(best)))), None
            else:  # grouped after the rerank: each group's best by the reranker
                heads, others = self._heads(list(best), k, allowed, group_by)
            noted = None if candidates.features is None else candidates.features.keywords_only()
            done.append(Candidates(best, noted, heads, others, len(best), first, own))
        return done

    def _texts(self, rankings: Sequence[Ranking]) -> dict[int, str]:
        """Row id -> text of every entry of ``rankings``, read in one go."""
        with self.reading() as catalog:
            return catalog.values(sorted({rowid for ranking in rankings for rowid in ranking}), "_text")

    def _marked(
        self,
        vector: np.ndarray,
        found: Candidates,
        allowed: Allowed | None,
        words: Words | None,
        rule: Rule | None,
        min_score: float | None,
    ) -> list[Hit]:
        """The last phase of one question: its hits' confidence, marks and rows."""
        ranked = list(found.ranking.items())
        top = [ranked[i] for i in found.heads]
        with self.reading() as catalog:
            rows = catalog.rows([rowid for rowid, _ in top])
        confidence = self._confidence(vector, ranked, found, allowed, words, rule)
        hits: list[Hit] = []
        for place, ((rowid, score), sure) in enumerate(zip(top, confidence, strict=True)):
            row = rows[rowid]
            fields = {name: value for name, value in row.items() if name not in RESERVED}
            if min_score is not None:
                answered: bool | None = score >= min_score
            else:
                answered = None if sure is None else sure >= rule.threshold
            more = None if found.others is None else found.others[place]
            scores = (None, None) if found.first is None else (found.first[rowid], found.own[rowid])
            hit = Hit(
                len(hits) + 1, row["_id"], float(score), row["_text"], fields, answered, sure, more, *scores
            )
            hits.append(hit)
        return hits

    def _confidence(
        self,
        vector: np.ndarray,
        ranked: list[tuple[int, float]],
        found: Candidates,
        allowed: Allowed | None,
        words: Words | None,
        rule: Rule | None,
    ) -> list[float | None]:
        """The rule's confidence in each head of ``ranked`` (None each without a rule), measured
        against the query's neighbourhood: its first ``wide`` entries (reranked: the candidates)."""
        heads, noted = found.heads, found.features
        if rule is None or noted is None or not heads:
            return [None] * len(heads)
        near = self._neighbourhood(dict(ranked[: max(found.wide, heads[-1] + 1)]), noted)
        # a hit is measured against the query's whole neighbourhood: a filter never changes it
        # (reranked: against its candidates, which the filter chose)
        whole = near
        if allowed is not None and rule.reads_neighbours and found.first is None:
            whole = self._neighbourhood(*self.first_stage.rank(vector, found.wide, None, words, True))
        features = whole.features_of(
            near.scores[heads], [near.groups[i] for i in heads], near.own[heads], near.evidence[heads]
        )
        return rule.confidence(features).tolist()

    def _neighbourhood(self, best: dict[int, float], noted: Features | None) -> Neighbourhood:
        """``best`` (row id -> score) with each entry's text hash, its own text's cosine where the
        score is not that alone, and its keyword evidence where the ranking read it (``noted``)."""
        rowids = list(best)
        with self.reading() as catalog:
            hashes = catalog.values(rowids, "_hash")
        noted = noted or Features()
        own = np.array([noted.texts[r] for r in rowids]) if noted.texts else None
        keywords = np.array([noted.keywords.get(r, 0.0) for r in rowids]) if noted.read else None
        scores = np.array(list(best.values()))
        return Neighbourhood(rowids, scores, [hashes[r] for r in rowids], own, keywords)

    def _grouped(
        self,
        vector: np.ndarray,
        k: int,
        wanted: int,
        allowed: Allowed | None,
        group_by: str,
        words: Words | None,
        features: bool,
    ) -> tuple[Ranking, Features | None, list[int], list[int]]:
        """The nearest entries (row id -> score, best first, at least ``wanted``) with their
        features, the positions in them of the best entry of each of the k best groups, and how
        many other entries (the filter admits) each of those groups holds. An entry without a
        value is a group of its own. The search widens until k groups are found or none is
        left: at most the whole index, like a filter that admits few entries."""
        within = None if allowed is None else allowed.ids.tolist()
        with self.reading() as catalog:
            available = catalog.group_count(group_by, within)
        fetch = max(wanted, 4 * k)
        while True:
            found, noted = self.first_stage.rank(vector, fetch, allowed, words, features)
            with self.reading() as catalog:
                values = catalog.values(list(found), group_by)
            heads = _group_heads(list(found), values, k)
            if len(heads) >= min(k, available) or len(found) < fetch:
                break
            fetch *= 2
        named = [values[list(found)[i]] for i in heads]
        return found, noted, heads, self._others(group_by, named, within)

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


def _each(words: Sequence[Words] | None, count: int) -> Sequence[Words | None]:
    """Each query's keyword side, None each where the batch is dense."""
    return [None] * count if words is None else words


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
