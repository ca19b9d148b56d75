"""Rank a handful of sentences against one: the 'similar sentences' job.

Post-processing (centering, whitening) needs statistics fitted on a corpus; a handful of texts is
no corpus (with ``center`` and one candidate the score is always -1). So a strategy with
post-processing ranks only with a transform fitted elsewhere: an index's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from indexer.embedding.strategy import Strategy
from indexer.embedding.transform import Transform
from indexer.encoders.options import EmbeddingOptions
from indexer.errors import BadInput
from indexer.reading.corpus import blank
from search.read.encoding import Encoding
from search.read.queries import check_text
from search.read.requests import Embedding, Hit, check_k, check_queries, here

R = TypeVar("R")


def rank_similar_with_index(
    index_dir: str | Path,
    sentence: str,
    candidates: Sequence[str],
    *,
    k: int | None = None,
    strategy: dict[str, Any] | None = None,
    options: EmbeddingOptions | None = None,
) -> list[Hit]:
    """``rank_similar`` with an index's strategy and its fitted post-processing (the sentences
    are embedded exactly as the index's entries were). ``strategy``: a request checked against
    the index's, as ``SearchEngine`` does; ``options``: where the network runs."""
    from search.read.engine import SearchEngine

    snapshot = SearchEngine(index_dir, strategy=strategy, options=options).snapshot
    return rank_similar(sentence, candidates, k=k, encoding=snapshot.encoding)


def rank_similar(
    sentence: str,
    candidates: Sequence[str],
    strategy: Strategy | None = None,
    *,
    k: int | None = None,
    encoding: Encoding | None = None,
    embed: Embedding[list[Hit], R] = here,
    options: EmbeddingOptions | None = None,
) -> R:
    """Candidates by cosine to ``sentence``, best first; ids are 1-based candidate positions.
    The sentence gets the strategy's query prefix, the candidates its passage prefix.

    ``encoding``: what embeds them (an index's, with its post-processing fitted on its corpus),
    else the encoder of ``strategy``, which may then have no post-processing. ``embed``: the
    embedding step (``search.read.requests.Embedding``; the server's micro-batcher). ``options``:
    where and how the network runs (``--device``...) when no ``encoding`` is given.
    """
    kept = rankable(sentence, candidates)
    if k is not None:
        k = check_k(k)
    if encoding is not None:
        check_transform(encoding.strategy, encoding.transform)
    else:  # as an index of this strategy would embed (no torch once exported)
        check_transform(strategy or Strategy(), None)
        encoding = Encoding.load(strategy, options=options)
    # the sentence is asked (a query), the candidates are ranked as an index's entries (passages)
    texts = [sentence] + [text for _, text in kept]
    roles = ["query"] + ["passage"] * len(kept)
    return embed(encoding, texts, lambda vectors: rank_vectors(vectors, kept, k), roles)


def rankable(sentence: str, candidates: Sequence[str]) -> list[tuple[int, str]]:
    """The non-empty candidates with their 1-based positions; refuses an empty sentence or none,
    one string given as the candidates (not ranked character by character) and a candidate
    that is not text."""
    check_queries([sentence])
    if isinstance(candidates, str):
        raise BadInput("candidates: give a list of strings, not one string (wrap it: [text])")
    candidates = list(candidates)
    for i, candidate in enumerate(candidates, 1):
        if not isinstance(candidate, str):
            raise BadInput(f"sentence {i} is not text but {type(candidate).__name__}")
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
