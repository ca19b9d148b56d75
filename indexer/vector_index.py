"""Which FAISS index holds the vectors, chosen by size: exact search while a full scan is cheap,
an inverted-file index (IVF) above that, with its probe count tuned at build time to reach a
recall target against exact search on the corpus' own vectors.

IVF rather than HNSW: it supports ``remove_ids`` and ``add_with_ids`` (so ``add``/``delete`` work
without rebuilds), it stores the vectors once (memory ~1.0x the raw vectors, HNSW32 ~1.2x), and
it memory-maps. Both kinds search by inner product on unit vectors, i.e. cosine.

Storage: ``float32`` (exact scores), ``float16`` (half the memory, scores to ~1e-3) or ``sq8``
(8-bit scalar quantisation: a quarter of the memory, ranking nearly unchanged; tested for recall).

The kind follows the size as the index changes: ``add`` and ``compact`` call ``refit``, which
rebuilds the index from its own vectors when the size crossed ``EXACT_LIMIT`` (unless the user
forced a kind) or, for IVF, when the size moved by a factor of ``RETUNE_FACTOR`` since the lists
were trained and the probes tuned; ``compact`` also retunes the probes of an IVF index it keeps.
(A rebuild re-encodes float16/sq8 vectors from their decoded values: sq8 recall@10 measured 0.947
before and 0.914 after two rebuilds, hence rebuilds only on such size changes.)

``pq`` (``Reranked``): product-quantised codes (``PQ_BYTES`` bytes a vector; IVF-PQ above
``EXACT_LIMIT``, one list below, i.e. every code scanned) are all that is held in memory; a search
takes ``RERANK`` x k candidates from them and scores those exactly against the full float32
vectors, which stay on disk beside the index (``full-vectors.npy``, memory-mapped: only the
candidates' pages are read). Rebuilds start from those full vectors, so pq loses nothing to
re-encoding. docs/scaling.md has the figures.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from indexer.errors import BadInput

if TYPE_CHECKING:  # numpy loads where vectors are handled, so `semsearch --help` never pays for it
    import numpy as np

EXACT_LIMIT = 30_000
"""Below this many vectors a full scan (IndexFlatIP) takes about 2 ms here: exact it is. (At
100k a single-query scan measured 12.6 ms against 0.2 ms for the tuned IVF, see bench/query.py.)"""
RECALL_TARGET = 0.97
MIN_LISTS = 16
"""Fewest IVF lists (``sqrt(n)`` clipped to 16..4096); k-means needs a vector per list."""
RETUNE_FACTOR = 2.0
KINDS = ("auto", "flat", "ivf")
STORAGES = ("float32", "float16", "sq8", "pq")
PQ_BYTES = 48
"""Bytes of code per vector (sub-quantisers of 8 bits): 384 dims -> 8 dims a sub-quantiser. At
100k vectors 32 bytes plateaued at recall@10 0.96 on the tuning probes, 48 reached 0.97 at 32 of
316 lists; with ids, 56 bytes resident a vector."""
RERANK = 10
RERANK_MIN = 200
"""Candidates scored exactly per search: ``max(RERANK * k, RERANK_MIN)``."""
FULL_VECTORS = "full-vectors.npy"
FULL_IDS = "full-ids.npy"


Parts = Callable[[], Iterable[tuple["np.ndarray", "np.ndarray"]]]
"""A corpus' unit vectors and their ids, in bounded parts; called again for each pass over them."""


def build_vector_index(
    vectors: np.ndarray, ids: np.ndarray, kind: str = "auto", storage: str = "float32"
) -> Any:
    """The index for vectors held in memory (``build_from_parts`` with one part)."""
    return build_from_parts(lambda: [(vectors, ids)], len(vectors), vectors.shape[1], kind, storage)


def build_from_parts(
    parts: Parts,
    n: int,
    dimension: int,
    kind: str = "auto",
    storage: str = "float32",
    directory: Path | None = None,
) -> Any:
    """The index for ``n`` vectors that come in parts: no copy of them besides the index's own.
    Codes and IVF lists are trained on a fixed random sample (read from the parts), the vectors
    are added part by part, and the IVF probe count is tuned against an exact search that is
    itself run part by part. ``directory``: where the index will be written; ``pq`` writes its
    full vectors there as they come (in memory without one)."""
    import faiss
    import numpy as np

    if kind not in KINDS or storage not in STORAGES:
        raise BadInput(f"index kind must be one of {KINDS} and storage one of {STORAGES}")
    if kind == "ivf" and n < MIN_LISTS:
        raise BadInput(
            f"index kind ivf needs at least {MIN_LISTS} vectors to train its lists, this index has {n}: "
            "choose flat or auto"
        )
    if storage == "pq":
        return Reranked.from_parts(parts, n, dimension, wanted_kind(kind, n), directory)
    inner = faiss.METRIC_INNER_PRODUCT
    quantizer_type = {"float16": faiss.ScalarQuantizer.QT_fp16, "sq8": faiss.ScalarQuantizer.QT_8bit}.get(
        storage
    )
    rng = np.random.default_rng(0)
    if kind == "flat" or (kind == "auto" and n < EXACT_LIMIT):
        if quantizer_type is None:
            index = faiss.IndexIDMap(faiss.IndexFlatIP(dimension))
        else:
            codes = faiss.IndexScalarQuantizer(dimension, quantizer_type, inner)
            codes.train(rows_at(parts, rng.choice(n, size=min(n, 100_000), replace=False))[0])
            index = faiss.IndexIDMap(codes)
        _add(index, parts)
        return index
    nlist = int(np.clip(np.sqrt(n), MIN_LISTS, 4096))
    if quantizer_type is None:
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dimension), dimension, nlist, inner)
    else:
        index = faiss.IndexIVFScalarQuantizer(
            faiss.IndexFlatIP(dimension), dimension, nlist, quantizer_type, inner
        )
    index.train(rows_at(parts, rng.choice(n, size=min(n, 64 * nlist), replace=False))[0])
    _add(index, parts)
    index.nprobe = tune_nprobe_parts(index, parts, n)
    return index


def _add(index: Any, parts: Parts) -> None:
    for vectors, ids in parts():
        index.add_with_ids(vectors, ids)


def rows_at(parts: Parts, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The vectors and ids at ``positions`` (of the concatenated parts), in the order given,
    filled in place: a sample costs its own size, not twice or thrice it."""
    import numpy as np

    positions = np.asarray(positions, dtype=np.int64)
    order = np.argsort(positions, kind="stable")
    wanted = positions[order]
    picked = picked_ids = None
    start = 0
    for part, part_ids in parts():
        if picked is None:
            picked = np.empty((len(positions), part.shape[1]), dtype=np.float32)
            picked_ids = np.empty(len(positions), dtype=np.int64)
        inside = (wanted >= start) & (wanted < start + len(part))
        picked[order[inside]] = part[wanted[inside] - start]
        picked_ids[order[inside]] = part_ids[wanted[inside] - start]
        start += len(part)
    if picked is None or start <= (wanted[-1] if len(wanted) else -1):
        raise ValueError(f"positions beyond the {start} vectors of the parts")
    return picked, picked_ids


def wanted_kind(asked: str, vectors: int) -> str:
    """``flat`` or ``ivf``: what the user forced, else by size."""
    if asked in ("flat", "ivf"):
        return asked
    return "flat" if vectors < EXACT_LIMIT else "ivf"


def refit(index: Any, asked: str, storage: str, tuned_for: int, *, retune: bool = False) -> tuple[Any, int]:
    """The index to keep after a change, and the size its lists were trained for: ``index``
    itself while it still fits its size, else one rebuilt from its vectors (see module doc).
    ``retune`` (compact): an IVF index kept as it is gets its probe count tuned again."""
    n = index.ntotal
    kind = wanted_kind(asked, n)
    moved = n > tuned_for * RETUNE_FACTOR or n * RETUNE_FACTOR < tuned_for
    if kind == kind_of(index) and not (kind == "ivf" and moved):
        if kind == "ivf" and retune and n:
            index.nprobe = tune_nprobe(index, *stored_vectors(index))
        return index, tuned_for
    if n == 0 or (kind == "ivf" and n < 64):  # nothing, or too little to train lists on
        return index, tuned_for
    vectors, ids = stored_vectors(index)
    return build_vector_index(vectors, ids, kind, storage), n


def stored_vectors(index: Any) -> tuple[np.ndarray, np.ndarray]:
    """The vectors an index holds (as stored: float16/sq8 come back decoded) and their ids."""
    import faiss
    import numpy as np
    from faiss.contrib.inspect_tools import get_invlist

    from indexer.segments import Segments

    if isinstance(index, (Reranked, Segments)):
        return index.stored()
    if isinstance(index, faiss.IndexIVF):
        ids = np.concatenate([get_invlist(index.invlists, i)[0] for i in range(index.nlist)])
        index.set_direct_map_type(faiss.DirectMap.Hashtable)
        vectors = index.reconstruct_batch(ids)
        index.set_direct_map_type(faiss.DirectMap.NoMap)  # not written with the index
        return vectors, ids
    return index.index.reconstruct_n(0, index.ntotal), faiss.vector_to_array(index.id_map)


def read_vectors(path: Path, *, mmap: bool, storage: str = "float32") -> Any:
    """Read a vector file, memory-mapped (flat codes too) unless the caller will change it. The
    stored ``storage`` decides what it is (``pq``: codes plus the full vectors beside them), never
    which files happen to exist: a pq index without its full vectors is damaged, not smaller."""
    import faiss

    if storage == "pq":
        return Reranked.read(path)
    flags = getattr(faiss, "IO_FLAG_MMAP_IFC", faiss.IO_FLAG_MMAP) if mmap else 0
    return faiss.read_index(str(path), flags)


def write_vectors(index: Any, path: Path) -> None:
    import faiss

    if isinstance(index, Reranked):
        index.write(path)
    else:
        faiss.write_index(index, str(path))


def side_files(storage: str) -> tuple[str, ...]:
    """The files a storage keeps beside ``vectors.faiss``."""
    return (FULL_VECTORS, FULL_IDS) if storage == "pq" else ()


def npy_size(path: Path) -> int:
    """The size a ``.npy`` file must have, from its header alone: header plus shape x item size."""
    import math

    with path.open("rb") as f:
        shape, _, dtype = _npy_header(f)
        return f.tell() + math.prod(shape) * dtype.itemsize


def _npy_header(f: BinaryIO) -> tuple[tuple[int, ...], bool, Any]:
    """Shape, Fortran order and dtype of an open ``.npy`` file, which is left at its data."""
    import numpy as np

    version = np.lib.format.read_magic(f)
    header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    return header(f)


def mapped(path: Path) -> np.ndarray:
    """A read-only view of a ``.npy`` file, memory-mapped for random reads (``MADV_RANDOM``): a
    re-rank's page fault reads that page alone. With the kernel's read-ahead, 300 queries paged in
    the whole 1.5 GB of a 1M-vector file."""
    import mmap

    import numpy as np

    with path.open("rb") as f:
        shape, fortran, dtype = _npy_header(f)
        view = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        view.madvise(mmap.MADV_RANDOM)
        return np.ndarray(shape, dtype, buffer=view, offset=f.tell(), order="F" if fortran else "C")


def tune_nprobe(
    index: Any, vectors: np.ndarray, ids: np.ndarray, target: float = RECALL_TARGET, queries: int = 300
) -> int:
    """``tune_nprobe_parts`` for vectors held in memory."""
    return tune_nprobe_parts(index, lambda: [(vectors, ids)], len(vectors), target, queries)


def tune_nprobe_parts(
    index: Any, parts: Parts, n: int, target: float = RECALL_TARGET, queries: int = 300
) -> int:
    """Smallest probe count whose recall@10 against exact search reaches ``target``, on probe
    queries as far from the corpus as real questions are from their answers: stored vectors
    pushed to cosine ~0.5 of themselves in random directions. (Probes that sit on stored vectors
    find their neighbours in their own cell and make a too-small probe count look good.) The
    exact top 10 is merged over the parts of the corpus."""
    import faiss
    import numpy as np

    rng = np.random.default_rng(1)
    picked, _ = rows_at(parts, rng.choice(n, size=min(queries, n), replace=False))
    noise = rng.normal(size=picked.shape).astype(np.float32)
    noise *= 1.73 / np.linalg.norm(noise, axis=1, keepdims=True)  # |noise| = 1.73: cosine 0.5
    probes = picked + noise
    probes = np.ascontiguousarray(probes / np.linalg.norm(probes, axis=1, keepdims=True), dtype=np.float32)
    heap = faiss.ResultHeap(len(probes), 10, keep_max=True)
    for vectors, ids in parts():
        scores, rows = faiss.knn(probes, vectors, min(10, len(vectors)), metric=faiss.METRIC_INNER_PRODUCT)
        heap.add_result(scores, ids[rows])
    heap.finalize()
    exact = heap.I
    nprobe = 1
    while nprobe < index.nlist:
        index.nprobe = nprobe
        _, found = index.search(probes, 10)
        if recall_at_10(found, exact) >= target:
            return nprobe
        nprobe *= 2
    return index.nlist


def recall_at_10(found: np.ndarray, exact: np.ndarray) -> float:
    """Share of the exact top 10 that the approximate search also returned, averaged."""
    import numpy as np

    return float(
        np.mean([len(set(f) & set(e)) / len(e) for f, e in zip(found.tolist(), exact.tolist(), strict=True)])
    )


def search_parameters(index: Any, selector: Any | None) -> Any | None:
    """Search parameters for a filtered search: an IVF index probes every list then, so a filter
    that keeps few entries still finds k of them (exact within the allowed set)."""
    import faiss

    from indexer.segments import Segments

    if selector is None:
        return None
    if isinstance(index, Segments):  # each part makes its own from the selector
        return faiss.SearchParameters(sel=selector)
    if isinstance(index, Reranked):
        index = index.codes
    if isinstance(index, faiss.IndexIVF):
        return faiss.SearchParametersIVF(sel=selector, nprobe=index.nlist)
    return faiss.SearchParameters(sel=selector)


def shape_meta(index: Any) -> dict[str, Any]:
    """What the index's meta keeps about its vectors, so ``info`` needs no FAISS: the kind, and
    the probe count of an IVF index."""
    kind = kind_of(index)
    return {"vector_kind": kind, **({"nprobe": int(index.nprobe)} if kind == "ivf" else {})}


def stored_shape(path: Path) -> tuple[int, int]:
    """Dimension and vector count of a FAISS index file, from its header alone (no FAISS import):
    every index FAISS writes starts with a four-byte type code, the dimension (int32) and the
    vector count (int64), little-endian."""
    import struct

    with path.open("rb") as f:
        header = f.read(16)
    if len(header) < 16:
        raise ValueError(f"{path.name} is too short to be a FAISS index")
    dimension, count = struct.unpack("<iq", header[4:16])
    return dimension, count


def kind_of(index: Any) -> str:
    import faiss

    from indexer.segments import Segments

    if isinstance(index, Segments):
        return kind_of(index.base)
    if isinstance(index, Reranked):
        return "ivf" if index.nlist > 1 else "flat"
    return "ivf" if isinstance(index, faiss.IndexIVF) else "flat"


class Reranked:
    """``pq`` storage (see module doc): searched like a FAISS index (``search``, ``ntotal``, ``d``,
    ``nprobe``, ``add_with_ids``, ``remove_ids``), ids = row ids, one hit per id (its best vector).

    ``vectors``/``ids``: the full vectors sorted by id, memory-mapped once written; changes made
    since (``add_with_ids``, ``remove_ids``) are kept apart until ``write``."""

    def __init__(self, codes: Any, vectors: np.ndarray, ids: np.ndarray):
        import numpy as np

        self.codes, self.vectors, self.ids = codes, vectors, ids
        self.removed = np.zeros(0, dtype=np.int64)
        self.added_vectors = np.zeros((0, codes.d), dtype=np.float32)
        self.added_ids = np.zeros(0, dtype=np.int64)

    @classmethod
    def from_parts(
        cls, parts: Parts, n: int, dimension: int, kind: str, directory: Path | None = None
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
        nlist = 1 if kind == "flat" else int(np.clip(np.sqrt(n), MIN_LISTS, 4096))
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
    def read(cls, path: Path) -> Reranked:
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
    def ntotal(self) -> int:
        return self.codes.ntotal

    @property
    def d(self) -> int:
        return self.codes.d

    @property
    def nlist(self) -> int:
        return self.codes.nlist

    @property
    def nprobe(self) -> int:
        return self.codes.nprobe

    @nprobe.setter
    def nprobe(self, value: int) -> None:
        self.codes.nprobe = value

    def add_with_ids(self, vectors: np.ndarray, ids: np.ndarray) -> None:
        import numpy as np

        self.codes.add_with_ids(vectors, ids)
        self.added_vectors = np.concatenate([self.added_vectors, vectors])
        self.added_ids = np.concatenate([self.added_ids, ids])

    def remove_ids(self, ids: np.ndarray) -> int:
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

    def search(self, queries: np.ndarray, k: int, params: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """Candidates from the codes, then exact cosines from the full vectors: the best vector of
        each candidate id gives its score."""
        import numpy as np

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
