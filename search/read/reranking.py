"""Rank a handful of texts against a question with a reranker (a cross-encoder): what
``semsearch rerank``, the Python ``rerank`` and the server's rerank endpoints answer.

A reranker reads the question and each text together (``indexer.encoders.rerankers``), so there
is no vector to keep and no index: each text's score is the reranker's, after the activation its
folder names. Ids are the 1-based positions of the texts, as ``search.read.similar`` gives them,
blank texts left out.

The steps are public for a caller that scores elsewhere (the server's micro-batcher):
``rankable`` (the texts kept, with their positions), the reranker's ``pair_tokens`` and
``score_tokens``, then ``ranked``. ``rerank_texts`` is the three in one call.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from indexer.encoders.options import EmbeddingOptions
from indexer.encoders.rerankers import Reranker
from search.read.requests import Hit
from search.read.reranked import load_reranker
from search.read.similar import rankable

__all__ = ["rankable", "ranked", "rerank", "rerank_texts"]


def rerank_texts(question: str, texts: Sequence[str], reranker: Reranker, k: int | None = None) -> list[Hit]:
    """The non-blank ``texts`` by ``reranker``'s score for (``question``, text), best first, at
    most ``k``; an empty question, or no text, is refused in one line."""
    kept = rankable(question, texts)
    return ranked(kept, reranker.score(question, [text for _, text in kept]), k)


def ranked(kept: Sequence[tuple[int, str]], scores: np.ndarray, k: int | None = None) -> list[Hit]:
    """``kept`` (positions and texts) as hits by their ``scores``, best first (ties in order)."""
    order = np.argsort(-scores, kind="stable")[: k or len(kept)]
    return [
        Hit(rank, str(kept[i][0]), float(scores[i]), kept[i][1], {})
        for rank, i in enumerate(order.tolist(), 1)
    ]


def rerank(
    question: str,
    texts: Sequence[str],
    model: str | Path | Reranker,
    *,
    k: int | None = None,
    options: EmbeddingOptions | None = None,
    runtime: str | None = None,
) -> list[Hit]:
    """``rerank_texts`` with the reranker at ``model`` (a folder as sentence-transformers saves a
    ``CrossEncoder``, or a reranker ``load_reranker`` made: kept across calls, its graph and session
    load once); ``options``: where it runs; ``runtime``: ``onnx``, ``onnx-int8`` or ``torch``
    (``indexer.encoders.rerankers.RUNTIMES``; None: the factory's choice)."""
    reranker = load_reranker(model, options, runtime) if isinstance(model, str | Path) else model
    return rerank_texts(question, texts, reranker, k)
