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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from indexer.errors import BadInput

if TYPE_CHECKING:  # numpy loads where vectors are handled, so `semsearch --help` never pays for it
    import numpy as np

EXACT_LIMIT = 30_000
"""Below this many vectors a full scan (IndexFlatIP) takes about 2 ms here: exact it is. (At
100k a single-query scan measured 12.6 ms against 0.2 ms for the tuned IVF, see bench/query.py.)"""
RECALL_TARGET = 0.97
RETUNE_FACTOR = 2.0
KINDS = ("auto", "flat", "ivf")
STORAGES = ("float32", "float16", "sq8")


Parts = Callable[[], Iterable[tuple["np.ndarray", "np.ndarray"]]]
"""A corpus' unit vectors and their ids, in bounded parts; called again for each pass over them."""


def build_vector_index(
    vectors: np.ndarray, ids: np.ndarray, kind: str = "auto", storage: str = "float32"
) -> Any:
    """The index for vectors held in memory (``build_from_parts`` with one part)."""
    return build_from_parts(lambda: [(vectors, ids)], len(vectors), vectors.shape[1], kind, storage)


def build_from_parts(
    parts: Parts, n: int, dimension: int, kind: str = "auto", storage: str = "float32"
) -> Any:
    """The index for ``n`` vectors that come in parts: no copy of them besides the index's own.
    Codes and IVF lists are trained on a fixed random sample (read from the parts), the vectors
    are added part by part, and the IVF probe count is tuned against an exact search that is
    itself run part by part."""
    import faiss
    import numpy as np

    if kind not in KINDS or storage not in STORAGES:
        raise BadInput(f"index kind must be one of {KINDS} and storage one of {STORAGES}")
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
    nlist = int(np.clip(np.sqrt(n), 16, 4096))
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
    """The vectors and ids at ``positions`` (of the concatenated parts), in the order given."""
    import numpy as np

    positions = np.asarray(positions, dtype=np.int64)
    order = np.argsort(positions, kind="stable")
    wanted = positions[order]
    vectors, ids, start = [], [], 0
    for part, part_ids in parts():
        here = wanted[(wanted >= start) & (wanted < start + len(part))] - start
        vectors.append(part[here])
        ids.append(part_ids[here])
        start += len(part)
    picked, picked_ids = np.concatenate(vectors), np.concatenate(ids)
    back = np.empty_like(order)
    back[order] = np.arange(len(order))
    return np.ascontiguousarray(picked[back]), picked_ids[back]


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

    if isinstance(index, faiss.IndexIVF):
        ids = np.concatenate([get_invlist(index.invlists, i)[0] for i in range(index.nlist)])
        index.set_direct_map_type(faiss.DirectMap.Hashtable)
        vectors = index.reconstruct_batch(ids)
        index.set_direct_map_type(faiss.DirectMap.NoMap)  # not written with the index
        return vectors, ids
    return index.index.reconstruct_n(0, index.ntotal), faiss.vector_to_array(index.id_map)


def read_vectors(path: Path, *, mmap: bool) -> Any:
    """Read a vector file, memory-mapped (flat codes too) unless the caller will change it."""
    import faiss

    flags = getattr(faiss, "IO_FLAG_MMAP_IFC", faiss.IO_FLAG_MMAP) if mmap else 0
    return faiss.read_index(str(path), flags)


def write_vectors(index: Any, path: Path) -> None:
    import faiss

    faiss.write_index(index, str(path))


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

    if selector is None:
        return None
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

    return "ivf" if isinstance(index, faiss.IndexIVF) else "flat"
