"""``pq`` storage (``Reranked``): product-quantised codes (``PQ_BYTES`` bytes a vector; IVF-PQ for
kind ivf, one list for flat, i.e. every code scanned) are all that is held in memory; a search
takes ``RERANK`` x k candidates from them and scores those exactly against the full float32
vectors, which stay on disk beside the index (``full-vectors.npy``, memory-mapped: only the
candidates' pages are read). Rebuilds start from those full vectors, so pq loses nothing to
re-encoding. docs/scaling.md has the figures.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from indexer.vectors.base import Parts
from indexer.vectors.faiss_index import OneIndex, parameters
from indexer.vectors.files import mapped
from indexer.vectors.tuning import list_count, rows_at, tune_nprobe_parts

if TYPE_CHECKING:
    import numpy as np

PQ_BYTES = 48
"""Bytes of code per vector (sub-quantisers of 8 bits): 384 dims -> 8 dims a sub-quantiser. At
100k vectors 32 bytes plateaued at recall@10 0.96 on the tuning probes, 48 reached 0.97 at 32 of
316 lists; with ids, 56 bytes resident a vector."""
RERANK = 10
RERANK_MIN = 200
"""Candidates scored exactly per search: ``max(RERANK * k, RERANK_MIN)``."""
FULL_VECTORS = "full-vectors.npy"
FULL_IDS = "full-ids.npy"


class Reranked(OneIndex):
    """``pq`` storage (see module doc) as a ``WritableIndex``, one hit per id (its best vector).

    ``vectors``/``ids``: the full vectors sorted by id, memory-mapped once written; changes made
    since (``add``, ``remove``) are kept apart until ``write``."""

    SIDE_FILES = (FULL_VECTORS, FULL_IDS)

    def __init__(self, codes: Any, vectors: np.ndarray, ids: np.ndarray):
        import numpy as np

        self.codes, self.vectors, self.ids = codes, vectors, ids
        self.removed = np.zeros(0, dtype=np.int64)
        self.added_vectors = np.zeros((0, codes.d), dtype=np.float32)
        self.added_ids = np.zeros(0, dtype=np.int64)

    @classmethod
    def build(
        cls, parts: Parts, n: int, dimension: int, kind: str, storage: str, directory: Path | None = None
    ) -> Reranked:
        """Codes trained on a sample of the parts; the full vectors, sorted by id, written into
        ``directory`` as the parts come (so a build holds a sample, the ids and the codes, never
        the corpus' vectors), or kept in memory without one."""
        import faiss
        import numpy as np

        subquantizers = max(m for m in range(1, PQ_BYTES + 1) if dimension % m == 0)
        bits = int(
            np.clip(np.log2(max(n, 2)) - 2, 3, 8)
        )  # >= 4 training vectors a centroid (FAISS: >= 8 centroids)
        inner = faiss.METRIC_INNER_PRODUCT
        rng = np.random.default_rng(0)
        # "flat": one list, i.e. every code scanned (IndexPQ itself takes no filter, IndexIVFPQ does)
        nlist = 1 if kind == "flat" else list_count(n)
        codes = faiss.IndexIVFPQ(faiss.IndexFlatIP(dimension), dimension, nlist, subquantizers, bits, inner)
        sample = min(n, max(64 * nlist, 256 * 64))
        product = codes.pq
        product.cp.min_points_per_centroid = 1  # a small index trains on what it has, without warnings
        training, _ = rows_at(parts, np.sort(rng.choice(n, size=sample, replace=False)))
        if sample < 2**bits:  # a tiny index repeats its few
            training = np.resize(training, (2**bits, dimension))
        codes.train(training)
        del training
        ids = np.concatenate([part_ids for _, part_ids in parts()])  # an --also build's are not sorted
        order = np.argsort(ids, kind="stable")
        slot = np.empty_like(order)
        slot[order] = np.arange(n)
        if directory is None:
            full = np.empty((n, dimension), dtype=np.float32)
        else:
            full = np.lib.format.open_memmap(
                directory / FULL_VECTORS, mode="w+", dtype=np.float32, shape=(n, dimension)
            )
        start = 0
        for vectors, part_ids in parts():
            codes.add_with_ids(vectors, part_ids)
            full[slot[start : start + len(vectors)]] = vectors
            start += len(vectors)
        index = cls(codes, full, ids[order])
        if kind == "ivf":
            index.nprobe = tune_nprobe_parts(index, parts, n)
        return index

    @classmethod
    def read(cls, path: Path, *, mmap: bool = True) -> Reranked:
        """The codes in memory, the full vectors memory-mapped whatever ``mmap`` says (changes are
        kept apart until ``write``)."""
        import faiss

        return cls(
            faiss.read_index(str(path)), mapped(path.parent / FULL_VECTORS), mapped(path.parent / FULL_IDS)
        )

    def write(self, path: Path) -> None:
        """The codes to ``path``, the full vectors (sorted by id) beside it, in slices."""
        import faiss
        import numpy as np

        faiss.write_index(self.codes, str(path))
        if self._written_to(path.parent / FULL_VECTORS):
            self.vectors.flush()
            np.save(path.parent / FULL_IDS, self.ids)
            return
        kept = np.flatnonzero(~np.isin(self.ids, self.removed))
        ids = np.concatenate([self.ids[kept], self.added_ids])
        order = np.argsort(ids, kind="stable")
        out = np.lib.format.open_memmap(
            path.parent / FULL_VECTORS, mode="w+", dtype=np.float32, shape=(len(ids), self.codes.d)
        )
        for start in range(0, len(ids), 65_536):
            rows = order[start : start + 65_536]
            old = rows < len(kept)
            out[start : start + len(rows)][old] = self.vectors[kept[rows[old]]]
            out[start : start + len(rows)][~old] = self.added_vectors[rows[~old] - len(kept)]
        out.flush()
        del out
        np.save(path.parent / FULL_IDS, ids[order])

    def _written_to(self, target: Path) -> bool:
        """Whether the full vectors are already ``target`` as they should be (a build streamed
        them there and nothing changed since)."""
        import numpy as np

        return (
            isinstance(self.vectors, np.memmap)
            and Path(self.vectors.filename).resolve() == target.resolve()
            and not len(self.removed)
            and not len(self.added_ids)
        )

    @property
    def count(self) -> int:
        return self.codes.ntotal

    @property
    def dimension(self) -> int:
        return self.codes.d

    @property
    def kind(self) -> str:
        return "ivf" if self.nlist > 1 else "flat"

    @property
    def nlist(self) -> int:
        return self.codes.nlist

    @property
    def nprobe(self) -> int:
        return self.codes.nprobe

    @nprobe.setter
    def nprobe(self, value: int) -> None:
        self.codes.nprobe = value

    def add(self, vectors: np.ndarray, ids: np.ndarray) -> None:
        import numpy as np

        self.codes.add_with_ids(vectors, ids)
        self.added_vectors = np.concatenate([self.added_vectors, vectors])
        self.added_ids = np.concatenate([self.added_ids, ids])

    def remove(self, ids: np.ndarray) -> int:
        import numpy as np

        ids = np.asarray(ids, dtype=np.int64)
        removed = self.codes.remove_ids(ids)
        self.removed = np.union1d(self.removed, ids)
        keep = ~np.isin(self.added_ids, ids)
        self.added_vectors, self.added_ids = self.added_vectors[keep], self.added_ids[keep]
        return removed

    def full(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The full vectors of these ids (all of each id's vectors) and the id of each row."""
        import numpy as np

        ids = ids[~np.isin(ids, self.removed)]
        start, stop = np.searchsorted(self.ids, ids, "left"), np.searchsorted(self.ids, ids, "right")
        rows = np.concatenate([np.arange(a, b) for a, b in zip(start, stop, strict=True)] or [[]]).astype(int)
        rows.sort()  # the memory map is read in file order
        extra = np.isin(self.added_ids, ids)
        return (
            np.concatenate([self.vectors[rows], self.added_vectors[extra]]),
            np.concatenate([self.ids[rows], self.added_ids[extra]]),
        )

    def stored(self) -> tuple[np.ndarray, np.ndarray]:
        import numpy as np

        kept = ~np.isin(self.ids, self.removed)
        return (
            np.concatenate([self.vectors[kept], self.added_vectors]),
            np.concatenate([self.ids[kept], self.added_ids]),
        )

    def search_selected(
        self, queries: np.ndarray, k: int, selector: Any, *, filtered: bool = True, live_share: float = 1.0
    ) -> tuple[np.ndarray, np.ndarray]:
        """Candidates from the codes (``faiss_index.parameters``), then exact cosines from the full
        vectors: the best vector of each candidate id gives its score."""
        import numpy as np

        params = parameters(self.codes, selector, filtered, live_share)
        _, candidates = self.codes.search(queries, max(RERANK * k, RERANK_MIN), params=params)
        scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
        found = np.full((len(queries), k), -1, dtype=np.int64)
        for q, (query, row) in enumerate(zip(queries, candidates, strict=True)):
            vectors, owners = self.full(np.unique(row[row >= 0]))
            exact = vectors @ query
            best = np.argsort(-exact, kind="stable")
            _, first = np.unique(owners[best], return_index=True)
            top = best[np.sort(first)][:k]
            scores[q, : len(top)], found[q, : len(top)] = exact[top], owners[top]
        return scores, found
