"""Indexes FAISS holds whole: exact search (``IndexFlatIP``, or scalar-quantised codes scanned
in full) while a full scan is cheap, an inverted-file index (IVF) above that, with its probe
count tuned at build time to reach a recall target against exact search on the corpus' own
vectors (``tuning``).

IVF rather than HNSW: it supports ``remove_ids`` and ``add_with_ids`` (so ``add``/``delete`` work
without rebuilds), it stores the vectors once (memory ~1.0x the raw vectors, HNSW32 ~1.2x), and
it memory-maps. Both kinds search by inner product on unit vectors, i.e. cosine.

Storage: ``float32`` (exact scores), ``float16`` (half the memory, scores to ~1e-3) or ``sq8``
(8-bit scalar quantisation: a quarter of the memory, ranking nearly unchanged; tested for recall).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from indexer.vectors.base import Parts
from indexer.vectors.tuning import list_count, rows_at, tune_nprobe_parts

if TYPE_CHECKING:
    import numpy as np


class OneIndex:
    """What an index read from one file (and its side files) does the same way whatever its
    storage: it is its own merge, and a search with allowed ids is a search with their selector
    (``search_selected``, each implementation's own)."""

    dimension: int
    count: int

    def part_shapes(self) -> list[tuple[int, int]]:
        return [(self.dimension, self.count)]

    def merged(self) -> Self:
        return self

    def search(
        self, queries: np.ndarray, k: int, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        return self.search_selected(queries, k, selector_of(allowed))


class FaissIndex(OneIndex):
    """A FAISS index (ids = FAISS ids) as a ``WritableIndex``; ``index``: the FAISS object."""

    SIDE_FILES: tuple[str, ...] = ()

    def __init__(self, index: Any):
        import faiss

        self.index = index
        self._ivf = isinstance(index, faiss.IndexIVF)

    @classmethod
    def build(
        cls, parts: Parts, n: int, dimension: int, kind: str, storage: str, directory: Path | None = None
    ) -> FaissIndex:
        """``kind`` ``flat`` or ``ivf`` for ``n`` vectors that come in parts: codes and lists are
        trained on a fixed random sample, the vectors added part by part."""
        import faiss
        import numpy as np

        inner = faiss.METRIC_INNER_PRODUCT
        quantizer_type = {"float16": faiss.ScalarQuantizer.QT_fp16, "sq8": faiss.ScalarQuantizer.QT_8bit}.get(
            storage
        )
        rng = np.random.default_rng(0)
        if kind == "flat":
            if quantizer_type is None:
                index = faiss.IndexIDMap(faiss.IndexFlatIP(dimension))
            else:
                codes = faiss.IndexScalarQuantizer(dimension, quantizer_type, inner)
                codes.train(rows_at(parts, rng.choice(n, size=min(n, 100_000), replace=False))[0])
                index = faiss.IndexIDMap(codes)
            _add(index, parts)
            return cls(index)
        nlist = list_count(n)
        if quantizer_type is None:
            index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dimension), dimension, nlist, inner)
        else:
            index = faiss.IndexIVFScalarQuantizer(
                faiss.IndexFlatIP(dimension), dimension, nlist, quantizer_type, inner
            )
        index.train(rows_at(parts, rng.choice(n, size=min(n, 64 * nlist), replace=False))[0])
        _add(index, parts)
        index.nprobe = tune_nprobe_parts(index, parts, n)
        return cls(index)

    @classmethod
    def exact(cls, vectors: np.ndarray, ids: np.ndarray) -> FaissIndex:
        """A flat exact index of unit vectors held in memory (an update's segment)."""
        import faiss
        import numpy as np

        index = faiss.IndexIDMap(faiss.IndexFlatIP(vectors.shape[1]))
        index.add_with_ids(np.ascontiguousarray(vectors, dtype=np.float32), np.asarray(ids, dtype=np.int64))
        return cls(index)

    @classmethod
    def read(cls, path: Path, *, mmap: bool) -> FaissIndex:
        """Memory-mapped (flat codes too) unless the caller will change it."""
        import faiss

        flags = getattr(faiss, "IO_FLAG_MMAP_IFC", faiss.IO_FLAG_MMAP) if mmap else 0
        return cls(faiss.read_index(str(path), flags))

    def write(self, path: Path) -> None:
        import faiss

        faiss.write_index(self.index, str(path))

    @property
    def dimension(self) -> int:
        return self.index.d

    @property
    def count(self) -> int:
        return self.index.ntotal

    @property
    def kind(self) -> str:
        return "ivf" if self._ivf else "flat"

    @property
    def nlist(self) -> int:
        return self.index.nlist

    @property
    def nprobe(self) -> int | None:
        return self.index.nprobe if self._ivf else None

    @nprobe.setter
    def nprobe(self, value: int) -> None:
        self.index.nprobe = value

    def add(self, vectors: np.ndarray, ids: np.ndarray) -> None:
        self.index.add_with_ids(vectors, ids)

    def remove(self, ids: np.ndarray) -> int:
        return self.index.remove_ids(ids)

    def stored(self) -> tuple[np.ndarray, np.ndarray]:
        import faiss
        import numpy as np
        from faiss.contrib.inspect_tools import get_invlist

        index = self.index
        if self._ivf:
            ids = np.concatenate([get_invlist(index.invlists, i)[0] for i in range(index.nlist)])
            index.set_direct_map_type(faiss.DirectMap.Hashtable)
            vectors = index.reconstruct_batch(ids)
            index.set_direct_map_type(faiss.DirectMap.NoMap)  # not written with the index
            return vectors, ids
        return index.index.reconstruct_n(0, index.ntotal), faiss.vector_to_array(index.id_map)

    def search_selected(
        self, queries: np.ndarray, k: int, selector: Any, *, filtered: bool = True, live_share: float = 1.0
    ) -> tuple[np.ndarray, np.ndarray]:
        """``search`` with a FAISS id selector (``parameters``): how ``Segments`` searches a part."""
        return self.index.search(queries, k, params=parameters(self.index, selector, filtered, live_share))


def _add(index: Any, parts: Parts) -> None:
    for vectors, ids in parts():
        index.add_with_ids(vectors, ids)


def selector_of(allowed: np.ndarray | None) -> Any:
    """The FAISS selector of a set of ids (None: every id)."""
    import faiss

    return None if allowed is None else faiss.IDSelectorBatch(allowed)


def parameters(index: Any, selector: Any, filtered: bool, live_share: float) -> Any | None:
    """Search parameters of a FAISS index for a selector. A filter (``filtered``): an IVF index
    probes every list, so a filter that keeps few entries still finds k of them (exact within the
    allowed set). Tombstones alone: an IVF index probes its tuned count of lists, widened by the
    share of buried vectors (a probe finds that much less), rather than every list."""
    import faiss

    if selector is None:
        return None
    if not isinstance(index, faiss.IndexIVF):
        return faiss.SearchParameters(sel=selector)
    if filtered:
        return faiss.SearchParametersIVF(sel=selector, nprobe=index.nlist)
    nprobe = min(index.nlist, math.ceil(index.nprobe / max(live_share, 1e-9)))
    return faiss.SearchParametersIVF(sel=selector, nprobe=nprobe)


def unit_length(vectors: np.ndarray) -> None:
    """Scale float32 C-contiguous vectors to unit length, in place."""
    import faiss

    faiss.normalize_L2(vectors)


def single_threaded() -> None:
    """One FAISS (OpenMP) thread for this process (``search.read.engine.configure_threads`` says why)."""
    import faiss

    faiss.omp_set_num_threads(1)


class PairIndex:
    """An IVF index over unit vectors held in memory, for range searches (``search.read.duplicates``):
    ``probes`` lists searched around each query; hits are positions in ``vectors``."""

    def __init__(self, vectors: np.ndarray, probes: int):
        import faiss
        import numpy as np

        n, dimension = vectors.shape
        self.nlist = int(np.sqrt(n))
        self.index = faiss.IndexIVFFlat(
            faiss.IndexFlatIP(dimension), dimension, self.nlist, faiss.METRIC_INNER_PRODUCT
        )
        sample = np.random.default_rng(0).choice(n, size=min(n, 64 * self.nlist), replace=False)
        self.index.train(vectors[sample])
        self.index.nprobe = probes
        self.index.add(vectors)

    def largest_lists(self, count: int) -> int:
        """Vectors in the ``count`` largest lists: the most a query can meet."""
        sizes = sorted((self.index.invlists.list_size(i) for i in range(self.nlist)), reverse=True)
        return sum(sizes[:count])

    def within(self, queries: np.ndarray, min_score: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """FAISS's range search: ``lims`` (each query's hits are ``lims[i]:lims[i + 1]``), scores
        and positions of every vector at cosine >= ``min_score`` in the probed lists."""
        return self.index.range_search(queries, min_score)
