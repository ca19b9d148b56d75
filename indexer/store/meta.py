"""The meta values an index is read by, checked once when it is opened."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from indexer.errors import IndexDamaged, SemsearchError
from indexer.store.layout import (
    DATABASE,
    FILES,
)
from indexer.strategy import Strategy

_COUNTS = ("count", "vectors", "dimension", "next_rowid", "generation", "hidden", "tuned_for", "nprobe")


def check_meta(index_dir: Path, meta: dict[str, Any]) -> Strategy:
    """The meta values the index is read by, of the types it was written with; returns the
    stored strategy. (A hand-edited or damaged value is reported here, not met as a Python error
    deeper in.)"""

    def whole(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    from indexer.vectors.factory import KINDS, STORAGES

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
    if meta.get("storage", "float32") not in STORAGES:
        bad.append("storage")
    if meta.get("index_kind", "auto") not in KINDS:
        bad.append("index_kind")
    if meta.get("vector_kind", "flat") not in ("flat", "ivf"):
        bad.append("vector_kind")
    if not isinstance(meta.get("source", {}), dict):
        bad.append("source")
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
