"""The rerank stage of a search: a cross-encoder re-orders the first stage's best ``depth``
candidates, and a hit's score is the reranker's fused with the first stage's at the reranker's
weight (``CrossFolder.weight``): 1 is the reranker alone, 0 the first stage's order, between them
the weight ``semsearch tune`` fitted on held-back questions, so that a reranker which did not beat
its first stage there cannot rank below it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from search.read.hybrid import Ranking

if TYPE_CHECKING:
    from indexer.encoders.rerankers import Reranker


@dataclass(frozen=True)
class Reranking:
    """The rerank stage of a search: the cross-encoder and how many of the first stage's best it
    re-orders (``depth``, at least k)."""

    reranker: Reranker
    depth: int


def reranked(query: str, first: Ranking, texts: Sequence[str], reranker: Reranker) -> tuple[Ranking, Ranking]:
    """Row id -> the score of ``query`` and each candidate of ``first`` (row id -> the first
    stage's score; ``texts`` in its order) after the rerank, best first, equal scores in the first
    stage's order; and row id -> the reranker's own score."""
    if not first:
        return {}, {}
    pool = list(first)
    own = np.asarray(reranker.score(query, list(texts)), dtype=np.float64)
    weight = reranker.folder.weight
    scores = own if weight == 1.0 else weight * own + (1 - weight) * np.array(list(first.values()))
    order = np.argsort(-scores, kind="stable")
    return {pool[i]: float(scores[i]) for i in order}, dict(zip(pool, own.tolist(), strict=True))
