"""Everything above the index, in three floors: ``read/`` queries it (SearchEngine), ranks sentences
(rank_similar) and hands vectors to other programs (encode, Encoding); ``studies/`` measures and
fits a strategy on labels, which writes too (evaluate and sweep build temporary indexes, calibrate
stores its rule in the index's meta, tune saves a model); ``server/`` and ``cli/`` serve all of it.

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
