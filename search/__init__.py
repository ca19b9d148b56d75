"""The reading side: query an index (SearchEngine), rank sentences (rank_similar), or hand vectors
to other programs (encode, Encoding); the CLI.

Names load on first use so ``semsearch --help`` and ``info`` do not pay for importing torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "Encoding": "search.encoding",
    "Hit": "search.engine",
    "SearchEngine": "search.engine",
    "encode": "search.encoding",
    "rank_similar": "search.similar",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'search' has no attribute {name!r}")
