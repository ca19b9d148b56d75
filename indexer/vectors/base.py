"""What the rest of semsearch may ask of a vector index, whatever holds the vectors.

Ids are the entries' vector ids (``vectors.entries``: the row id, or the also-vector's); vectors
are unit length and every score is an inner product, i.e. a cosine. ``VectorIndex`` is what a
search needs (a ``Segments`` view of a version is one); ``WritableIndex`` adds what a new version
needs (``merged`` gives one); ``PartIndex`` is one read from a file, what ``Segments`` is made of;
``Storage`` is the class of a storage kind, what the factory builds and reads with;
``RangeIndex`` is the range search ``search.read.duplicates`` runs on vectors held in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # numpy loads where vectors are handled, so `semsearch --help` never pays for it
    import numpy as np

Parts = Callable[[], Iterable[tuple["np.ndarray", "np.ndarray"]]]
"""A corpus' unit vectors and their ids, in bounded parts; called again for each pass over them."""


class VectorIndex(Protocol):
    """A version's vectors as searches see them: the engine, ``duplicates`` and the store's
    checks call nothing else, so a storage kind or ANN library is one new implementation."""

    @property
    def dimension(self) -> int: ...

    @property
    def count(self) -> int:
        """Live vectors."""
        ...

    @property
    def kind(self) -> str:
        """``flat`` (every vector scanned) or ``ivf``."""
        ...

    @property
    def nprobe(self) -> int | None: ...

    def search(
        self, queries: np.ndarray, k: int, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Scores and ids of the k best vectors of each query (padded with -inf / -1). ``allowed``:
        only these ids, found exactly within them (an IVF index probes every list then)."""
        ...

    def stored(self) -> tuple[np.ndarray, np.ndarray]:
        """The live vectors (as stored: float16/sq8 come back decoded) and their ids."""
        ...

    def part_shapes(self) -> list[tuple[int, int]]:
        """Dimension and stored vector count of each file read: what an open checks against meta."""
        ...

    def merged(self) -> WritableIndex:
        """One index holding the live vectors: what a new version starts from (read unmapped)."""
        ...


class WritableIndex(VectorIndex, Protocol):
    nprobe: int | None

    @property
    def nlist(self) -> int: ...

    def add(self, vectors: np.ndarray, ids: np.ndarray) -> None: ...

    def remove(self, ids: np.ndarray) -> int: ...

    def write(self, path: Path) -> None:
        """Everything the index needs to ``path`` and the side files its storage names beside it."""
        ...


class PartIndex(WritableIndex, Protocol):
    """An index read from one file (and its side files): a version's base or an update's segment."""

    def search_selected(
        self, queries: np.ndarray, k: int, selector: Any, *, filtered: bool = True, live_share: float = 1.0
    ) -> tuple[np.ndarray, np.ndarray]:
        """``search`` with a FAISS id selector (the caller's filter and the part's tombstones),
        how ``Segments`` searches a part. ``filtered``: the selector holds a filter (an IVF index
        then probes every list); else ``live_share``, the live share of the stored vectors,
        widens its tuned probe count."""
        ...


class Storage(Protocol):
    """A storage kind's class (``factory.IMPLEMENTATIONS``): its library is imported by these
    methods, never when its module is, so opening and ``info`` stay cheap."""

    SIDE_FILES: tuple[str, ...]
    """The files it keeps beside the index file, checked on every open."""

    def build(
        self, parts: Parts, n: int, dimension: int, kind: str, storage: str, directory: Path | None = None
    ) -> PartIndex:
        """``kind`` (``flat`` or ``ivf``) over ``n`` vectors that come in parts; ``directory``:
        where it will be written (a storage may write its side files there as the parts come)."""
        ...

    def read(self, path: Path, *, mmap: bool) -> PartIndex:
        """A written index, memory-mapped unless the caller will change it."""
        ...


class RangeIndex(Protocol):
    """Vectors held in memory, searched by range: each query's vectors above a cosine."""

    def largest_lists(self, count: int) -> int:
        """Vectors in the ``count`` largest lists: the most one query can meet."""
        ...

    def within(self, queries: np.ndarray, min_score: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``lims`` (query i's hits are ``lims[i]:lims[i + 1]``), scores and positions of the
        vectors at cosine >= ``min_score`` among those probed."""
        ...


def shape_of(index: VectorIndex) -> dict[str, Any]:
    """What the index's meta keeps about its vectors, so ``info`` needs no FAISS: the kind, and
    the probe count of an IVF index."""
    return {"vector_kind": index.kind, **({"nprobe": int(index.nprobe or 0)} if index.kind == "ivf" else {})}
