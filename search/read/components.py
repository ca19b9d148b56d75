"""Connected components of a graph given as edges between nodes (numbers or strings): FAQ
threads (questions and entries linked by judgements), duplicate groups (entries linked by high
cosines) and the pieces tuning keeps apart when it splits off a held-back set all are. SciPy's
``connected_components`` does the work; this keeps the bookkeeping in one place."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def connected(first: Sequence[Any], second: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For the edges ``first[i] -- second[i]``: the distinct nodes (sorted), the component label
    of each node, and the component label of each edge."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    nodes, ends = np.unique(np.concatenate([np.asarray(first), np.asarray(second)]), return_inverse=True)
    if not len(ends):
        return nodes, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    half = len(ends) // 2
    graph = coo_matrix((np.ones(half), (ends[:half], ends[half:])), shape=(len(nodes), len(nodes)))
    _, labels = connected_components(graph, directed=False)
    return nodes, labels, labels[ends[:half]]


def groups(first: Sequence[Any], second: Sequence[Any]) -> list[list[Any]]:
    """The nodes of each component, each sorted; components in the order of their smallest node."""
    nodes, labels, _ = connected(first, second)
    found: dict[int, list[Any]] = {}
    for node, label in zip(nodes.tolist(), labels.tolist(), strict=True):
        found.setdefault(label, []).append(node)
    return list(found.values())
