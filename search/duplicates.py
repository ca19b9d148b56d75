"""Entries that say the same thing: pairs above a cosine, found by FAISS range search over the
stored vectors (a chunked entry is its best chunk), and their groups (connected components)."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from indexer.errors import BadInput
from indexer.fields import ALSO_ID
from indexer.store import StoredIndex
from indexer.vector_index import EXACT_LIMIT, stored_vectors

BLOCK = 4096  # query vectors per range search: bounds the memory of one block's results
PROBES = 8  # IVF lists searched around each vector (past EXACT_LIMIT)
MAX_FOUND = 5_000_000  # pairs held at once before the search gives up: raise the min score


@dataclass(frozen=True)
class Duplicates:
    """Pairs (id, id, cosine) best first (at most ``limit``; ``total`` found), every group, and
    the embedded text of each entry they name (what a person reads to judge a duplicate)."""

    pairs: list[tuple[str, str, float]]
    groups: list[list[str]]
    total: int
    min_score: float
    truncated: bool = field(default=False)
    texts: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "min_score": self.min_score,
            "total_pairs": self.total,
            "truncated": self.truncated,
            "pairs": [{"a": a, "b": b, "score": s} for a, b, s in self.pairs],
            "groups": self.groups,
            "texts": self.texts,
        }


def range_pairs(
    vectors: np.ndarray, owners: np.ndarray, min_score: float, exact: bool | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Pairs of distinct owners with a cosine >= ``min_score`` between any of their vectors:
    (n, 2) owner ids (smaller first) and each pair's best cosine.

    ``exact`` (default: below ``EXACT_LIMIT`` vectors, as for queries): a flat index, every pair
    compared, blockwise BLAS products. Otherwise an IVF index (sqrt(n) lists) searched with
    ``PROBES`` probes: a near-copy sits in its twin's cell or a neighbouring one, so few probes
    find it, and the cost falls from n^2 to about n^2 * PROBES / sqrt(n) (bench/duplicates.py:
    recall and time against exact numpy products)."""
    import faiss

    n, dimension = vectors.shape
    if exact if exact is not None else n < EXACT_LIMIT:
        flat = faiss.IndexFlatIP(dimension)
    else:
        nlist = int(np.sqrt(n))
        flat = faiss.IndexIVFFlat(faiss.IndexFlatIP(dimension), dimension, nlist, faiss.METRIC_INNER_PRODUCT)
        sample = np.random.default_rng(0).choice(n, size=min(n, 64 * nlist), replace=False)
        flat.train(vectors[sample])
        flat.nprobe = PROBES
    flat.add(vectors)
    found_pairs, found_scores, held = [], [], 0
    for start in range(0, len(vectors), BLOCK):
        lims, scores, positions = flat.range_search(vectors[start : start + BLOCK], min_score)
        rows = owners[start + np.repeat(np.arange(len(lims) - 1), np.diff(lims).astype(np.int64))]
        others = owners[positions]
        keep = rows < others  # each pair once, never an entry with itself
        found_pairs.append(np.stack([rows[keep], others[keep]], axis=1))
        found_scores.append(scores[keep])
        held += int(keep.sum())
        if held > MAX_FOUND:
            raise BadInput(f"more than {MAX_FOUND} pairs at cosine >= {min_score}: raise the min score")
    pairs = np.concatenate(found_pairs) if found_pairs else np.zeros((0, 2), dtype=np.int64)
    scores = np.concatenate(found_scores) if found_scores else np.zeros(0, dtype=np.float32)
    order = np.lexsort((-scores, pairs[:, 1], pairs[:, 0]))  # by pair, best chunk first
    pairs, scores = pairs[order], scores[order]
    first = np.ones(len(pairs), dtype=bool)
    first[1:] = (pairs[1:] != pairs[:-1]).any(axis=1)
    return pairs[first], scores[first]


def components(pairs: np.ndarray) -> list[list[int]]:
    """Connected components (of two or more) of the graph the pairs draw, largest first."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    if not len(pairs):
        return []
    nodes, edges = np.unique(pairs, return_inverse=True)
    edges = edges.reshape(-1, 2)
    graph = coo_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])), shape=(len(nodes), len(nodes)))
    _, labels = connected_components(graph, directed=False)
    groups: dict[int, list[int]] = {}
    for node, label in zip(nodes.tolist(), labels.tolist(), strict=True):
        groups.setdefault(label, []).append(node)
    return sorted(groups.values(), key=lambda g: (-len(g), g))


def check_min_score(min_score: float) -> float:
    if not 0 < min_score <= 1:
        raise BadInput(f"min score for duplicates must be a cosine in (0, 1], not {min_score}")
    return float(min_score)


def find_duplicates(
    index: StoredIndex,
    min_score: float = 0.9,
    limit: int | None = None,
    lock: AbstractContextManager[Any] | None = None,
    exact: bool | None = None,
) -> Duplicates:
    """Every pair of entries at cosine >= ``min_score`` (the best ``limit`` listed) and the groups
    they form (``exact``: see ``range_pairs``). Reads the vectors through its own handle, so a
    server's shared index is untouched; ``lock`` is held while the catalog is read (a server's
    ``Snapshot.db_lock``)."""
    min_score = check_min_score(min_score)
    if limit is not None and limit < 0:
        raise BadInput(f"limit must be 0 or more, not {limit}")
    vectors, owners = stored_vectors(index.read_vectors())
    texts = owners < ALSO_ID  # entries say the same thing when their texts do: also-vectors aside
    vectors, owners = vectors[texts], owners[texts]
    pairs, scores = range_pairs(np.ascontiguousarray(vectors, dtype=np.float32), owners, min_score, exact)
    best = np.argsort(-scores, kind="stable")[:limit]
    groups = components(pairs)
    shown = {int(r) for r in pairs[best].ravel()} | {r for g in groups for r in g}
    with lock or nullcontext():
        ids = index.catalog.values(sorted(shown), "_id")
        texts = index.catalog.values(sorted(shown), "_text")
    return Duplicates(
        [(ids[int(a)], ids[int(b)], float(s)) for (a, b), s in zip(pairs[best], scores[best], strict=True)],
        [sorted(ids[r] for r in group) for group in groups],
        len(pairs),
        min_score,
        len(best) < len(pairs),
        {ids[r]: texts[r] for r in sorted(shown)},
    )
