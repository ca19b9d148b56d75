"""Rank a handful of sentences against one, with no index: the 'similar sentences' job."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from indexer.embedding import Embedder
from indexer.errors import BadInput
from indexer.strategy import Strategy
from indexer.transform import Transform
from search.engine import Hit, check_queries


def rank_similar(
    sentence: str,
    candidates: Sequence[str],
    strategy: Strategy | None = None,
    *,
    k: int | None = None,
    embedder: Embedder | None = None,
) -> list[Hit]:
    """Candidates by cosine to ``sentence``, best first; ids are 1-based candidate positions."""
    check_queries([sentence])
    kept = [(i, c) for i, c in enumerate(candidates, 1) if c.strip()]
    if not kept:
        raise BadInput("no sentences to rank: the input has no non-empty lines")
    embedder = embedder or Embedder(strategy)
    vectors = embedder.embed([sentence] + [c for _, c in kept])
    # no corpus here: post-processing is fitted on the texts being ranked
    vectors = Transform.apply_optional(Transform.for_strategy(embedder.strategy, vectors), vectors)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True).clip(min=1e-12)
    scores = vectors[1:] @ vectors[0]
    order = np.argsort(-scores, kind="stable")[: k or len(kept)]
    return [
        Hit(rank, str(kept[i][0]), float(scores[i]), kept[i][1], {})
        for rank, i in enumerate(order.tolist(), 1)
    ]
