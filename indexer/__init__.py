"""The writing side: corpus files -> texts -> vectors -> a FAISS + SQLite index directory."""

from indexer.build import BuildReport, build_index
from indexer.errors import SemsearchError
from indexer.strategy import DEFAULT_MODEL, Strategy

__all__ = ["DEFAULT_MODEL", "BuildReport", "SemsearchError", "Strategy", "build_index"]
