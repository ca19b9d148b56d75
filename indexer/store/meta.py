"""``IndexMeta``: a version's ``meta`` table, typed. Every writer builds one and serialises it
(``to_dict``); every open parses one (``parse``), so a damaged value is reported once, by key."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from indexer.embedding.strategy import Strategy
from indexer.errors import BadInput, IndexDamaged, SemsearchError
from indexer.store.layout import DATABASE, FILES, FORMAT_VERSION, PREVIOUS
from indexer.vectors.segments import Manifest

_COUNTS = ("count", "vectors", "dimension", "next_rowid", "generation", "hidden", "tuned_for", "nprobe")
_OPTIONAL = (
    "next_rowid",
    "index_kind",
    "storage",
    "tuned_for",
    "vector_kind",
    "nprobe",
    "created",
    "updated",
    "graph",
    "calibration",
    "reranker",
)
_MANIFEST = ("segments", "generation", "hidden")


@dataclass(frozen=True)
class IndexMeta(Mapping[str, Any]):
    """The meta of one version. An optional field that is None is absent on disk (an index
    written before the key existed keeps it absent); ``extra`` holds the keys the store does not
    read , passed through unchanged. Read as a mapping it is the on-disk JSON."""

    strategy: Strategy
    model: str
    dimension: int
    count: int
    vectors: int
    format_version: int = FORMAT_VERSION
    next_rowid: int | None = None
    index_kind: str | None = None
    storage: str | None = None
    tuned_for: int | None = None
    vector_kind: str | None = None
    nprobe: int | None = None
    created: str | None = None
    updated: str | None = None
    graph: str | None = None  # the key of the query graph the version holds (``indexer.store.held``)
    source: dict[str, Any] | None = None
    manifest: Manifest | None = None  # segments, generation, hidden: written by updates
    files: dict[str, list[int]] | None = None  # {file name: [size, crc32]}, written at commit
    calibration: dict[str, Any] | None = None  # the "no answer" rule (studies.calibration); {}: removed
    reranker: dict[str, str] | None = None  # the default reranker (index --rerank): CrossFolder.stored
    previous: str | None = None
    records_previous: bool = False  # whether ``previous`` is on disk (null: there was none)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def storage_name(self) -> str:
        from indexer.vectors.factory import STORAGE

        return self.storage or STORAGE

    def replace(self, **changes: Any) -> IndexMeta:
        return dataclasses.replace(self, **changes)

    def merged(self, values: Mapping[str, Any] | None, where: Path) -> IndexMeta:
        """This meta with ``values`` (on-disk keys and JSON values, e.g. a ``Change.meta``) set:
        parsed again, so a bad value never reaches the disk."""
        return IndexMeta.parse({**self.to_dict(), **values}, where) if values else self

    def to_dict(self) -> dict[str, Any]:
        """The on-disk keys and JSON values (``Catalog.write_meta``)."""
        out: dict[str, Any] = {
            "format_version": self.format_version,
            "strategy": self.strategy.to_dict(),
            "model": self.model,
            "dimension": self.dimension,
            "count": self.count,
            "vectors": self.vectors,
        }
        out.update({key: getattr(self, key) for key in _OPTIONAL if getattr(self, key) is not None})
        if self.source is not None:
            out["source"] = self.source
        if self.manifest is not None:
            out.update(self.manifest.to_meta())
        if self.files is not None:
            out[FILES] = self.files
        if self.records_previous:
            out[PREVIOUS] = self.previous
        return {**out, **self.extra}

    @cached_property
    def _dict(self) -> dict[str, Any]:
        return self.to_dict()

    def __getitem__(self, key: str) -> Any:
        return self._dict[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._dict)

    def __len__(self) -> int:
        return len(self._dict)

    @classmethod
    def parse(cls, meta: Mapping[str, Any], where: Path) -> IndexMeta:
        """The meta as read from ``meta.db`` of the index at ``where``: a format this semsearch
        does not read is ``BadInput``, a value not of the type it was written with ``IndexDamaged``
        naming the key (reported here, not met as a Python error deeper in)."""
        if meta.get("format_version") != FORMAT_VERSION:
            raise BadInput(
                f"index {where} has format version {meta.get('format_version')!r}; this semsearch "
                f"reads version {FORMAT_VERSION}: rebuild it with 'semsearch index'"
            )
        strategy = _check(where, meta)
        typed = {"format_version", "strategy", "model", "dimension", "count", "vectors", "source"}
        known = {*typed, *_OPTIONAL, *_MANIFEST, FILES, PREVIOUS}
        return cls(
            strategy=strategy,
            model=meta["model"],
            dimension=meta["dimension"],
            count=meta["count"],
            vectors=meta["vectors"],
            **{key: meta.get(key) for key in _OPTIONAL},
            source=meta.get("source"),
            manifest=Manifest.of(dict(meta)) if any(key in meta for key in _MANIFEST) else None,
            files=meta.get(FILES),
            previous=meta.get(PREVIOUS),
            records_previous=PREVIOUS in meta,
            extra={k: v for k, v in meta.items() if k not in known},
        )


def _check(index_dir: Path, meta: Mapping[str, Any]) -> Strategy:
    """The meta values the index is read by, of the types it was written with; returns the
    stored strategy."""

    def whole(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    from indexer.vectors.factory import KIND, KINDS, STORAGE, STORAGES

    bad = [key for key in _COUNTS if key in meta and not whole(meta[key])]
    bad += [key for key in ("count", "vectors", "dimension", "strategy", "model") if key not in meta]
    segments = meta.get("segments", [])
    if not isinstance(segments, list) or not all(
        isinstance(s, list) and len(s) == 2 and all(map(whole, s)) for s in segments
    ):
        bad.append("segments")
    files = meta.get(FILES, {})
    if not isinstance(files, dict) or not all(
        re.fullmatch(r"[\w-][\w.-]*", name) and isinstance(r, list) and len(r) == 2 and all(map(whole, r))
        for name, r in files.items()
    ):
        bad.append(FILES)
    if meta.get("storage", STORAGE) not in STORAGES:
        bad.append("storage")
    if meta.get("index_kind", KIND) not in KINDS:
        bad.append("index_kind")
    if meta.get("vector_kind", "flat") not in ("flat", "ivf"):
        bad.append("vector_kind")
    if not re.fullmatch(r"[0-9a-f]{20}", str(meta.get("graph", "0" * 20))):
        bad.append("graph")
    if not isinstance(meta.get("source", {}), dict):
        bad.append("source")
    if not isinstance(meta.get("calibration") or {}, dict):
        bad.append("calibration")
    reranker = meta.get("reranker") or {}
    if not isinstance(reranker, dict) or not all(
        isinstance(reranker.get(k, ""), str) for k in ("path", "fingerprint", "name")
    ):
        bad.append("reranker")
    strategy = None
    if isinstance(meta.get("strategy"), dict):
        try:
            strategy = Strategy.from_dict(meta["strategy"])
        except (SemsearchError, TypeError, ValueError) as exc:
            bad.append(f"strategy ({exc})")
    elif "strategy" not in bad:
        bad.append("strategy")
    if bad:
        raise IndexDamaged(
            f"damaged index {index_dir}: malformed meta in {DATABASE}: {', '.join(sorted(set(bad)))}"
        )
    return strategy
