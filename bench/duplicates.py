"""Duplicate finding at 10k-100k entries: semsearch's FAISS range search (``search.read.duplicates``)
next to the naive peer, blockwise numpy matrix products as sentence-transformers'
``paraphrase_mining`` does them, in the same run, on the same vectors. Recall: the share of the
peer's (exact) pairs semsearch finds (1 below ``EXACT_LIMIT``, where both are exact; semsearch's
IVF range search above).

    .venv/bin/python bench/duplicates.py [--sizes 10000,50000,100000] [--min-score 0.9]

Vectors: 384-d unit vectors clustered around topics (like real embeddings), with 2% planted
near-copies (cosine ~0.95) of other entries, so there are duplicates to find.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from search.read.duplicates import BLOCK, components, range_pairs


def vectors(n: int, dim: int = 384, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    topics = rng.normal(size=(max(n // 50, 1), dim)).astype(np.float32)
    points = topics[rng.integers(len(topics), size=n)] + rng.normal(size=(n, dim)).astype(np.float32) * 1.2
    copies = rng.choice(n, size=n // 50, replace=False)
    points[copies[: len(copies) // 2]] = (
        points[copies[len(copies) // 2 :]] + rng.normal(size=(len(copies) // 2, dim)).astype(np.float32) * 0.2
    )
    return points / np.linalg.norm(points, axis=1, keepdims=True)


def naive(points: np.ndarray, min_score: float) -> set[tuple[int, int]]:
    """The peer: each block of rows times all rows (one BLAS product), then every cell above."""
    found = set()
    for start in range(0, len(points), BLOCK):
        similarity = points[start : start + BLOCK] @ points.T
        rows, columns = np.nonzero(similarity >= min_score)
        rows += start
        keep = rows < columns
        found.update(zip(rows[keep].tolist(), columns[keep].tolist(), strict=True))
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10000,50000,100000")
    parser.add_argument("--min-score", type=float, default=0.9)
    args = parser.parse_args()
    print(
        f"{'entries':>8} {'pairs':>7} {'groups':>7} {'semsearch s':>12} {'numpy s':>9} {'ratio':>6}  recall"
    )
    for n in map(int, args.sizes.split(",")):
        points = vectors(n)
        started = time.perf_counter()
        pairs, _ = range_pairs(points, np.arange(n), args.min_score)
        groups = components(pairs)
        ours = time.perf_counter() - started
        started = time.perf_counter()
        peer = naive(points, args.min_score)
        theirs = time.perf_counter() - started
        recall = len({tuple(p) for p in pairs.tolist()} & peer) / max(len(peer), 1)
        counts = f"{n:>8} {len(pairs):>7} {len(groups):>7}"
        print(f"{counts} {ours:>12.2f} {theirs:>9.2f} {theirs / ours:>6.2f}  {recall:.4f}")


if __name__ == "__main__":
    main()
