"""Entries that say the same thing: pairs above a cosine among the stored vectors (every pair in
tiles of BLAS products, or a FAISS IVF range search on large indexes; a chunked entry is its best
chunk), and their groups (connected components)."""

from __future__ import annotations

import numbers
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from indexer.errors import BadInput
from indexer.progress import Progress, Share
from indexer.store import StoredIndex
from indexer.vectors.entries import entry_texts
from indexer.vectors.factory import EXACT_LIMIT, range_index
from search.read.components import groups

BLOCK = 4096  # most query vectors per IVF range search
# Candidates one step of a scan may yield: an exact tile of TILE x TILE vectors, an IVF block of
# as many vectors as MAX_RESULTS over the vectors of the PROBES largest lists (all a vector can
# match). So a min score that pairs everything costs a step or two (tens of MB) before it is
# refused, whatever the index's size.
MAX_RESULTS = 1 << 20
TILE = 512
PROBES = 8  # IVF lists searched around each vector (past EXACT_LIMIT)
MAX_FOUND = 1_000_000  # pairs held at once (20 MB) before the search gives up: raise the min score


class ScanStopped(Exception):
    """The scan's ``stop`` said nobody waits for it any more (a server's client hung up)."""


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


class _Found:
    """Pairs found so far, refused past ``MAX_FOUND`` before more are held."""

    def __init__(self, min_score: float):
        self.min_score = min_score
        self.pairs: list[np.ndarray] = []
        self.scores: list[np.ndarray] = []
        self.held = 0

    def add(self, first: np.ndarray, second: np.ndarray, scores: np.ndarray) -> None:
        """Owner ids ``first[i] < second[i]`` and their cosines."""
        self.held += len(first)
        if self.held > MAX_FOUND:
            raise BadInput(f"more than {MAX_FOUND} pairs at cosine >= {self.min_score}: raise the min score")
        self.pairs.append(np.stack([first, second], axis=1))
        self.scores.append(scores)

    def best(self) -> tuple[np.ndarray, np.ndarray]:
        """Each pair of owners once, with its best cosine (a chunked entry is its best chunk)."""
        pairs = np.concatenate(self.pairs) if self.pairs else np.zeros((0, 2), dtype=np.int64)
        scores = np.concatenate(self.scores) if self.scores else np.zeros(0, dtype=np.float32)
        order = np.lexsort((-scores, pairs[:, 1], pairs[:, 0]))  # by pair, best chunk first
        pairs, scores = pairs[order], scores[order]
        first = np.ones(len(pairs), dtype=bool)
        first[1:] = (pairs[1:] != pairs[:-1]).any(axis=1)
        return pairs[first], scores[first]


def range_pairs(
    vectors: np.ndarray,
    owners: np.ndarray,
    min_score: float,
    exact: bool | None = None,
    stop: Callable[[], bool] | None = None,
    block: int | None = None,
    progress: Share | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Pairs of distinct owners with a cosine >= ``min_score`` between any of their vectors:
    (n, 2) owner ids (smaller first) and each pair's best cosine.

    ``exact`` (default: below ``EXACT_LIMIT`` vectors, as for queries): every pair compared, in
    tiles of ``TILE`` x ``TILE`` vectors (one BLAS product each, the upper triangle only: each
    pair once). Otherwise an IVF index (sqrt(n) lists) range-searched with ``PROBES`` probes: a
    near-copy sits in its twin's cell or a neighbouring one, so few probes find it, and the cost
    falls from n^2 to about n^2 * PROBES / sqrt(n) (bench/duplicates.py: recall and time against
    exact numpy products).

    Bounded whatever the min score: a tile or block yields at most ``MAX_RESULTS`` candidates,
    holding more than ``MAX_FOUND`` pairs is BadInput, and ``stop`` (asked before each row of
    tiles or block) returning True ends the scan with ScanStopped. ``block``: vectors per tile
    or block instead of those defaults. ``progress``: told each row of tiles' or block's share of
    the work."""
    found = _Found(min_score)
    told = progress or (lambda share: None)
    if exact if exact is not None else len(vectors) < EXACT_LIMIT:
        _exact_pairs(vectors, owners, min_score, found, stop, block or TILE, told)
    else:
        _ivf_pairs(vectors, owners, min_score, found, stop, block or 0, told)
    return found.best()


def _exact_pairs(
    vectors: np.ndarray,
    owners: np.ndarray,
    min_score: float,
    found: _Found,
    stop: Callable[[], bool] | None,
    tile: int,
    progress: Share,
) -> None:
    n = len(vectors)
    work = sum(min(tile, n - start) * (n - start) for start in range(0, n, tile))  # the triangle
    for start in range(0, n, tile):
        if stop is not None and stop():
            raise ScanStopped
        rows = vectors[start : start + tile]
        for other in range(start, len(vectors), tile):
            cosines = rows @ vectors[other : other + tile].T
            i, j = np.nonzero(cosines >= min_score)
            scores = cosines[i, j]
            i, j = owners[i + start], owners[j + other]
            if other == start:  # the diagonal tile: each pair once, never a vector with itself
                upper = np.nonzero(i + start < j + other)[0]
                i, j, scores = i[upper], j[upper], scores[upper]
            keep = i != j  # chunks of one entry are never a pair
            i, j, scores = i[keep], j[keep], scores[keep]
            found.add(np.minimum(i, j), np.maximum(i, j), scores)
        progress(len(rows) * (n - start) / work)


def _ivf_pairs(
    vectors: np.ndarray,
    owners: np.ndarray,
    min_score: float,
    found: _Found,
    stop: Callable[[], bool] | None,
    rows_per_block: int,
    progress: Share,
) -> None:
    ivf = range_index(vectors, PROBES)
    if rows_per_block <= 0:  # a query's results lie in its PROBES lists: at most the largest ones
        rows_per_block = max(1, min(BLOCK, MAX_RESULTS // max(ivf.largest_lists(PROBES), 1)))
    for start in range(0, len(vectors), rows_per_block):
        if stop is not None and stop():
            raise ScanStopped
        lims, scores, positions = ivf.within(vectors[start : start + rows_per_block], min_score)
        rows = owners[start + np.repeat(np.arange(len(lims) - 1), np.diff(lims).astype(np.int64))]
        others = owners[positions]
        keep = rows < others  # each pair once, never an entry with itself
        found.add(rows[keep], others[keep], scores[keep])
        progress((len(lims) - 1) / len(vectors))


def components(pairs: np.ndarray) -> list[list[int]]:
    """Connected components (of two or more) of the graph the pairs draw, largest first."""
    return sorted(groups(pairs[:, 0], pairs[:, 1]), key=lambda g: (-len(g), g))


def min_score_refusal(min_score: float) -> str | None:
    """Why ``min_score`` is no threshold on a duplicate pair's cosine ("must be ..."), None where
    it is one: pairs at cosine 0 or less are no duplicates."""
    return None if 0 < min_score <= 1 else f"must be a cosine in (0, 1], not {min_score}"


def check_min_score(min_score: float) -> float:
    if isinstance(min_score, bool) or not isinstance(min_score, numbers.Real):
        raise BadInput(f"min score for duplicates must be a cosine in (0, 1], not {min_score!r}")
    refusal = min_score_refusal(min_score)
    if refusal is not None:
        raise BadInput(f"min score for duplicates {refusal}")
    return float(min_score)


def find_duplicates(
    index: StoredIndex,
    min_score: float = 0.9,
    limit: int | None = None,
    lock: AbstractContextManager[Any] | None = None,
    exact: bool | None = None,
    stop: Callable[[], bool] | None = None,
    progress: bool = False,
) -> Duplicates:
    """Every pair of entries at cosine >= ``min_score`` (the best ``limit`` listed) and the groups
    they form (``exact``, ``stop`` and the bounds: see ``range_pairs``). Reads the vectors through
    its own handle, so a server's shared index is untouched; ``lock`` is held while the catalog is
    read (a server's ``Snapshot.db_lock``)."""
    min_score = check_min_score(min_score)
    whole = isinstance(limit, numbers.Integral) and not isinstance(limit, bool)
    if limit is not None and not (whole and limit >= 0):
        raise BadInput(f"limit must be a whole number, 0 or more, not {limit!r}")
    vectors, owners = entry_texts(index.read_vectors())  # entries say the same thing when their texts do
    with Progress(len(vectors), "comparing", enabled=progress, unit="vector") as bar:
        pairs, scores = range_pairs(
            np.ascontiguousarray(vectors, dtype=np.float32),
            owners,
            min_score,
            exact,
            stop,
            progress=bar.step(len(vectors)),
        )
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
