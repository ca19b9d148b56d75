"""question -> vector -> hits, with the index's own stored strategy and the indexer's Embedder."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from indexer.corpus import RESERVED
from indexer.embedding import Embedder
from indexer.errors import SemsearchError
from indexer.store import open_index
from indexer.strategy import Strategy


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
            raise SemsearchError("empty query: give some text to search for")


def check_strategy(stored: Strategy, asked: dict[str, Any]) -> None:
    """Queries embed with the stored strategy; asking for another one is an error naming it."""
    differing = stored.conflicts(asked)
    if differing:
        raise SemsearchError(
            f"this index was built with {stored.describe()}; queries always use it "
            f"({', '.join(differing)} differ): rebuild the index to change the strategy"
        )


class SearchEngine:
    """Opens an index once and keeps the model warm; ``search`` is the hot path."""

    def __init__(self, index_dir: str | Path, *, strategy: dict[str, Any] | None = None):
        self.index = open_index(index_dir)
        check_strategy(self.index.strategy, strategy or {})
        self.embedder = Embedder(self.index.strategy)

    @property
    def strategy(self) -> Strategy:
        return self.index.strategy

    def search(self, query: str, k: int = 10) -> list[Hit]:
        return self.search_many([query], k)[0]

    def search_many(self, queries: Sequence[str], k: int = 10) -> list[list[Hit]]:
        """Embed all queries in one pass, then look each up."""
        check_queries(queries)
        if k < 1:
            raise SemsearchError(f"k must be at least 1, not {k}")
        vectors = self.embedder.embed(list(queries))
        if self.index.transform is not None:
            vectors = self.index.transform.apply(vectors)
        return [self._lookup(vector, k) for vector in vectors]

    def _lookup(self, vector: np.ndarray, k: int) -> list[Hit]:
        """Top-k entries; a chunked entry may hold several of the nearest vectors, so widen the
        search until k distinct entries are found (the first, best chunk gives the score)."""
        total = self.index.vectors.ntotal
        wanted = min(k, self.index.meta["count"])
        fetch = min(k if total == self.index.meta["count"] else 2 * k, total)
        while True:
            scores, ids = self.index.vectors.search(vector[None, :], fetch)
            best: dict[int, float] = {}
            for rowid, score in zip(ids[0].tolist(), scores[0].tolist(), strict=True):
                if rowid >= 0 and rowid not in best:
                    best[rowid] = score
            if len(best) >= wanted or fetch >= total:
                break
            fetch = min(2 * fetch, total)
        top = list(best.items())[:k]
        rows = self.index.rows([rowid for rowid, _ in top])
        hits = []
        for rank, (rowid, score) in enumerate(top, 1):
            row = rows[rowid]
            fields = {name: value for name, value in row.items() if name not in RESERVED}
            hits.append(Hit(rank, row["_id"], float(score), row["_text"], fields))
        return hits
