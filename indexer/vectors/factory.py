"""The one place an index is made: built new by kind and storage, or opened by the storage its
version's meta records (never by which files happen to exist: a pq index without its full
vectors is damaged, not smaller); an update's segment (``write_segment``) and the range index of
a duplicates scan (``range_index``) too. ``IMPLEMENTATIONS`` maps each storage to its class.

The kind follows the size as the index changes: ``add`` and ``compact`` call ``refit``, which
rebuilds the index from its own vectors when the size crossed ``EXACT_LIMIT`` (unless the user
forced a kind) or, for IVF, when the size moved by a factor of ``RETUNE_FACTOR`` since the lists
were trained and the probes tuned; ``compact`` also retunes the probes of an IVF index it keeps.
(A rebuild re-encodes float16/sq8 vectors from their decoded values: sq8 recall@10 measured 0.947
before and 0.914 after two rebuilds, hence rebuilds only on such size changes; pq rebuilds from
its full vectors and loses nothing.)
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING

from indexer.errors import BadInput
from indexer.vectors.base import PartIndex, Parts, RangeIndex, Storage, VectorIndex, WritableIndex
from indexer.vectors.tuning import MIN_LISTS, tune_nprobe

if TYPE_CHECKING:
    import numpy as np

    from indexer.vectors.segments import Manifest

EXACT_LIMIT = 30_000
"""Below this many vectors a full scan (IndexFlatIP) takes about 2 ms here: exact it is. (At
100k a single-query scan measured 12.6 ms against 0.2 ms for the tuned IVF, see bench/query.py.)"""
RETUNE_FACTOR = 2.0
KIND = "auto"
"""The ``--index-kind`` default: exact below ``EXACT_LIMIT`` vectors, IVF above."""
KINDS = (KIND, "flat", "ivf")
STORAGE = "float32"
"""The ``--storage`` default: the vectors as the model gives them."""
IMPLEMENTATIONS: dict[str, str] = {
    "float32": "indexer.vectors.faiss_index:FaissIndex",
    "float16": "indexer.vectors.faiss_index:FaissIndex",
    "sq8": "indexer.vectors.faiss_index:FaissIndex",
    "pq": "indexer.vectors.reranked:Reranked",
}
"""Storage -> the class that builds (``build``), reads (``read``) and writes it (``module:Class``,
imported when used: the CLI's option list and ``--help`` load no numpy)."""
STORAGES = tuple(IMPLEMENTATIONS)


def implementation(storage: str) -> Storage:
    """The class of ``storage`` (``IMPLEMENTATIONS``), imported now."""
    module, name = IMPLEMENTATIONS[storage].split(":")
    return getattr(import_module(module), name)


def build_vector_index(
    vectors: np.ndarray, ids: np.ndarray, kind: str = KIND, storage: str = STORAGE
) -> WritableIndex:
    """The index for vectors held in memory (``build_from_parts`` with one part)."""
    return build_from_parts(lambda: [(vectors, ids)], len(vectors), vectors.shape[1], kind, storage)


def build_from_parts(
    parts: Parts,
    n: int,
    dimension: int,
    kind: str = KIND,
    storage: str = STORAGE,
    directory: Path | None = None,
) -> WritableIndex:
    """The index for ``n`` vectors that come in parts: no copy of them besides the index's own.
    Codes and IVF lists are trained on a fixed random sample (read from the parts), the vectors
    are added part by part, and the IVF probe count is tuned against an exact search that is
    itself run part by part. ``directory``: where the index will be written; ``pq`` writes its
    full vectors there as they come (in memory without one)."""
    if kind not in KINDS or storage not in STORAGES:
        raise BadInput(f"index kind must be one of {KINDS} and storage one of {STORAGES}")
    if kind == "ivf" and n < MIN_LISTS:
        raise BadInput(
            f"index kind ivf needs at least {MIN_LISTS} vectors to train its lists, this index has {n}: "
            "choose flat or auto"
        )
    return implementation(storage).build(parts, n, dimension, wanted_kind(kind, n), storage, directory)


def wanted_kind(asked: str, vectors: int) -> str:
    """``flat`` or ``ivf``: what the user forced, else by size."""
    if asked in ("flat", "ivf"):
        return asked
    return "flat" if vectors < EXACT_LIMIT else "ivf"


def refit(
    index: WritableIndex, asked: str, storage: str, tuned_for: int, *, retune: bool = False
) -> tuple[WritableIndex, int]:
    """The index to keep after a change, and the size its lists were trained for: ``index``
    itself while it still fits its size, else one rebuilt from its vectors (see module doc).
    ``retune`` (compact): an IVF index kept as it is gets its probe count tuned again."""
    n = index.count
    kind = wanted_kind(asked, n)
    moved = n > tuned_for * RETUNE_FACTOR or n * RETUNE_FACTOR < tuned_for
    if kind == index.kind and not (kind == "ivf" and moved):
        if kind == "ivf" and retune and n:
            index.nprobe = tune_nprobe(index, *index.stored())
        return index, tuned_for
    if n == 0 or (kind == "ivf" and n < 64):  # nothing, or too little to train lists on
        return index, tuned_for
    vectors, ids = index.stored()
    return build_vector_index(vectors, ids, kind, storage), n


def read_vectors(path: Path, *, mmap: bool, storage: str = STORAGE) -> PartIndex:
    """A stored index file (and its storage's side files), memory-mapped unless the caller will
    change it."""
    return implementation(storage).read(path, mmap=mmap)


def side_files(storage: str) -> tuple[str, ...]:
    """The files a storage keeps beside the index file."""
    return implementation(storage).SIDE_FILES


def write_segment(path: Path, vectors: np.ndarray, ids: np.ndarray) -> None:
    """An update's segment: a flat exact float32 index of unit vectors (small, so exact is cheap).
    The caller fsyncs it before committing (``store.append_change``)."""
    from indexer.vectors.faiss_index import FaissIndex

    FaissIndex.exact(vectors, ids).write(path)


def range_index(vectors: np.ndarray, probes: int) -> RangeIndex:
    """An IVF index over unit vectors held in memory for range searches, ``probes`` lists searched
    around each query; hits are positions in ``vectors`` (``search.read.duplicates``)."""
    from indexer.vectors.faiss_index import PairIndex

    return PairIndex(vectors, probes)


def open_vectors(
    version: Path,
    base_file: str,
    manifest: Manifest,
    tombstones: np.ndarray,
    count: int,
    *,
    mmap: bool,
    storage: str = STORAGE,
) -> VectorIndex:
    """A version's vectors: the base index alone when nothing is segmented or buried (the common,
    compacted case), else ``Segments``. Segments are small flat files: read whole."""
    from indexer.vectors.faiss_index import FaissIndex
    from indexer.vectors.segments import Segments, segment_name

    base = read_vectors(version / base_file, mmap=mmap, storage=storage)
    if not manifest.segments and not len(tombstones):
        return base
    parts = [(0, base)] + [
        (g, FaissIndex.read(version / segment_name(g), mmap=False)) for g, _ in manifest.segments
    ]
    return Segments(parts, tombstones, count)
