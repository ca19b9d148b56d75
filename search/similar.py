"""Rank a handful of sentences against one: the 'similar sentences' job.

Post-processing (centering, whitening) needs statistics fitted on a corpus; a handful of texts is
no corpus (with ``center`` and one candidate the score is always -1). So a strategy with
post-processing ranks only with a transform fitted elsewhere: an index's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from indexer.corpus import blank
from indexer.errors import BadInput
from indexer.strategy import Strategy
from indexer.transform import Transform
from search.engine import Hit, check_queries
from search.queries import check_text

if TYPE_CHECKING:  # torch loads only to embed without an index, before the graph is exported
    from indexer.encoders.base import Encoder


def rank_similar_with_index(
    index_dir: str | Path,
    sentence: str,
    candidates: Sequence[str],
    *,
    k: int | None = None,
    strategy: dict[str, Any] | None = None,
) -> list[Hit]:
    """``rank_similar`` with an index's strategy and its fitted post-processing (the sentences
    are embedded exactly as the index's entries were). ``strategy``: a request checked against
    the index's, as ``SearchEngine`` does."""
    from search.engine import SearchEngine

    snapshot = SearchEngine(index_dir, strategy=strategy).snapshot
    return rank_similar(sentence, candidates, k=k, embedder=snapshot.embedder, transform=snapshot.transform)


def rank_similar(
    sentence: str,
    candidates: Sequence[str],
    strategy: Strategy | None = None,
    *,
    k: int | None = None,
    embedder: Encoder | None = None,
    transform: Transform | None = None,
) -> list[Hit]:
    """Candidates by cosine to ``sentence``, best first; ids are 1-based candidate positions.
    The sentence gets the strategy's query prefix, the candidates its passage prefix.

    ``transform``: the post-processing to apply (an index's, fitted on its corpus); required when
    the strategy has post-processing.
    """
    kept = rankable(sentence, candidates)
    check_transform(strategy or (embedder.strategy if embedder else Strategy()), transform)
    if embedder is None:  # as an index of this strategy would embed (no torch once exported)
        from indexer.encoders.factory import encoder_for

        embedder = encoder_for(strategy)
    # the sentence is asked (a query), the candidates are ranked as an index's entries (passages)
    asked = embedder.embed([sentence])
    vectors = np.vstack([asked, embedder.embed([text for _, text in kept], role="passage")])
    return rank_vectors(Transform.apply_optional(transform, vectors), kept, k)


def rankable(sentence: str, candidates: Sequence[str]) -> list[tuple[int, str]]:
    """The non-empty candidates with their 1-based positions; refuses an empty sentence or none."""
    check_queries([sentence])
    kept = [(i, check_text(c, f"sentence {i}")) for i, c in enumerate(candidates, 1) if not blank(c)]
    if not kept:
        raise BadInput("no sentences to rank: the input has no non-empty lines")
    return kept


def check_transform(strategy: Strategy, transform: Transform | None) -> None:
    if strategy.postprocess != "none" and transform is None:
        raise BadInput(
            "post-processing needs statistics fitted on a corpus: rank against an index (--index) "
            "or drop --postprocess"
        )


def rank_vectors(vectors: np.ndarray, kept: Sequence[tuple[int, str]], k: int | None) -> list[Hit]:
    """Rank ``kept`` by cosine of their vectors (``vectors[1:]``) to the sentence's (``vectors[0]``)."""
    vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True).clip(min=1e-12)
    scores = vectors[1:] @ vectors[0]
    order = np.argsort(-scores, kind="stable")[: k or len(kept)]
    return [
        Hit(rank, str(kept[i][0]), float(scores[i]), kept[i][1], {})
        for rank, i in enumerate(order.tolist(), 1)
    ]
