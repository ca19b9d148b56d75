"""One complete version of an index and the encoding its questions embed with: what a request
searches from start to end (``SearchEngine`` hands one out and renews it when a new version is
live). Every search, a study's included, is a ``Plan`` (``Snapshot.plan``: its checks and its one
mode rule) run on it (``Snapshot.run``, ``Snapshot.neighbourhoods``; the ranking itself:
``search.read.lookup``)."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from indexer.catalog import RESERVED, Catalog, Facet, OperationalError
from indexer.embedding.fields import FieldScoring
from indexer.errors import BadInput, IndexMoved
from indexer.progress import Share
from indexer.reading.corpus import spelled
from indexer.store import StoredIndex
from search.read.confidence import (
    Neighbourhood,
    Rule,
    Scale,
    check_min_score,
    in_force,
    rule_key,
    score_kind,
    score_scale,
    stored_form,
    stored_rules,
)
from search.read.encoding import Encoding
from search.read.filters import parse_filter
from search.read.hybrid import (
    DEFAULT_MODE,
    DENSE,
    KEYWORD,
    MODES,
    WEIGHTLESS,
    Words,
    check_mode,
    stored_weight,
    weightless,
)
from search.read.lookup import Lookup
from search.read.requests import Allowed, Hit, SearchRequest, check_queries
from search.read.reranked import Reranking
from search.read.unloaded import Unloaded

if TYPE_CHECKING:
    from indexer.encoders.rerankers import Reranker


@dataclass(frozen=True)
class Plan:
    """One search request, resolved once (``Snapshot.plan``): the request, the mode
    (``search.read.hybrid.MODES``) it runs in and its rerank stage (its reranker loaded, or None)."""

    request: SearchRequest
    mode: str
    reranking: Reranking | None = field(default=None, compare=False)

    @property
    def reranker(self) -> Reranker | None:
        return None if self.reranking is None else self.reranking.reranker

    @property
    def queries(self) -> tuple[str, ...]:
        return self.request.queries

    @property
    def k(self) -> int:
        return self.request.k

    @property
    def where(self) -> str | None:
        return self.request.where

    @property
    def min_score(self) -> float | None:
        return self.request.min_score

    @property
    def group_by(self) -> str | None:
        return self.request.group_by

    @property
    def score(self) -> str:
        """The score its hits show (``search.read.confidence.score_kind``): the first stage's or
        its reranker's."""
        return score_kind(None if self.reranker is None else self.reranker.folder.fingerprint)

    @property
    def key(self) -> str:
        """The key of the no-answer rule that marks its hits (``search.read.confidence.rule_key``)."""
        return rule_key(self.mode, self.score)

    @property
    def scale(self) -> Scale:
        """The range of the scores its hits show, which a min score must be in (``scale_of``)."""
        return scale_of(self.reranking)


def scale_of(reranking: Reranking | None) -> Scale:
    """The range of the scores a search reranked by ``reranking`` shows (None: not reranked)
    (``search.read.confidence.score_scale``): the first stage's, or its reranker's fused."""
    if reranking is None:
        return score_scale()
    return score_scale(reranking.reranker.folder.activation, reranking.fused_at)


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
            embedder = self.encoding.embedder
            status = embedder.status if isinstance(embedder, Unloaded) else embedder.decision.status
            facts = self.index.info(status)
        return {**facts, "calibration": stored_form(self.stored) or None, "default_mode": self.searched}

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
        asked: SearchRequest | Sequence[str],
        k: int | None = None,
        *,
        fitting: bool = False,
        reranker: Reranker | None = None,
        **fields: Any,
    ) -> Plan:
        """One search request checked and its mode resolved (``mode``), before anything is
        embedded: ``asked`` a ``SearchRequest``, or its queries with ``k`` and its other fields
        as keywords. A request naming a reranker (``rerank``) runs with ``reranker`` where given
        (the engine's, loaded once), else one loaded here, fused at the weight it asks, else the one
        this index fitted for it, else its folder's (``search.read.reranked.RerankOptions.stage``).
        ``fitting``: the questions a no-answer rule is fitted on (``search.studies.calibration``)."""
        if isinstance(asked, SearchRequest):
            request = (
                asked if k is None and not fields else replace(asked, **fields, k=asked.k if k is None else k)
            )
        else:
            request = SearchRequest(tuple(asked), 10 if k is None else k, **fields)
        request.checked()
        rerank = request.rerank
        reranking = None if rerank is None else rerank.stage(request.k, reranker=reranker, meta=self.meta)
        check_min_score(request.min_score, scale_of(reranking))
        score = score_kind(None if reranking is None else reranking.reranker.folder.fingerprint)
        return Plan(request, self.mode(request.mode, fitting=fitting, score=score), reranking)

    def run(self, plan: Plan, vectors: np.ndarray) -> list[list[Hit]]:
        """``plan`` on this version, its queries embedded as ``vectors``: among the entries its
        filter allows, the best per value of its grouping, in its mode, reranked by its
        reranker, marked by the rule of that mode and score or its minimum score
        (``search.read.lookup``). What every search runs (``SearchEngine.answer``, ``evaluate``)."""
        allowed, grouping = self.allowed(plan.where), self.grouping(plan.group_by)
        said = self.said(plan.queries, plan.mode)
        return self._lookup().hits(
            vectors, plan.queries, plan.k, allowed, plan.min_score, grouping, said, plan.reranking, plan.key
        )

    def reads_vectors(self, plan: Plan) -> bool:
        """Whether ``run`` reads the vectors of ``plan``'s queries: in every mode but keyword, and
        in keyword mode where a no-answer rule reads their cosines beside the hits."""
        return plan.mode != KEYWORD or plan.key in self.rules

    def neighbourhoods(self, plan: Plan, vectors: np.ndarray) -> list[Neighbourhood]:
        """Each of ``plan``'s queries (embedded as ``vectors``): its nearest ``plan.k`` entries
        its filter allows, ranked in its mode (and by its reranker: the first stage's best
        ``max(k, depth)`` reranked, the first k of them), with what a confidence is computed from
        (``search.read.confidence``): what a no-answer rule is fitted on."""
        said = self.said(plan.queries, plan.mode)
        allowed = self.allowed(plan.where)
        return self._lookup().neighbourhoods(vectors, allowed, plan.k, said, plan.queries, plan.reranking)

    @functools.cached_property
    def keywords(self) -> bool:
        """Whether this version keeps the keyword table (one written before it does not)."""
        with self.catalog() as catalog:
            return catalog.has_keywords()

    @property
    def default_mode(self) -> str:
        """``DEFAULT_MODE``, or dense where the index has no keyword table."""
        return DEFAULT_MODE if self.keywords else DENSE

    def serves(self, mode: str) -> str:
        """``mode`` if the index can search in it; else one line saying why not."""
        if check_mode(mode) != DENSE and not self.keywords:
            raise BadInput(
                f"mode {mode}: this index was written before keyword search; its next version"
                " (add, delete or compact) keeps the keyword table"
            )
        return mode

    @property
    def searched(self) -> str:
        """The mode a search runs in when none is asked (``steered``, its score the first stage's)."""
        return self.steered()

    def steered(self, score: str = "") -> str:
        """The mode a search showing ``score`` (``search.read.confidence.score_kind``) runs in when
        none is asked: ``default_mode``, unless the index has no-answer rules for that score and
        none for it: then the first mode (``MODES``) it has one for."""
        ruled = [mode for mode in MODES if rule_key(mode, score) in self.rules]
        if not ruled or self.default_mode in ruled:
            return self.default_mode
        return ruled[0]

    def mode(self, asked: str | None, *, fitting: bool = False, score: str = "") -> str:
        """The mode a search runs in: the one asked for, else ``steered`` for its ``score``; a rule
        being fitted (``fitting``) serves ``default_mode`` when none is asked. A mode the index
        cannot serve is refused in one line; one a calibrated index has no rule for answers, its
        hits unmarked (``search.read.confidence.unruled`` says so)."""
        if asked:
            return self.serves(asked)
        return self.default_mode if fitting else self.steered(score)

    def keyword_notes(self, queries: Sequence[str], mode: str | None) -> list[str | None]:
        """One line per query where a search in ``mode`` (None: ``searched``) shows keyword scores
        that are all 0 because no word of the query weighs anything (``WEIGHTLESS``); None for
        the others, and in every mode but keyword."""
        if self.mode(mode) != KEYWORD:
            return [None] * len(queries)
        with self.reading() as catalog:
            return [WEIGHTLESS if weightless(catalog, Words(query, KEYWORD)) else None for query in queries]

    def said(self, queries: Sequence[str], mode: str) -> list[Words] | None:
        """Each query's keyword side in ``mode``, a mode already resolved (None: dense)."""
        if mode == DENSE:
            return None
        weight = stored_weight(self.meta)
        return [Words(query, mode, weight) for query in queries]

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
        """The no-answer rules ``calibrate`` stored in this version that a search applies, by the
        mode each answers in (``search.read.confidence.in_force``)."""
        return in_force(self.stored)

    @functools.cached_property
    def stored(self) -> dict[str, Rule]:
        """Every no-answer rule ``calibrate`` stored in this version, by mode, those not applied too."""
        return stored_rules(self.meta.get("calibration"))

    @property
    def stale(self) -> list[str]:
        """The modes whose stored rule is not applied (``search.read.confidence.Rule.stale``)."""
        return [mode for mode in self.stored if mode not in self.rules]

    @functools.cached_property
    def scoring(self) -> FieldScoring | None:
        """The second vector per entry this version scores with (``indexer.embedding.fields``), if any."""
        return FieldScoring.from_source(self.meta.get("source", {}))

    def _lookup(self) -> Lookup:
        """The ranking of this version's entries (``search.read.lookup``), its rows read at its generation."""
        return Lookup(self.index, self.reading, self.scoring, self.rules)

    def holding(self, ids: Sequence[str]) -> dict[str, int]:
        """Entry id -> row id of those of ``ids`` the index holds (what a label points at)."""
        with self.reading() as catalog:
            return catalog.rowids(ids)

    def ids(self, rowids: Sequence[int]) -> dict[int, str]:
        """Row id -> entry id of ``rowids``."""
        with self.reading() as catalog:
            return catalog.values(rowids, "_id")

    def largest_group(self) -> int:
        """The most entries one text is held by (a neighbourhood wide enough to see past it)."""
        with self.reading() as catalog:
            return catalog.largest_text_group()

    def texts(self) -> dict[str, str]:
        """Text hash -> text of each distinct text the index holds."""
        with self.reading() as catalog:
            return catalog.texts_by_hash()

    def close(self) -> None:
        """Close the catalog's connection (before a writer publishes the next version) and let go
        of the version (``VersionHold``): one no longer live is removed now, not when Python
        collects this snapshot."""
        with self.db_lock:
            self.index.catalog.close()
        if self.index.hold is not None:
            self.index.hold.release()
