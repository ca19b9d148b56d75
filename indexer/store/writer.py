"""A new version written part by part: entries to SQLite, vectors to a spool, then the index.

``with new_version(index_dir, field_types) as version:`` ``add`` the entries and vectors, then
``write`` the version; it is made live on a clean exit (``versions.committing``)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from indexer.catalog import Catalog
from indexer.embedding.strategy import Strategy
from indexer.embedding.transform import Transform
from indexer.errors import BadInput
from indexer.reading.corpus import Entry
from indexer.reading.field_types import detect_types
from indexer.store.held import hold_graph
from indexer.store.integrity import records_ahead
from indexer.store.layout import DATABASE, TRANSFORM, VECTORS
from indexer.store.meta import IndexMeta
from indexer.store.versions import Pending, building, committing
from indexer.vectors import unit_length
from indexer.vectors.base import shape_of
from indexer.vectors.entries import vector_ids
from indexer.vectors.factory import KIND, STORAGE, build_from_parts

PART_ROWS = 8192
"""Vectors read back from the spool at a time (12 MB at 384 dimensions)."""


class VersionWriter:
    """A new version filled part by part: entries go to SQLite as they come (one transaction),
    their raw vectors to a spool file beside it, so neither the texts nor the vectors of the
    whole corpus are ever held in memory. ``write`` builds the vector index from the spool
    (``vectors.factory.build_from_parts``): the index's copy is the only whole one."""

    SPOOL = ".vectors.spool"  # raw float32 vectors; removed before the version is committed
    SPOOL_IDS = ".ids.spool"  # the row id of each (int64)

    def __init__(
        self, pending: Pending, field_types: dict[str, str] | None, keyword_fields: Sequence[str] = ()
    ):
        """``field_types`` None: the catalog is made by ``open_catalog``, before the first ``add``."""
        self.pending = pending
        self.path = pending.path
        self.catalog: Catalog | None = None
        self.keyword_fields: list[str] = []
        if field_types is not None:
            self.open_catalog(field_types, keyword_fields)
        self.entries = 0
        """Entries whose rows are put."""
        self.spooled = 0
        """Entries whose vectors are spooled."""
        self.vectors = 0
        self.dimension: int | None = None
        self._spool = (self.path / self.SPOOL).open("wb")
        self._spool_ids = (self.path / self.SPOOL_IDS).open("wb")

    def open_catalog(self, field_types: dict[str, str], keyword_fields: Sequence[str] = ()) -> None:
        """The version's SQLite file, its columns typed ``field_types`` (a streamed build: as its
        first part types them; ``settle`` checks them against the whole corpus')."""
        self.catalog = Catalog.create(self.path / DATABASE, field_types, keyword_fields, bulk=True)
        self.keyword_fields = list(keyword_fields)

    def settle(
        self,
        field_types: dict[str, str],
        keyword_fields: Sequence[str],
        again: Callable[[], Iterator[Sequence[Entry]]],
    ) -> bool:
        """Make sure the rows are stored as the whole corpus types its columns: where the catalog
        was opened with other types (a column typed by the first part that a later row makes
        text) or other keyword fields, it is made again from ``again()``, the entries read once
        more in the same order (their vector counts kept). Whether it was made again."""
        assert self.catalog is not None
        stored = {name.casefold(): t for name, t in self.catalog.field_types().items()}
        final = {name.casefold(): t for name, t in field_types.items()}
        if stored == final and self.keyword_fields == list(keyword_fields):
            return False
        held = self.catalog.db.execute("select _chunks from entries order by _rowid")
        chunks = np.array([n for (n,) in held], dtype=np.int64)
        self.catalog.close()
        (self.path / DATABASE).unlink()
        self.open_catalog(field_types, keyword_fields)
        self.entries = 0
        for part in again():
            self.put_entries(part, chunks[self.entries : self.entries + len(part)])
        return True

    def add(
        self,
        entries: Sequence[Entry],
        vectors: np.ndarray,
        owners: np.ndarray,
        also: np.ndarray | None = None,
    ) -> None:
        """Entries with their vectors; ``owners[i]``: position in ``entries`` of ``vectors[i]``;
        ``also[i]``: it is that entry's also-vector (``indexer.embedding.fields``)."""
        self.put_entries(entries, self.add_vectors(len(entries), vectors, owners, also))

    def add_vectors(
        self, count: int, vectors: np.ndarray, owners: np.ndarray, also: np.ndarray | None = None
    ) -> np.ndarray:
        """The vectors of the next ``count`` entries to the spool (their rows are put apart,
        ``put_entries``); returns how many vectors each entry has."""
        rowids = np.arange(self.spooled + 1, self.spooled + count + 1, dtype=np.int64)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if self.dimension is None:
            self.dimension = vectors.shape[1]
        self._spool.write(vectors.tobytes())
        self._spool_ids.write(vector_ids(rowids[owners], also).tobytes())
        self.spooled += count
        self.vectors += len(vectors)
        return np.bincount(owners, minlength=count)

    def put_entries(self, entries: Sequence[Entry], chunks: np.ndarray) -> None:
        """The next entries' rows, in the order their vectors were spooled (row ids follow on)."""
        assert self.catalog is not None, "open_catalog first"
        rowids = np.arange(self.entries + 1, self.entries + len(entries) + 1, dtype=np.int64)
        self.catalog.put(entries, rowids, chunks)
        self.entries += len(entries)

    def parts(self, transform: Transform | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The spooled vectors, ``transform``-ed and unit length, with their row ids."""
        with (self.path / self.SPOOL_IDS).open("rb") as ids:
            for raw in self.raw_parts():
                vectors = np.ascontiguousarray(Transform.apply_optional(transform, raw))
                unit_length(vectors)
                yield vectors, np.fromfile(ids, np.int64, len(vectors))

    def raw_parts(self) -> Iterator[np.ndarray]:
        """The spooled vectors as embedded, ``PART_ROWS`` at a time."""
        with (self.path / self.SPOOL).open("rb") as spool:
            for start in range(0, self.vectors, PART_ROWS):
                rows = min(PART_ROWS, self.vectors - start)
                yield np.fromfile(spool, np.float32, rows * self.dimension).reshape(rows, -1)

    def write(
        self,
        strategy: Strategy,
        *,
        source: dict[str, Any],
        transform: Transform | None = None,
        index_kind: str = KIND,
        storage: str = STORAGE,
        reranker: dict[str, str] | None = None,
    ) -> IndexMeta:
        """Write the version: fit the strategy's transform on the spooled vectors (unless
        ``transform`` is given: then they were transformed already), build and write the vector
        index, and hold the graph its queries run (``indexer.store.held``); returns the meta the
        version is committed with. ``reranker``: the default reranker its searches use
        (``{"path", "fingerprint"}`` of a cross-encoder's folder)."""
        self._spool.close()
        self._spool_ids.close()
        if not self.entries:
            raise BadInput("nothing to index: no entries")
        assert self.catalog is not None and self.entries == self.spooled, "every entry's row and vectors"
        before = {f.name for f in self.path.iterdir()}
        graph = hold_graph(self.path, strategy)
        held = sorted({f.name for f in self.path.iterdir()} - before)
        self.pending.checked = records_ahead(self.path, held)  # summed while the rest is written
        given = transform is not None
        if not given:
            transform = Transform.for_strategy(strategy, self.raw_parts())
        dimension = (transform and transform.dimension) or self.dimension
        index = build_from_parts(
            lambda: self.parts(None if given else transform),
            self.vectors,
            dimension,
            index_kind,
            storage,
            directory=self.path,
        )
        (self.path / self.SPOOL).unlink()
        (self.path / self.SPOOL_IDS).unlink()
        meta = IndexMeta(
            strategy=strategy,
            model=strategy.model,
            dimension=int(dimension),
            count=self.entries,
            vectors=self.vectors,
            next_rowid=self.entries + 1,
            index_kind=index_kind,
            storage=storage,
            tuned_for=self.vectors,
            **shape_of(index),
            created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            source=source,
            graph=graph,
            reranker=reranker,
        )
        self.catalog.commit()
        self.catalog.close()
        index.write(self.path / VECTORS)
        if transform is not None:
            transform.save(self.path / TRANSFORM)
        self.pending.meta = meta
        return meta

    def close(self) -> None:
        """Release the version's files (an abandoned version's directory is removed by ``committing``)."""
        self._spool.close()
        self._spool_ids.close()
        if self.catalog is not None:
            self.catalog.close()


@contextlib.contextmanager
def new_version(
    index_dir: str | Path,
    field_types: dict[str, str] | None,
    *,
    wait: float = 0,
    keyword_fields: Sequence[str] = (),
) -> Iterator[VersionWriter]:
    """A complete new index written beside the live one (``index_dir`` is created if need be),
    under the writer lock (``wait``: seconds to wait for another writer): ``add`` its entries and
    vectors, then ``write`` it; a clean exit swaps it in. On an exception the new version is
    removed and the live one stays; a failed first build leaves no directory behind.
    ``field_types`` None: the columns are typed later (``VersionWriter.open_catalog``).
    ``keyword_fields``: the columns keyword search reads besides the text (``catalog.keyword_fields``)."""
    index_dir = Path(index_dir)
    with building(index_dir, wait), committing(index_dir) as pending:
        version = VersionWriter(pending, field_types, keyword_fields)
        try:
            yield version
        finally:
            version.close()


def write_index(
    index_dir: str | Path,
    strategy: Strategy,
    entries: Sequence[Entry],
    vectors: np.ndarray,
    owners: np.ndarray,
    *,
    source: dict[str, Any],
    transform: Transform | None = None,
    index_kind: str = KIND,
    storage: str = STORAGE,
    also: np.ndarray | None = None,
) -> Path:
    """A new index (``new_version``) of entries and vectors already in memory (vectors transformed
    already by ``transform``, if any); returns its version directory. ``owners[i]`` is the entry
    (position in ``entries``) of ``vectors[i]``; ``also[i]``: it is that entry's also-vector
    (``indexer.embedding.fields``)."""
    with new_version(index_dir, detect_types(e.fields for e in entries)) as version:
        version.add(entries, vectors, owners, also)
        version.write(strategy, source=source, transform=transform, index_kind=index_kind, storage=storage)
    return version.path
