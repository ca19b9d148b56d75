"""Entries and their vectors: the one place that knows how a vector's id names its entry.

An entry's text vectors (one per chunk) are stored under its row id (``entries._rowid``), the
vectors of its second text (``indexer.embedding.fields``, ``--also``) under ``row id + ALSO_ID``: one id
space in one index, so ``add``/``delete``/``compact`` keep both sets in step, a search retrieves
candidates from both at once and a filter admits both. ``EntryVectors`` is a version's index
searched per entry: entries' row ids in, entries' row ids out.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from indexer.vectors.base import VectorIndex

ALSO_ID = 1 << 40
"""Id offset of the also-vectors (row ids stay far below it)."""


def vector_ids(rowids: np.ndarray, also: np.ndarray | None) -> np.ndarray:
    """The ids vectors are stored under: the row id, plus ``ALSO_ID`` for an also-vector."""
    rowids = np.asarray(rowids, dtype=np.int64)
    return rowids if also is None else rowids + np.asarray(also, dtype=np.int64) * ALSO_ID


def with_also_ids(rowids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Every id an entry's vectors may have: its row id and its also-vectors' id."""
    rowids = np.asarray(rowids, dtype=np.int64)
    return np.concatenate([rowids, rowids + ALSO_ID])


def row_ids(ids: np.ndarray) -> np.ndarray:
    """The entry (row id) of each vector id: an also-vector's is its entry's. The -1 a search
    pads with (fewer found than asked) stays -1, never a made-up row id that counts as a hit."""
    return np.where(ids < 0, ids, ids % ALSO_ID)


def entry_texts(index: VectorIndex) -> tuple[np.ndarray, np.ndarray]:
    """The stored vectors of the entries' texts (also-vectors aside) and each one's row id."""
    vectors, ids = index.stored()
    texts = ids < ALSO_ID
    return vectors[texts], ids[texts]


class EntryVectors:
    """A version's vectors searched per entry. ``also``: the index holds also-vectors (its
    ``FieldScoring``), so an entry is allowed with both of its vector sets."""

    def __init__(self, index: VectorIndex, also: bool):
        self.index = index
        self.also = also

    def search(
        self, queries: np.ndarray, k: int, rowids: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Scores and row ids of the k best vectors of each query (an entry holds as many of
        them as it has nearest vectors; padded with -inf / -1). ``rowids``: only these entries'
        vectors, found exactly within them."""
        allowed = None if rowids is None else with_also_ids(rowids) if self.also else rowids
        scores, ids = self.index.search(queries, k, allowed)
        return scores, row_ids(ids)

    def both(self, query: np.ndarray, rowids: list[int], held: int) -> tuple[np.ndarray, np.ndarray]:
        """Each entry's best cosine to ``query`` among its text vectors and among its also-vectors
        (-1 where it has none): a search restricted to their ``held`` vectors, so exact."""
        scores, ids = self.index.search(query[None, :], held, with_also_ids(rowids))
        best: dict[int, float] = {}
        for vector_id, score in zip(ids[0].tolist(), scores[0].tolist(), strict=True):
            if vector_id >= 0:
                best.setdefault(vector_id, score)  # best chunk first
        text = np.array([best.get(r, -1.0) for r in rowids])
        also = np.array([best.get(r + ALSO_ID, -1.0) for r in rowids])
        return text, also
