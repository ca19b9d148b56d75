"""A version's vectors as a base index plus small immutable segments, searched as one index.

Why: an ``add`` or ``delete`` must cost the change, not the index (a 10-row add to a 1M-vector
index used to rewrite ~1.5 GB). So inside a version an update writes its new vectors as one new
flat segment file (``segment-<generation>.faiss``) and records tombstones; the manifest (which
segments are live, the generation) lives in the version's SQLite ``meta`` table and is committed
in the same transaction as the rows and tombstones: one atomic swap, as in Lucene or LanceDB.

A tombstone ``(row id, generation)`` hides that row's vectors (text and also-vectors) in every
part older than its generation: the base is generation 0, a segment the generation that wrote
it. An upsert that re-embeds an entry keeps its row id: its old vectors are hidden, the new ones
(in the new, younger segment) stay live. ``compact`` (or the merge policy, ``store``) folds the
segments into a new base in a new version and drops the tombstones.

``Segments`` is a ``VectorIndex`` (read-only: ``merged`` gives the writable index a new version
starts from): every part is searched with the caller's allowed ids and its own tombstone
exclusion, and the hits are merged by score.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from indexer.vectors.base import PartIndex, WritableIndex
from indexer.vectors.entries import with_also_ids
from indexer.vectors.faiss_index import selector_of

SEGMENT = "segment-{:08d}.faiss"


def segment_name(generation: int) -> str:
    return SEGMENT.format(generation)


@dataclass(frozen=True)
class Manifest:
    """What the ``meta`` table says about a version's vectors: its live segments (generation,
    vector count), the last generation written and how many stored vectors tombstones hide."""

    segments: tuple[tuple[int, int], ...] = ()
    generation: int = 0
    hidden: int = 0

    @classmethod
    def of(cls, meta: dict[str, Any]) -> Manifest:
        return cls(
            tuple((int(g), int(n)) for g, n in meta.get("segments", [])),
            int(meta.get("generation", 0)),
            int(meta.get("hidden", 0)),
        )

    def to_meta(self) -> dict[str, Any]:
        return {
            "segments": [list(s) for s in self.segments],
            "generation": self.generation,
            "hidden": self.hidden,
        }

    @property
    def segment_vectors(self) -> int:
        return sum(n for _, n in self.segments)

    def files(self) -> list[str]:
        return [segment_name(g) for g, _ in self.segments]


def hidden_in(tombstones: np.ndarray, generation: int) -> np.ndarray:
    """Vector ids hidden in a part of ``generation``: rows buried by a younger generation.
    ``tombstones``: (n, 2) int64 rows of (row id, generation)."""
    return with_also_ids(tombstones[tombstones[:, 1] > generation, 0])


class Segments:
    """The base index and the live segments, minus what tombstones hide; ``count``: live vectors."""

    def __init__(self, parts: Sequence[tuple[int, PartIndex]], tombstones: np.ndarray, count: int):
        import faiss

        self.parts = list(parts)  # (generation, index), base first (generation 0)
        self.tombstones = tombstones
        self.count = count
        self.hidden = [hidden_in(tombstones, g) for g, _ in self.parts]
        # FAISS selectors hold raw pointers: keep the inner batches alive beside their negations
        self._batches = [faiss.IDSelectorBatch(h) if len(h) else None for h in self.hidden]
        self._excluded = [None if b is None else faiss.IDSelectorNot(b) for b in self._batches]

    @property
    def live_share(self) -> float:
        """Live vectors over stored ones: what tombstones leave of what a probe scans."""
        return self.count / max(sum(index.count for _, index in self.parts), 1)

    @property
    def base(self) -> PartIndex:
        return self.parts[0][1]

    @property
    def dimension(self) -> int:
        return self.base.dimension

    @property
    def kind(self) -> str:
        return self.base.kind

    @property
    def nprobe(self) -> int | None:
        return self.base.nprobe

    def part_shapes(self) -> list[tuple[int, int]]:
        return [(index.dimension, index.count) for _, index in self.parts]

    def search(
        self, queries: np.ndarray, k: int, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each part searched for k (with the caller's allowed ids and the part's tombstone
        exclusion), then the best k of all merged."""
        import faiss

        wanted = selector_of(allowed)
        scores, ids = [], []
        for (_, index), excluded in zip(self.parts, self._excluded, strict=True):
            selector = excluded if wanted is None else wanted
            if wanted is not None and excluded is not None:
                selector = faiss.IDSelectorAnd(wanted, excluded)
            found_scores, found_ids = index.search_selected(
                queries,
                min(k, max(index.count, 1)),
                selector,
                filtered=wanted is not None,
                live_share=self.live_share,
            )
            scores.append(np.where(found_ids >= 0, found_scores, -np.inf))
            ids.append(found_ids)
        all_scores, all_ids = np.concatenate(scores, axis=1), np.concatenate(ids, axis=1)
        order = np.argsort(-all_scores, axis=1, kind="stable")[:, :k]
        best_scores = np.take_along_axis(all_scores, order, axis=1)
        best_ids = np.take_along_axis(all_ids, order, axis=1)
        best_ids[~np.isfinite(best_scores)] = -1
        if best_ids.shape[1] < k:  # fewer stored than asked: pad as FAISS does
            pad = k - best_ids.shape[1]
            best_scores = np.pad(best_scores, ((0, 0), (0, pad)), constant_values=-np.inf)
            best_ids = np.pad(best_ids, ((0, 0), (0, pad)), constant_values=-1)
        return best_scores.astype(np.float32), best_ids

    def stored(self) -> tuple[np.ndarray, np.ndarray]:
        """The live vectors of every part (as stored) and their ids."""
        vectors, ids = [], []
        for (_, index), hidden in zip(self.parts, self.hidden, strict=True):
            part_vectors, part_ids = index.stored()
            live = ~np.isin(part_ids, hidden)
            vectors.append(part_vectors[live])
            ids.append(part_ids[live])
        return np.concatenate(vectors), np.concatenate(ids)

    def merged(self) -> WritableIndex:
        """The base with the hidden vectors removed and the segments' live vectors added: the
        index a compaction starts from (the base must have been read with ``mmap=False``)."""
        base = self.base
        if len(self.hidden[0]):
            base.remove(self.hidden[0])
        for (_, index), hidden in zip(self.parts[1:], self.hidden[1:], strict=True):
            vectors, ids = index.stored()
            live = ~np.isin(ids, hidden)
            if live.any():
                base.add(np.ascontiguousarray(vectors[live]), ids[live])
        return base
