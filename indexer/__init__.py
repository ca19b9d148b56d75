"""The writing side: corpus files -> texts -> vectors -> a FAISS + SQLite index directory."""

from indexer.build import BuildReport, build_index
from indexer.errors import BadInput, FilterError, IndexDamaged, IndexLocked, SemsearchError, StrategyConflict
from indexer.strategy import DEFAULT_MODEL, Strategy

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
]
