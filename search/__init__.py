"""The reading side: query an index (SearchEngine), rank sentences (rank_similar), or hand vectors
to other programs (encode, Encoding); the CLI.

Names load on first use so ``semsearch --help`` and ``info`` do not pay for importing torch.
"""

from __future__ import annotations

from indexer.lazy import lazy_exports

_EXPORTS = {
    "Encoding": "search.encoding",
    "Hit": "search.engine",
    "SearchEngine": "search.engine",
    "encode": "search.encoding",
    "rank_similar": "search.similar",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
