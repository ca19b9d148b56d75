"""The writing side: corpus files -> texts -> vectors -> a FAISS + SQLite index directory.

Names load on first use so ``semsearch --help`` and ``info`` do not pay for what they do not run.
"""

from __future__ import annotations

from indexer.embedding.strategy import DEFAULT_MODEL, Strategy
from indexer.errors import BadInput, FilterError, IndexDamaged, IndexLocked, SemsearchError, StrategyConflict
from indexer.lazy import lazy_exports

_LAZY = {
    "BuildReport": "indexer.writing.build",
    "build_index": "indexer.writing.build",
    "export_encoder": "indexer.writing.export",
}

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


__getattr__ = lazy_exports(__name__, _LAZY)[0]  # no __dir__: the eager names above are listed too
