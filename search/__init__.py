"""Everything above the index: query it (SearchEngine), rank sentences (rank_similar), hand vectors
to other programs (encode, Encoding); study and fit a strategy on labels, which writes too
(evaluate and sweep build temporary indexes, calibrate stores its rule in the index's meta, tune
saves a model); the CLI and the HTTP server over all of it.

Names load on first use so ``semsearch --help`` and ``info`` do not pay for importing torch.
"""

from __future__ import annotations

from indexer.lazy import lazy_exports

_EXPORTS = {
    "Encoding": "search.read.encoding",
    "Hit": "search.read.engine",
    "SearchEngine": "search.read.engine",
    "encode": "search.read.encoding",
    "rank_similar": "search.read.similar",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
