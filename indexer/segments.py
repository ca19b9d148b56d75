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

``Segments`` quacks like a FAISS index for the engine (``search`` with a selector, ``ntotal``,
``d``), like ``vector_index.Reranked`` does: every part is searched with the caller's selector
and its own tombstone exclusion, and the hits are merged by score.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from indexer.fields import with_also_ids

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


def write_segment(path: Path, vectors: np.ndarray, ids: np.ndarray) -> None:
    """A flat exact index of unit vectors (inner product): small, so exact is cheap. The caller
    fsyncs it before committing (``store.append_change``)."""
    import faiss

    index = faiss.IndexIDMap(faiss.IndexFlatIP(vectors.shape[1]))
    index.add_with_ids(np.ascontiguousarray(vectors, dtype=np.float32), np.asarray(ids, dtype=np.int64))
    faiss.write_index(index, str(path))


def hidden_in(tombstones: np.ndarray, generation: int) -> np.ndarray:
    """FAISS ids hidden in a part of ``generation``: rows buried by a younger generation.
    ``tombstones``: (n, 2) int64 rows of (row id, generation)."""
    return with_also_ids(tombstones[tombstones[:, 1] > generation, 0])


class Segments:
    """The base index and the live segments, minus what tombstones hide; ``ntotal``: live vectors."""

    def __init__(self, parts: Sequence[tuple[int, Any]], tombstones: np.ndarray, ntotal: int):
        import faiss

        self.parts = list(parts)  # (generation, index), base first (generation 0)
        self.tombstones = tombstones
        self.ntotal = ntotal
        self.hidden = [hidden_in(tombstones, g) for g, _ in self.parts]
        # FAISS selectors hold raw pointers: keep the inner batches alive beside their negations
        self._batches = [faiss.IDSelectorBatch(h) if len(h) else None for h in self.hidden]
        self._excluded = [None if b is None else faiss.IDSelectorNot(b) for b in self._batches]

    @property
    def live_share(self) -> float:
        """Live vectors over stored ones: what tombstones leave of what a probe scans."""
        return self.ntotal / max(sum(index.ntotal for _, index in self.parts), 1)

    @property
    def base(self) -> Any:
        return self.parts[0][1]

    @property
    def d(self) -> int:
        return self.base.d

    @property
    def nprobe(self) -> int | None:
        return getattr(self.base, "nprobe", None)

    def search(self, queries: np.ndarray, k: int, params: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """Each part searched for k (with the caller's selector, ``params.sel``, and the part's
        tombstone exclusion), then the best k of all merged."""
        import faiss

        from indexer.vector_index import search_parameters

        wanted = None if params is None else params.sel
        scores, ids = [], []
        for (_, index), excluded in zip(self.parts, self._excluded, strict=True):
            if wanted is not None and excluded is not None:
                selector = faiss.IDSelectorAnd(wanted, excluded)
                part_params = search_parameters(index, selector)
            elif wanted is not None:
                part_params = search_parameters(index, wanted)
            elif excluded is not None:
                part_params = _exclusion_parameters(index, excluded, self.live_share)
            else:
                part_params = None
            found_scores, found_ids = index.search(queries, min(k, max(index.ntotal, 1)), params=part_params)
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
        from indexer.vector_index import stored_vectors

        vectors, ids = [], []
        for (_, index), hidden in zip(self.parts, self.hidden, strict=True):
            part_vectors, part_ids = stored_vectors(index)
            live = ~np.isin(part_ids, hidden)
            vectors.append(part_vectors[live])
            ids.append(part_ids[live])
        return np.concatenate(vectors), np.concatenate(ids)

    def merged(self) -> Any:
        """The base with the hidden vectors removed and the segments' live vectors added: the
        index a compaction starts from (the base must have been read with ``mmap=False``)."""
        from indexer.vector_index import stored_vectors

        base = self.base
        if len(self.hidden[0]):
            base.remove_ids(self.hidden[0])
        for (_, index), hidden in zip(self.parts[1:], self.hidden[1:], strict=True):
            vectors, ids = stored_vectors(index)
            live = ~np.isin(ids, hidden)
            if live.any():
                base.add_with_ids(np.ascontiguousarray(vectors[live]), ids[live])
        return base


def _exclusion_parameters(index: Any, excluded: Any, live_share: float) -> Any:
    """Tombstones alone: an IVF part probes its tuned count of lists, widened by the share of
    buried vectors (a probe finds that much less), rather than every list as a filter does."""
    import math

    import faiss

    from indexer.vector_index import Reranked

    probed = index.codes if isinstance(index, Reranked) else index
    if isinstance(probed, faiss.IndexIVF):
        nprobe = min(probed.nlist, math.ceil(probed.nprobe / max(live_share, 1e-9)))
        return faiss.SearchParametersIVF(sel=excluded, nprobe=nprobe)
    return faiss.SearchParameters(sel=excluded)


def open_vectors(
    version: Path,
    base_file: str,
    manifest: Manifest,
    tombstones: np.ndarray,
    ntotal: int,
    *,
    mmap: bool,
    storage: str = "float32",
) -> Any:
    """The base index alone when nothing is segmented or buried (the common, compacted case),
    else ``Segments``. Segments are small flat files: read whole."""
    import faiss

    from indexer.vector_index import read_vectors

    base = read_vectors(version / base_file, mmap=mmap, storage=storage)
    if not manifest.segments and not len(tombstones):
        return base
    parts = [(0, base)] + [
        (g, faiss.read_index(str(version / segment_name(g)))) for g, _ in manifest.segments
    ]
    return Segments(parts, tombstones, ntotal)
