"""Which FAISS index holds the vectors, chosen by size: exact search while a full scan is cheap,
an inverted-file index (IVF) above that, with its probe count tuned at build time to reach a
recall target against exact search on the corpus' own vectors.

IVF rather than HNSW: it supports ``remove_ids`` and ``add_with_ids`` (so ``add``/``delete`` work
without rebuilds), it stores the vectors once (memory ~1.0x the raw vectors, HNSW32 ~1.2x), and
it memory-maps. Both kinds search by inner product on unit vectors, i.e. cosine.
"""

from __future__ import annotations

from typing import Any

import numpy as np

EXACT_LIMIT = 200_000
"""Below this many vectors a full scan (IndexFlatIP) is a few milliseconds here: exact it is."""
RECALL_TARGET = 0.97
KINDS = ("auto", "flat", "ivf")


def build_vector_index(vectors: np.ndarray, ids: np.ndarray, kind: str = "auto") -> Any:
    import faiss

    n, dimension = vectors.shape
    if kind == "flat" or (kind == "auto" and n < EXACT_LIMIT):
        index = faiss.IndexIDMap(faiss.IndexFlatIP(dimension))
        index.add_with_ids(vectors, ids)
        return index
    nlist = int(np.clip(np.sqrt(n), 16, 4096))
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dimension), dimension, nlist, faiss.METRIC_INNER_PRODUCT)
    rng = np.random.default_rng(0)
    sample = vectors[rng.choice(n, size=min(n, 64 * nlist), replace=False)]
    index.train(sample)
    index.add_with_ids(vectors, ids)
    index.nprobe = tune_nprobe(index, vectors, ids)
    return index


def tune_nprobe(
    index: Any, vectors: np.ndarray, ids: np.ndarray, target: float = RECALL_TARGET, queries: int = 300
) -> int:
    """Smallest probe count whose recall@10 against exact search reaches ``target``. Queries are
    stored vectors left out of their own answers (leave-one-out): points drawn like the corpus."""
    import faiss

    rng = np.random.default_rng(1)
    picked = rng.choice(len(vectors), size=min(queries, len(vectors)), replace=False)
    probes = np.ascontiguousarray(vectors[picked])
    _, rows = faiss.knn(probes, vectors, 11, metric=faiss.METRIC_INNER_PRODUCT)
    exact = [[i for i in ids[r] if i != ids[p]][:10] for r, p in zip(rows, picked, strict=True)]
    nprobe = 1
    while nprobe < index.nlist:
        index.nprobe = nprobe
        _, found = index.search(probes, 11)
        kept = [[i for i in f if i != ids[p]][:10] for f, p in zip(found, picked, strict=True)]
        if recall_at_10(np.array(kept, dtype=object), np.array(exact, dtype=object)) >= target:
            return nprobe
        nprobe *= 2
    return index.nlist


def recall_at_10(found: np.ndarray, exact: np.ndarray) -> float:
    """Share of the exact top 10 that the approximate search also returned, averaged."""
    return float(
        np.mean([len(set(f) & set(e)) / len(e) for f, e in zip(found.tolist(), exact.tolist(), strict=True)])
    )


def search_parameters(index: Any, selector: Any | None) -> Any | None:
    """Search parameters for a filtered search: an IVF index probes every list then, so a filter
    that keeps few entries still finds k of them (exact within the allowed set)."""
    import faiss

    if selector is None:
        return None
    if isinstance(index, faiss.IndexIVF):
        return faiss.SearchParametersIVF(sel=selector, nprobe=index.nlist)
    return faiss.SearchParameters(sel=selector)


def kind_of(index: Any) -> str:
    import faiss

    return "ivf" if isinstance(index, faiss.IndexIVF) else "flat"
