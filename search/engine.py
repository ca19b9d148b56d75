"""question -> vector -> hits, with the index's own stored strategy and the indexer's Embedder."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from indexer.corpus import RESERVED
from indexer.embedding import Embedder
from indexer.errors import BadInput, StrategyConflict
from indexer.store import StoredIndex, live_version, open_index
from indexer.strategy import Strategy
from indexer.transform import Transform
from indexer.vector_index import search_parameters
from search.filters import parse_filter


@dataclass(frozen=True)
class Hit:
    rank: int
    id: str
    score: float
    text: str
    fields: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_queries(queries: Sequence[str]) -> None:
    """An empty query has no meaning to embed: refuse it rather than return arbitrary hits."""
    for query in queries:
        if not isinstance(query, str) or not query.strip():
            raise BadInput("empty query: give some text to search for")


def check_strategy(stored: Strategy, asked: dict[str, Any]) -> None:
    """Queries embed with the stored strategy; asking for another one is an error naming it.

    ``asked`` is a request (it may say ``auto``, or give the model by a relative path): it is
    resolved over the stored strategy and compared with it, the model by its identity.
    """
    if not asked:
        return
    from indexer.models import identified, resolve_strategy

    unidentified = {"model_fingerprint": None} if "model" in asked else {}
    request = resolve_strategy(Strategy.from_dict({**stored.to_dict(), **unidentified, **asked}))
    differing = identified(stored).differences(request)
    if differing:
        raise StrategyConflict(
            f"this index was built with {stored.describe()}; queries always use it "
            f"({', '.join(differing)} differ): rebuild the index to change the strategy"
        )


class SearchEngine:
    """Opens an index once and keeps the model warm; ``search`` is the hot path.

    ``reload_if_changed`` picks up a new version written by ``add``/``delete``/``index`` (the model
    is reloaded only if the strategy changed). Each call works on the version it started with.
    """

    def __init__(self, index_dir: str | Path, *, strategy: dict[str, Any] | None = None):
        import faiss

        # One query at a time gains nothing from FAISS threads, and their OpenMP spin-wait after each
        # search steals the cores torch needs for the next query: measured 10.2 -> 5.2 ms per query.
        faiss.omp_set_num_threads(1)
        self.path = Path(index_dir)
        self.index = open_index(self.path)
        check_strategy(self.index.strategy, strategy or {})
        self.embedder = Embedder(self.index.strategy)

    @property
    def strategy(self) -> Strategy:
        return self.index.strategy

    def reload_if_changed(self) -> bool:
        if live_version(self.path) == self.index.version.name:
            return False
        fresh = open_index(self.path)
        if fresh.strategy != self.index.strategy:
            self.embedder = Embedder(fresh.strategy)
        self.index = fresh
        return True

    def search(self, query: str, k: int = 10, where: str | None = None) -> list[Hit]:
        return self.search_many([query], k, where)[0]

    def search_many(self, queries: Sequence[str], k: int = 10, where: str | None = None) -> list[list[Hit]]:
        """Embed all queries in one pass, then look each up (among the entries ``where`` allows)."""
        index = self.index
        allowed = self.allowed(where, index)
        return self.lookup(self.embed_queries(queries, index), k, allowed, index)

    def embed_queries(self, queries: Sequence[str], index: StoredIndex | None = None) -> np.ndarray:
        check_queries(queries)
        vectors = self.embedder.embed(list(queries))
        return Transform.apply_optional((index or self.index).transform, vectors)

    def allowed(self, where: str | None, index: StoredIndex | None = None) -> Allowed | None:
        """The entries a filter admits, found in SQLite before any vector is compared."""
        if where is None:
            return None
        index = index or self.index
        condition = parse_filter(where, [c for c in index.columns() if c not in RESERVED])
        rows = index.db.execute(
            f"select _rowid, _chunks from entries where {condition.sql}", condition.params
        )
        found = rows.fetchall()
        ids = np.array([r[0] for r in found], dtype=np.int64)
        return Allowed(ids, int(sum(r[1] for r in found)))

    def lookup(
        self, vectors: np.ndarray, k: int, allowed: Allowed | None = None, index: StoredIndex | None = None
    ) -> list[list[Hit]]:
        if k < 1:
            raise BadInput(f"k must be at least 1, not {k}")
        index = index or self.index
        return [self._lookup(vector, k, allowed, index) for vector in vectors]

    def _lookup(self, vector: np.ndarray, k: int, allowed: Allowed | None, index: StoredIndex) -> list[Hit]:
        """Top-k entries; a chunked entry may hold several of the nearest vectors, so widen the
        search until k distinct entries are found (the first, best chunk gives the score)."""
        import faiss

        if allowed is None:
            entries, total, params = index.meta["count"], index.vectors.ntotal, None
        else:
            entries, total = len(allowed.ids), allowed.vectors
            params = search_parameters(index.vectors, faiss.IDSelectorBatch(allowed.ids))
        if entries == 0:
            return []
        wanted = min(k, entries)
        fetch = min(k if total == entries else 2 * k, total)
        while True:
            scores, ids = index.vectors.search(vector[None, :], fetch, params=params)
            best: dict[int, float] = {}
            for rowid, score in zip(ids[0].tolist(), scores[0].tolist(), strict=True):
                if rowid >= 0 and rowid not in best:
                    best[rowid] = score
            if len(best) >= wanted or fetch >= total:
                break
            fetch = min(2 * fetch, total)
        top = list(best.items())[:k]
        rows = index.rows([rowid for rowid, _ in top])
        hits = []
        for rank, (rowid, score) in enumerate(top, 1):
            row = rows[rowid]
            fields = {name: value for name, value in row.items() if name not in RESERVED}
            hits.append(Hit(rank, row["_id"], float(score), row["_text"], fields))
        return hits


@dataclass(frozen=True)
class Allowed:
    """Row ids a filter admits and how many vectors they hold (chunked entries hold several)."""

    ids: np.ndarray
    vectors: int
