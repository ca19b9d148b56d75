"""IVF probe counts tuned against exact search on the corpus' own vectors, and the samples that
training and tuning read from a corpus that comes in parts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from indexer.vectors.base import Parts

if TYPE_CHECKING:
    import numpy as np

RECALL_TARGET = 0.97
MIN_LISTS = 16
"""Fewest IVF lists (``sqrt(n)`` clipped to 16..4096); k-means needs a vector per list."""


def list_count(n: int) -> int:
    """IVF lists for ``n`` vectors: ``sqrt(n)`` clipped to ``MIN_LISTS``..4096."""
    import numpy as np

    return int(np.clip(np.sqrt(n), MIN_LISTS, 4096))


def rows_at(parts: Parts, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The vectors and ids at ``positions`` (of the concatenated parts), in the order given,
    filled in place: a sample costs its own size, not twice or thrice it."""
    import numpy as np

    positions = np.asarray(positions, dtype=np.int64)
    order = np.argsort(positions, kind="stable")
    wanted = positions[order]
    picked = picked_ids = None
    start = 0
    for part, part_ids in parts():
        if picked is None:
            picked = np.empty((len(positions), part.shape[1]), dtype=np.float32)
            picked_ids = np.empty(len(positions), dtype=np.int64)
        inside = (wanted >= start) & (wanted < start + len(part))
        picked[order[inside]] = part[wanted[inside] - start]
        picked_ids[order[inside]] = part_ids[wanted[inside] - start]
        start += len(part)
    if picked is None or start <= (wanted[-1] if len(wanted) else -1):
        raise ValueError(f"positions beyond the {start} vectors of the parts")
    return picked, picked_ids


def tune_nprobe(
    index: Any, vectors: np.ndarray, ids: np.ndarray, target: float = RECALL_TARGET, queries: int = 300
) -> int:
    """``tune_nprobe_parts`` for vectors held in memory."""
    return tune_nprobe_parts(index, lambda: [(vectors, ids)], len(vectors), target, queries)


def tune_nprobe_parts(
    index: Any, parts: Parts, n: int, target: float = RECALL_TARGET, queries: int = 300
) -> int:
    """Smallest probe count whose recall@10 against exact search reaches ``target``, on probe
    queries as far from the corpus as real questions are from their answers: stored vectors
    pushed to cosine ~0.5 of themselves in random directions. (Probes that sit on stored vectors
    find their neighbours in their own cell and make a too-small probe count look good.) The
    exact top 10 is merged over the parts of the corpus. ``index``: a FAISS IVF index or a
    ``WritableIndex`` of kind ivf (``nlist``, a settable ``nprobe``, ``search``)."""
    import faiss
    import numpy as np

    rng = np.random.default_rng(1)
    picked, _ = rows_at(parts, rng.choice(n, size=min(queries, n), replace=False))
    noise = rng.normal(size=picked.shape).astype(np.float32)
    noise *= 1.73 / np.linalg.norm(noise, axis=1, keepdims=True)  # |noise| = 1.73: cosine 0.5
    probes = picked + noise
    probes = np.ascontiguousarray(probes / np.linalg.norm(probes, axis=1, keepdims=True), dtype=np.float32)
    heap = faiss.ResultHeap(len(probes), 10, keep_max=True)
    for vectors, ids in parts():
        scores, rows = faiss.knn(probes, vectors, min(10, len(vectors)), metric=faiss.METRIC_INNER_PRODUCT)
        heap.add_result(scores, ids[rows])
    heap.finalize()
    exact = heap.I
    nprobe = 1
    while nprobe < index.nlist:
        index.nprobe = nprobe
        _, found = index.search(probes, 10)
        if recall_at_10(found, exact) >= target:
            return nprobe
        nprobe *= 2
    return index.nlist


def recall_at_10(found: np.ndarray, exact: np.ndarray) -> float:
    """Share of the exact top 10 that the approximate search also returned, averaged."""
    import numpy as np

    return float(
        np.mean([len(set(f) & set(e)) / len(e) for f, e in zip(found.tolist(), exact.tolist(), strict=True)])
    )
