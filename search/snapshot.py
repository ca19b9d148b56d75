"""One complete version of an index and the encoding its questions embed with: what a request
searches from start to end (``SearchEngine`` hands one out and renews it when a new version is
live). Its lookups: dense, keyword or hybrid, filtered, grouped, scored with also-fields and the
no-answer rule."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from indexer.catalog import RESERVED, Catalog, Facet, OperationalError
from indexer.embedding.fields import FieldScoring
from indexer.errors import BadInput, IndexMoved
from indexer.progress import Share
from indexer.reading.corpus import spelled
from indexer.store import StoredIndex
from indexer.vectors.entries import EntryVectors
from search.confidence import NEIGHBOURS, Neighbourhood, Rule, check_min_score, stored_form, stored_rules
from search.encoding import Encoding
from search.filters import parse_filter
from search.hybrid import (
    DEFAULT_MODE,
    MODES,
    Words,
    check_mode,
    code_counts,
    keyword_scores,
    ranked,
    stored_weight,
)
from search.requests import Allowed, Hit, check_k, check_queries

CANDIDATES = 64
"""Entries retrieved (from both vector sets) before an index with also-vectors scores them exactly."""


@dataclass(frozen=True)
class Plan:
    """One search call, resolved once (``Snapshot.plan``): its queries, how many hits, the mode
    (``search.hybrid.MODES``) it runs in, its filter, minimum score and grouping."""

    queries: tuple[str, ...]
    k: int
    mode: str
    where: str | None = None
    min_score: float | None = None
    group_by: str | None = None


@dataclass
class Signals:
    """What a rule reads of each entry beside its score, noted as a search ranks: its own text's
    cosine (where the score is not that alone) and its keyword evidence (``read``: whether the
    ranking read the keywords)."""

    texts: dict[int, float] = field(default_factory=dict)
    keywords: dict[int, float] = field(default_factory=dict)
    read: bool = False


@dataclass(frozen=True)
class Snapshot:
    """One complete version: the index and the ``Encoding`` of its queries (the encoder of its
    strategy and its fitted transform). The encoder runs the exported graph on ONNX Runtime or,
    where the strategy's network could not be exported, the model on torch; ``info`` says which
    (``indexer.encoders.factory``).

    A request takes one snapshot and does everything with it, so a reload (which publishes a new
    snapshot) can never pair one version's vectors with another's model. An update commits into
    the same version, so every read of rows goes through ``reading``: it sees the generation the
    vectors were opened at, or raises ``IndexMoved`` (the engine then reopens and asks again). The
    SQLite connection is shared by the threads that serve requests, so every use of it holds
    ``db_lock``.
    """

    index: StoredIndex
    encoding: Encoding
    db_lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    @property
    def meta(self) -> dict[str, Any]:
        return self.index.meta

    def info(self) -> dict[str, Any]:
        """The index's facts (``StoredIndex.info``), read under the lock like every SQLite use, with
        its rules by mode and the mode a search runs in when none is asked (``searched``)."""
        with self.catalog():
            facts = self.index.info(self.encoding.embedder.decision.status)
        return {**facts, "calibration": stored_form(self.rules) or None, "default_mode": self.searched}

    @contextlib.contextmanager
    def catalog(self) -> Iterator[Catalog]:
        """The catalog, under the lock. A killed writer's journal this process cannot roll back
        (it may not write the index) is ``IndexMoved``: the engine reopens the index, which
        then reads the last committed state (``Catalog``), and asks again."""
        with self.db_lock:
            try:
                yield self.index.catalog
            except OperationalError as exc:
                if not self.index.catalog.cannot_roll_back(exc):
                    raise
                raise IndexMoved("a killed writer left the index half-written: ask again") from None

    @contextlib.contextmanager
    def reading(self) -> Iterator[Catalog]:
        """The catalog, read at this snapshot's generation under the lock (``Catalog.reading_at``)."""
        with self.catalog() as catalog, catalog.reading_at(self.index.manifest.generation):
            yield catalog

    def changed(self) -> bool:
        """An update committed into this snapshot's version since it was opened (new segments or
        tombstones: ``indexer.vectors.segments``)."""
        with self.db_lock:
            return self.index.changed()

    def facets(self) -> dict[str, Facet]:
        """The stored fields' types, common values and ranges (``Catalog.facets``), under the lock."""
        with self.catalog() as catalog:
            return catalog.facets()

    def plan(
        self,
        queries: Sequence[str],
        k: int = 10,
        where: str | None = None,
        min_score: float | None = None,
        group_by: str | None = None,
        mode: str | None = None,
    ) -> Plan:
        """One search call checked and its mode resolved (``mode``), before anything is embedded."""
        check_queries(queries)
        check_k(k)
        check_min_score(min_score)
        return Plan(tuple(queries), k, self.mode(mode), where, min_score, group_by)

    def run(self, plan: Plan, vectors: np.ndarray) -> list[list[Hit]]:
        """``plan`` on this version, its queries embedded as ``vectors``: among the entries its
        filter allows, the best per value of its grouping, in its mode, marked by the rule of that
        mode or its minimum score. What every search runs (``SearchEngine.search_many``,
        ``evaluate``)."""
        allowed, grouping = self.allowed(plan.where), self.grouping(plan.group_by)
        said = self.said(plan.queries, plan.mode)
        return self.lookup(vectors, plan.k, allowed, plan.min_score, grouping, said)

    def search_many(self, queries: Sequence[str], *args: Any, **kwargs: Any) -> list[list[Hit]]:
        """``plan`` (its arguments) and ``run`` on this version, the queries embedded in one pass:
        ``SearchEngine.search_many`` without the retry, for code that holds one version."""
        return self.run(self.plan(queries, *args, **kwargs), self.embed(queries))

    @functools.cached_property
    def keywords(self) -> bool:
        """Whether this version keeps the keyword table (one written before it does not)."""
        with self.catalog() as catalog:
            return catalog.has_keywords()

    @property
    def default_mode(self) -> str:
        """``DEFAULT_MODE``, or dense where the index has no keyword table."""
        return DEFAULT_MODE if self.keywords else "dense"

    def serves(self, mode: str) -> str:
        """``mode`` if the index can search in it; else one line saying why not."""
        if check_mode(mode) != "dense" and not self.keywords:
            raise BadInput(
                f"mode {mode}: this index was written before keyword search; its next version"
                " (add, delete or compact) keeps the keyword table"
            )
        return mode

    @property
    def searched(self) -> str:
        """The mode a search runs in when none is asked: ``default_mode``, unless the index has
        no-answer rules and none for it: then the first mode (``MODES``) it has one for."""
        rules = self.rules
        if not rules or self.default_mode in rules:
            return self.default_mode
        return next(mode for mode in MODES if mode in rules)

    def mode(self, asked: str | None) -> str:
        """The mode a search runs in: the one asked for, else ``searched``. A mode the index
        cannot serve is refused in one line; one a calibrated index has no rule for answers, its
        hits unmarked (``search.confidence.unruled`` says so)."""
        return self.serves(asked) if asked else self.searched

    def words(self, queries: Sequence[str], mode: str | None) -> list[Words] | None:
        """What a non-dense search needs of each query (None: dense), in the mode ``mode`` resolves to."""
        return self.said(queries, self.mode(mode))

    def said(self, queries: Sequence[str], mode: str) -> list[Words] | None:
        """Each query's keyword side in ``mode``, a mode already resolved (None: dense)."""
        if mode == "dense":
            return None
        weight = stored_weight(self.meta)
        return [Words(query, mode, weight) for query in queries]

    def keyword_ranking(self, words: Words, k: int, allowed: Allowed | None) -> dict[int, float]:
        """Row id -> keyword evidence of the k best keyword matches (``search.hybrid.keyword_scores``;
        none when no word can match)."""
        if words.match is None or (allowed is not None and not len(allowed.ids)):
            return {}
        with self.reading() as catalog:
            return keyword_scores(catalog, words, k, None if allowed is None else allowed.ids.tolist())

    def embed(self, queries: Sequence[str], progress: Share | None = None) -> np.ndarray:
        check_queries(queries)
        return self.encoding.embed(queries, progress=progress)

    def allowed(self, where: str | None) -> Allowed | None:
        """The entries a filter admits, found in SQLite before any vector is compared. The parser
        bounds a filter's size and depth; anything SQLite still refuses is a FilterError."""
        if where is None:
            return None
        with self.catalog() as catalog:
            columns = catalog.columns()
        condition = parse_filter(where, [c for c in columns if c not in RESERVED])
        with self.reading() as catalog:
            found = catalog.matching(condition.sql, condition.params)
        ids = np.array([r[0] for r in found], dtype=np.int64)
        return Allowed(ids, int(sum(r[1] for r in found)))

    def grouping(self, group_by: str | None) -> str | None:
        """The stored field hits are grouped by, checked before any vector is compared."""
        if group_by is None:
            return None
        with self.catalog() as catalog:
            fields = catalog.field_types()
        name = spelled(group_by, fields)  # a field name matches whatever its case, as in a filter
        if name not in fields:
            raise BadInput(f"group by: unknown field {group_by!r}; fields are: {', '.join(sorted(fields))}")
        return name

    @functools.cached_property
    def rules(self) -> dict[str, Rule]:
        """The no-answer rules ``calibrate`` stored in this version, by the mode each answers in."""
        return stored_rules(self.meta.get("calibration"))

    def lookup(
        self,
        vectors: np.ndarray,
        k: int,
        allowed: Allowed | None = None,
        min_score: float | None = None,
        group_by: str | None = None,
        words: Sequence[Words] | None = None,
    ) -> list[list[Hit]]:
        """Top-k hits of each vector. Each hit is marked ``answered`` by the stored rule (with its
        ``confidence``) or, given ``min_score``, by its cosine; neither: ``answered`` is None.
        ``group_by`` (a field ``grouping`` checked): the best hit of each of the k best groups.
        ``words`` (``words``): each query's keyword or hybrid search; None: dense."""
        check_k(k)
        check_min_score(min_score)
        asked = [None] * len(vectors) if words is None else words
        return [
            self._lookup(vector, k, allowed, min_score, group_by, said)
            for vector, said in zip(vectors, asked, strict=True)
        ]

    def neighbourhoods(
        self,
        vectors: np.ndarray,
        allowed: Allowed | None = None,
        count: int = NEIGHBOURS,
        words: Sequence[Words] | None = None,
    ) -> list[Neighbourhood]:
        """Each vector's nearest ``count`` entries, ranked by the mode of its ``words`` (None:
        dense): what a confidence is computed from."""
        found = []
        for vector, said in zip(vectors, [None] * len(vectors) if words is None else words, strict=True):
            signals = Signals()
            found.append(self._neighbourhood(self._nearest(vector, count, allowed, signals, said), signals))
        return found

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

    @functools.cached_property
    def scoring(self) -> FieldScoring | None:
        """The second vector per entry this version scores with (``indexer.embedding.fields``), if any."""
        return FieldScoring.from_source(self.meta.get("source", {}))

    @property
    def entries(self) -> EntryVectors:
        """This version's vectors searched per entry (with its also-vectors, if it scores them)."""
        return EntryVectors(self.index.vectors, also=self.scoring is not None)

    def _nearest(
        self,
        vector: np.ndarray,
        k: int,
        allowed: Allowed | None,
        signals: Signals | None = None,
        words: Words | None = None,
    ) -> dict[int, float]:
        """Row id -> score of the k best entries, best first. With a ``scoring``, candidates
        come from both vector sets and each is scored exactly with both (``_scored``). ``words``:
        ranked by keywords, or fused with them (``search.hybrid``). ``signals``, when given, gets
        each entry's own text's cosine where the score is not that alone, and its keyword evidence."""
        if words is None:
            if self.scoring is None:
                return self._search(vector, k, allowed)
            pool = self._search(vector, max(2 * k, CANDIDATES), allowed)
            texts = None if signals is None else signals.texts
            return dict(list(self._scored(vector, list(pool), texts).items())[:k])
        found = ranked(
            words.mode,
            k,
            lambda n: self._cosines(vector, None, signals, n, allowed),
            lambda n: self._keywords(words, n, allowed, signals),
            lambda rowids: self._cosines(vector, rowids, signals),
            words.weight,
            (lambda rowids: self._codes(words, rowids)) if words.codes else None,
        )
        if signals is not None and words.mode == "keyword":  # their cosines: what a rule reads beside
            self._cosines(vector, [r for r in found if r not in signals.texts], signals)
        return found

    def _keywords(
        self, words: Words, k: int, allowed: Allowed | None, signals: Signals | None
    ) -> dict[int, float]:
        """``keyword_ranking``, noted in ``signals`` when given."""
        found = self.keyword_ranking(words, k, allowed)
        if signals is not None:
            signals.read = True
            signals.keywords.update(found)
        return found

    def _codes(self, words: Words, rowids: list[int]) -> dict[int, int]:
        """``search.hybrid.code_counts`` of ``rowids``, read at this version."""
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
            best: dict[int, float] = {}
            for rowid, score in zip(found[0].tolist(), scores[0].tolist(), strict=True):
                if rowid >= 0 and rowid not in best:
                    best[rowid] = score
            ordered = sorted(best.items(), key=lambda item: (-item[1], item[0]))
            if fetch >= total or (len(ordered) >= wanted and scores[0][-1] < ordered[wanted - 1][1]):
                return dict(ordered[:wanted])
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
        k: int,
        allowed: Allowed | None,
        min_score: float | None,
        group_by: str | None,
        words: Words | None = None,
    ) -> list[Hit]:
        rule = self.rules.get("dense" if words is None else words.mode)  # None: ``mode`` let it through
        wide = max(k, NEIGHBOURS) if rule and rule.reads_neighbours else k
        signals = None if rule is None else Signals()  # what the rule reads beside the scores
        if group_by is None:
            best = self._nearest(vector, wide, allowed, signals, words)
            with self.reading() as catalog:
                rows = catalog.rows(list(best))
            heads, others = list(range(min(k, len(best)))), None
        else:
            best, heads, others = self._grouped(vector, k, wide, allowed, group_by, signals, words)
            with self.reading() as catalog:
                rows = catalog.rows([list(best)[i] for i in heads])
        ranked = list(best.items())
        top = [ranked[i] for i in heads]
        confidence: list[float | None] = [None] * len(top)
        if rule is not None and signals is not None and top:
            near = self._neighbourhood(dict(ranked[: max(wide, heads[-1] + 1)]), signals)
            # a hit is measured against the query's whole neighbourhood: a filter never changes it
            whole = near
            if allowed is not None and rule.reads_neighbours:
                unfiltered = Signals()
                whole = self._neighbourhood(self._nearest(vector, wide, None, unfiltered, words), unfiltered)
            features = whole.features_of(
                near.scores[heads], [near.groups[i] for i in heads], near.own[heads], near.evidence[heads]
            )
            confidence = rule.confidence(features).tolist()
        hits: list[Hit] = []
        for place, ((rowid, score), sure) in enumerate(zip(top, confidence, strict=True)):
            row = rows[rowid]
            fields = {name: value for name, value in row.items() if name not in RESERVED}
            if min_score is not None:
                answered: bool | None = score >= min_score
            else:
                answered = None if sure is None else sure >= rule.threshold
            more = None if others is None else others[place]
            hit = Hit(len(hits) + 1, row["_id"], float(score), row["_text"], fields, answered, sure, more)
            hits.append(hit)
        return hits

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
            heads, seen = [], set()
            for position, rowid in enumerate(found):
                value = values[rowid]
                if value is None or value not in seen:
                    seen.add(value)
                    heads.append(position)
                    if len(heads) == k:
                        break
            if len(heads) >= min(k, available) or len(found) < fetch:
                break
            fetch *= 2
        rowids = list(found)
        named = [values[rowids[i]] for i in heads]
        with self.reading() as catalog:
            sizes = catalog.group_sizes(group_by, [v for v in named if v is not None], within)
        return found, heads, [0 if value is None else sizes.get(value, 1) - 1 for value in named]
