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

from indexer.catalog import RESERVED, Catalog, Facet
from indexer.embedding.fields import FieldScoring
from indexer.errors import BadInput
from indexer.progress import Share
from indexer.store import StoredIndex
from indexer.vectors.entries import EntryVectors
from search.confidence import NEIGHBOURS, Neighbourhood, Rule, check_min_score
from search.encoding import Encoding
from search.filters import parse_filter
from search.hybrid import DEFAULT_MODE, Words, check_mode, ranked, stored_weight
from search.requests import Allowed, Hit, check_queries

CANDIDATES = 64
"""Entries retrieved (from both vector sets) before an index with also-vectors scores them exactly."""


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
        """The index's facts (``StoredIndex.info``), read under the lock like every SQLite use."""
        with self.db_lock:
            return self.index.info(self.encoding.embedder.decision.status)

    @contextlib.contextmanager
    def reading(self) -> Iterator[Catalog]:
        """The catalog, read at this snapshot's generation under the lock (``Catalog.reading_at``)."""
        with self.db_lock, self.index.catalog.reading_at(self.index.manifest.generation):
            yield self.index.catalog

    def changed(self) -> bool:
        """An update committed into this snapshot's version since it was opened (new segments or
        tombstones: ``indexer.vectors.segments``)."""
        with self.db_lock:
            return self.index.changed()

    def facets(self) -> dict[str, Facet]:
        """The stored fields' types, common values and ranges (``Catalog.facets``), under the lock."""
        with self.db_lock:
            return self.index.catalog.facets()

    def search_many(
        self,
        queries: Sequence[str],
        k: int = 10,
        where: str | None = None,
        min_score: float | None = None,
        group_by: str | None = None,
        mode: str | None = None,
    ) -> list[list[Hit]]:
        """Embed all queries in one pass, then look each up (among the entries ``where`` allows,
        the best per value of ``group_by``) in ``mode`` (``search.hybrid``; None: the index's):
        ``SearchEngine.search_many`` without the retry."""
        said, allowed = self.words(queries, mode, min_score), self.allowed(where)
        return self.lookup(self.embed(queries), k, allowed, min_score, self.grouping(group_by), said)

    @functools.cached_property
    def keywords(self) -> bool:
        """Whether this version keeps the keyword table (one written before it does not)."""
        with self.db_lock:
            return self.index.catalog.has_keywords()

    def mode(self, asked: str | None, min_score: float | None = None) -> str:
        """The mode a search runs in: the one asked for, else dense where a calibrated rule or a
        ``min_score`` (both cosines) decides answers or the index has no keyword table, else
        ``DEFAULT_MODE``. A mode the index cannot serve is refused in one line."""
        if asked is None:
            return "dense" if self.rule or min_score is not None or not self.keywords else DEFAULT_MODE
        if check_mode(asked) == "dense":
            return asked
        if not self.keywords:
            raise BadInput(
                f"--mode {asked}: this index was written before keyword search; its next version"
                " (add, delete or compact) keeps the keyword table"
            )
        if self.rule is not None:
            raise BadInput(f"--mode {asked}: this index's no-answer rule is calibrated for dense search only")
        if min_score is not None:
            raise BadInput(f"--mode {asked}: --min-score is a cosine, for dense search only")
        return asked

    def words(
        self, queries: Sequence[str], mode: str | None, min_score: float | None = None
    ) -> list[Words] | None:
        """What a non-dense search needs of each query (None: dense)."""
        resolved = self.mode(mode, min_score)
        if resolved == "dense":
            return None
        weight = stored_weight(self.meta)
        return [Words(query, resolved, weight) for query in queries]

    def keyword_ranking(self, words: Words, k: int, allowed: Allowed | None) -> dict[int, float]:
        """Row id -> BM25 score of the k best keyword matches (none when no word can match)."""
        if words.match is None or (allowed is not None and not len(allowed.ids)):
            return {}
        with self.reading() as catalog:
            return dict(catalog.keyword_search(words.match, k, None if allowed is None else allowed.ids))

    def embed(self, queries: Sequence[str], progress: Share | None = None) -> np.ndarray:
        check_queries(queries)
        return self.encoding.embed(queries, progress=progress)

    def allowed(self, where: str | None) -> Allowed | None:
        """The entries a filter admits, found in SQLite before any vector is compared. The parser
        bounds a filter's size and depth; anything SQLite still refuses is a FilterError."""
        if where is None:
            return None
        with self.db_lock:
            columns = self.index.columns()
        condition = parse_filter(where, [c for c in columns if c not in RESERVED])
        with self.reading() as catalog:
            found = catalog.matching(condition.sql, condition.params)
        ids = np.array([r[0] for r in found], dtype=np.int64)
        return Allowed(ids, int(sum(r[1] for r in found)))

    def grouping(self, group_by: str | None) -> str | None:
        """The stored field hits are grouped by, checked before any vector is compared."""
        if group_by is None:
            return None
        with self.db_lock:
            fields = self.index.catalog.field_types()
        if group_by not in fields:
            raise BadInput(f"group by: unknown field {group_by!r}; fields are: {', '.join(sorted(fields))}")
        return group_by

    @functools.cached_property
    def rule(self) -> Rule | None:
        """The decision rule ``calibrate`` stored in this version, if any."""
        stored = self.meta.get("calibration")
        return Rule.from_dict(stored) if stored else None

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
        if k < 1:
            raise BadInput(f"k must be at least 1, not {k}")
        check_min_score(min_score)
        asked = [None] * len(vectors) if words is None else words
        return [
            self._lookup(vector, k, allowed, min_score, group_by, said)
            for vector, said in zip(vectors, asked, strict=True)
        ]

    def neighbourhoods(
        self, vectors: np.ndarray, allowed: Allowed | None = None, count: int = NEIGHBOURS
    ) -> list[Neighbourhood]:
        """Each vector's nearest ``count`` entries: what a confidence is computed from."""
        found = []
        for vector in vectors:
            texts: dict[int, float] = {}
            found.append(self._neighbourhood(self._nearest(vector, count, allowed, texts), texts))
        return found

    def _neighbourhood(self, best: dict[int, float], texts: dict[int, float]) -> Neighbourhood:
        """``best`` (row id -> score) with each entry's text hash, and its own text's cosine
        (``texts``, which ``_nearest`` fills) where the index scores a second text."""
        rowids = list(best)
        with self.reading() as catalog:
            hashes = catalog.values(rowids, "_hash")
        own = np.array([texts[r] for r in rowids]) if self.scoring else None
        return Neighbourhood(rowids, np.array(list(best.values())), [hashes[r] for r in rowids], own)

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
        texts: dict[int, float] | None = None,
        words: Words | None = None,
    ) -> dict[int, float]:
        """Row id -> score of the k best entries, best first. With a ``scoring``, candidates
        come from both vector sets and each is scored exactly with both (``_scored``), which
        puts each one's cosine to its own text into ``texts`` when given. ``words``: ranked by
        keywords, or fused with them (``search.hybrid``)."""
        if words is not None:
            return ranked(
                words.mode,
                k,
                lambda n: self._nearest(vector, n, allowed, texts),
                lambda n: self.keyword_ranking(words, n, allowed),
                words.share,
            )
        if self.scoring is None:
            return self._search(vector, k, allowed)
        pool = self._search(vector, max(2 * k, CANDIDATES), allowed)
        return dict(list(self._scored(vector, list(pool), texts).items())[:k])

    def _search(self, vector: np.ndarray, k: int, allowed: Allowed | None) -> dict[int, float]:
        """Row id -> best cosine of the k nearest entries, best first. A chunked entry (or one
        with an also-vector) may hold several of the nearest vectors, so widen the search until
        k distinct entries are found (the first, best vector gives the score)."""
        index = self.index
        if allowed is None:
            entries, total, ids = index.meta["count"], index.vectors.count, None
        else:
            entries, total, ids = len(allowed.ids), allowed.vectors, allowed.ids
        best: dict[int, float] = {}
        if entries == 0:
            return best
        wanted = min(k, entries)
        fetch = min(k if total == entries else 2 * k, total)
        while True:
            scores, found = self.entries.search(vector[None, :], fetch, ids)
            best = {}
            for rowid, score in zip(found[0].tolist(), scores[0].tolist(), strict=True):
                if rowid >= 0 and rowid not in best:
                    best[rowid] = score
            if len(best) >= wanted or fetch >= total:
                return best
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
        order = np.argsort(-combined, kind="stable")
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
        rule = None if words is not None else self.rule  # a rule is refused outside dense (``mode``)
        wide = max(k, NEIGHBOURS) if rule and rule.reads_neighbours else k
        texts: dict[int, float] | None = None if rule is None else {}  # own-text cosines, for the rule
        if group_by is None:
            best = self._nearest(vector, wide, allowed, texts, words)
            with self.reading() as catalog:
                rows = catalog.rows(list(best))
            heads, others = list(range(min(k, len(best)))), None
        else:
            best, heads, others = self._grouped(vector, k, wide, allowed, group_by, texts, words)
            with self.reading() as catalog:
                rows = catalog.rows([list(best)[i] for i in heads])
        ranked = list(best.items())
        top = [ranked[i] for i in heads]
        confidence: list[float | None] = [None] * len(top)
        if rule is not None and texts is not None and top:
            near = self._neighbourhood(dict(ranked[: max(wide, heads[-1] + 1)]), texts)
            # a hit is measured against the query's whole neighbourhood: a filter never changes it
            whole = near
            if allowed is not None and rule.reads_neighbours:
                unfiltered: dict[int, float] = {}
                whole = self._neighbourhood(self._nearest(vector, wide, None, unfiltered), unfiltered)
            features = whole.features_of(near.scores[heads], [near.groups[i] for i in heads], near.own[heads])
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
        texts: dict[int, float] | None = None,
        words: Words | None = None,
    ) -> tuple[dict[int, float], list[int], list[int]]:
        """The nearest entries (row id -> score, best first, at least ``wanted``), the positions
        in them of the best entry of each of the k best groups, and how many other entries (the
        filter admits) each of those groups holds. An entry without a value is a group of its
        own. The search widens until k groups are found or none is left: at most the whole
        index, like a filter that admits few entries. ``texts``: as ``_nearest``."""
        within = None if allowed is None else allowed.ids.tolist()
        with self.reading() as catalog:
            available = catalog.group_count(group_by, within)
        fetch = max(wanted, 4 * k)
        while True:
            found = self._nearest(vector, fetch, allowed, texts, words)
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
