"""The writing side: corpus files -> texts -> vectors -> a FAISS + SQLite index directory.

Names load on first use so ``semsearch --help`` and ``info`` do not pay for what they do not run.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from indexer.errors import BadInput, FilterError, IndexDamaged, IndexLocked, SemsearchError, StrategyConflict
from indexer.strategy import DEFAULT_MODEL, Strategy

_LAZY = {"BuildReport": "indexer.build", "build_index": "indexer.build", "export_encoder": "indexer.export"}

__all__ = [
    "DEFAULT_MODEL",
    "BadInput",
    "BuildReport",
    "FilterError",
    "IndexDamaged",
    "IndexLocked",
    "SemsearchError",
    "Strategy",
    "StrategyConflict",
    "build_index",
    "export_encoder",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'indexer' has no attribute {name!r}")
