"""Opening the live version with every check that could make answers wrong, and ``verify``."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from indexer.catalog import Catalog, DatabaseError, OperationalError
from indexer.embedding.strategy import Strategy
from indexer.embedding.transform import Transform
from indexer.errors import BadInput, IndexDamaged
from indexer.store.held import held_bytes, holds
from indexer.store.integrity import check_database_header, check_files, verify_files
from indexer.store.layout import CURRENT, DATABASE, TRANSFORM, VECTORS
from indexer.store.meta import IndexMeta
from indexer.store.versions import VersionHold, hold_version, live_version, version_dir
from indexer.vectors.base import VectorIndex
from indexer.vectors.factory import open_vectors, side_files
from indexer.vectors.files import stored_shape
from indexer.vectors.segments import Manifest

if TYPE_CHECKING:
    from indexer.embedding.graphs import GraphSpec


@dataclass
class StoredIndex:
    """An opened index: the strategy it was built with, its FAISS index and its catalog."""

    path: Path
    version: Path
    meta: IndexMeta
    vectors: VectorIndex | None
    catalog: Catalog
    transform: Transform | None
    tombstones: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), dtype=np.int64))
    hold: VersionHold | None = field(default=None, repr=False, compare=False)
    """Keeps the version on disk while this reader has it (``versions.VersionHold``)."""

    @property
    def strategy(self) -> Strategy:
        return self.meta.strategy

    @property
    def manifest(self) -> Manifest:
        return self.meta.manifest or Manifest()

    def changed(self) -> bool:
        """Whether an update committed into this version since it was opened: one meta row read.
        (A new version is seen through ``CURRENT``.)"""
        if self.catalog.outdated():  # read from a copy while a killed writer's journal stood
            return True
        try:
            generation = self.catalog.generation()
        except OperationalError:  # a killed writer's journal: reopen, which reads around it
            return True
        return generation != self.manifest.generation

    def read_vectors(self) -> VectorIndex:
        """The vectors of this snapshot through a handle of its own (a scan that must not touch
        the index a server's requests share)."""
        return open_vectors(
            self.version,
            VECTORS,
            self.manifest,
            self.tombstones,
            self.meta.vectors,
            mmap=True,
            storage=self.storage,
        )

    @property
    def graph(self) -> GraphSpec | None:
        """The graph of this version's queries it holds itself (``indexer.store.held``), or None
        (an index built before indexes held it, or of a model that cannot be exported)."""
        return holds(self.version, self.strategy, self.meta.graph)

    @property
    def storage(self) -> str:
        return self.meta.storage_name

    @property
    def db(self) -> Any:  # the catalog's connection, read-only
        return self.catalog.db

    def rows(self, rowids: Sequence[int]) -> dict[int, dict[str, Any]]:
        return self.catalog.rows(rowids)

    def columns(self) -> list[str]:
        return self.catalog.columns()

    def size_on_disk(self) -> int:
        return sum(f.stat().st_size for f in self.version.iterdir() if f.is_file())

    def info(self, encoder: str | None = None) -> dict[str, Any]:
        """What the CLI's ``info`` and the server's ``/info`` show. ``encoder``: how its queries
        embed, told by the caller (``search.read.info``: the store decides no encoder)."""
        meta, source = self.meta, self.meta.source or {}
        if self.vectors is None and meta.vector_kind is None:  # written before meta kept the kind
            self.vectors = self.read_vectors()
        if self.vectors is None:
            kind, nprobe = meta.vector_kind, meta.nprobe
        else:
            kind, nprobe = self.vectors.kind, self.vectors.nprobe
        keyword_fields, keyword_fields_pending = self.catalog.keyword_coverage()
        return {
            "path": str(self.path),
            "version": self.version.name,
            "strategy": self.strategy.to_dict(),
            "description": self.strategy.describe(),
            "encoder": encoder,
            "model": meta.model,
            "entries": meta.count,
            "vectors": meta.vectors,
            "dimension": meta.dimension,
            "index_kind": kind,
            "storage": meta.storage_name,
            **({"nprobe": int(nprobe)} if kind == "ivf" else {}),
            "size_bytes": self.size_on_disk(),
            "graph_bytes": held_bytes(self.version, meta.graph),
            "segments": len(self.manifest.segments),
            "created": meta.created,
            "updated": meta.updated,
            "source": source.get("path"),
            "text_fields": list(source.get("text_fields") or []),
            "id_field": source.get("id_field"),
            "also": source.get("also"),
            "embedded": source.get("embedded"),
            "fields": self.catalog.field_types(),
            "calibration": meta.calibration or None,
            "keywords": self.catalog.has_keywords(),  # the FTS5 table keyword and hybrid search read
            "keyword_fields": keyword_fields,  # the fields besides the text it reads
            "keyword_fields_pending": keyword_fields_pending,  # those it reads from the next version on
            "hybrid_weight": meta.get("hybrid_weight"),  # its keyword share in hybrid search (None: default)
            "reranker": meta.reranker,  # the cross-encoder its searches rerank with (index --rerank)
        }


def open_index(index_dir: str | Path, *, mmap: bool = True, vectors: bool = True) -> StoredIndex:
    """Open the live version, checking everything that could make answers wrong. The vectors are
    memory-mapped (not copied into memory) unless the caller will change them. ``vectors=False``
    (``info``, an update): the vector files' headers are checked against the meta but FAISS is not
    loaded (nor imported), the rows are not counted (a scan of the whole table), and
    ``StoredIndex.vectors`` is None."""
    index_dir = Path(index_dir)
    if not index_dir.is_dir():
        raise BadInput(f"no index at {index_dir}")
    for attempt in range(3):  # a writer may swap versions between reading CURRENT and opening it
        try:
            return _open_version(index_dir, mmap, vectors)
        except _VersionGone:
            time.sleep(0.05 * (attempt + 1))
    return _open_version(index_dir, mmap, vectors, final=True)


class _VersionGone(Exception):
    pass


def _open_version(index_dir: Path, mmap: bool, load: bool, final: bool = False) -> StoredIndex:
    name = live_version(index_dir)
    if name is None:
        raise BadInput(f"{index_dir} is not a semsearch index (no {CURRENT} file)")
    version = version_dir(index_dir, name)
    hold = hold_version(index_dir, version)  # kept as long as this reader keeps the index
    if hold is None:
        if not final and name != live_version(index_dir):
            raise _VersionGone
        raise IndexDamaged(f"damaged index {index_dir}: {CURRENT} names a missing version {name!r}")
    if not (version / DATABASE).is_file() or not (version / VECTORS).is_file():
        raise IndexDamaged(f"damaged index {index_dir}: {DATABASE} or {VECTORS} is missing")
    try:
        catalog = Catalog(version / DATABASE)  # rolls back what a killed writer left half-written
        check_database_header(catalog.file)
        catalog.db.execute("begin")  # meta, count and tombstones of one generation
        stored = catalog.read_meta()
        count = catalog.count() if load else stored.get("count")  # a scan of every row: queries only
        tombstones = catalog.tombstones()
        catalog.db.commit()
    except (DatabaseError, ValueError, OSError) as exc:
        raise IndexDamaged(f"damaged index {index_dir}: cannot read {DATABASE}: {exc}") from None
    meta = IndexMeta.parse(stored, index_dir)
    manifest = meta.manifest or Manifest()
    files = [VECTORS, *manifest.files()]
    check_files(index_dir, version, meta.files or {}, [*files, *side_files(meta.storage_name)])
    vectors = None
    try:
        if load:
            vectors = open_vectors(
                version,
                VECTORS,
                manifest,
                tombstones,
                meta.vectors,
                mmap=mmap,
                storage=meta.storage_name,
            )
            shapes = vectors.part_shapes()
        else:
            shapes = [stored_shape(version / name) for name in files]
    except (RuntimeError, OSError, ValueError, TypeError):
        raise IndexDamaged(f"damaged index {index_dir}: cannot read {VECTORS} or a segment") from None
    dimension, total = shapes[0][0], sum(n for _, n in shapes) - manifest.hidden
    if count != meta.count or total != meta.vectors:
        raise IndexDamaged(
            f"damaged index {index_dir}: {count} entries and {total} vectors, "
            f"expected {meta.count} and {meta.vectors}"
        )
    if any(d != dimension for d, _ in shapes):
        raise IndexDamaged(f"damaged index {index_dir}: a segment's dimension differs from the base's")
    if dimension != meta.dimension:
        raise IndexDamaged(f"damaged index {index_dir}: vector dimension {dimension} != stored")
    transform = None
    if meta.strategy.postprocess != "none":
        if not (version / TRANSFORM).is_file():
            raise IndexDamaged(f"damaged index {index_dir}: {TRANSFORM} is missing")
        transform = Transform.load(version / TRANSFORM)
    return StoredIndex(index_dir, version, meta, vectors, catalog, transform, tombstones, hold)


def verify(index_dir: str | Path) -> int:
    """``semsearch info --check``: what every open checks, the vectors loaded by FAISS, every
    file against the checksum recorded at commit and ``meta.db`` by SQLite's integrity check.
    Reads the whole index. Returns the number of files checked; damage raises ``IndexDamaged``
    naming the file."""
    index = open_index(index_dir)
    try:
        checked = verify_files(index.path, index.version, index.meta.files or {})
        problems = index.catalog.integrity_problems()
        if problems != ["ok"]:
            raise IndexDamaged(f"damaged index {index.path}: {DATABASE} fails SQLite's check: {problems[0]}")
    finally:
        index.catalog.close()
    return checked + 1
