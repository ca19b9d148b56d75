"""The rerank stage of a search: a cross-encoder re-orders the first stage's best ``depth``
candidates of every question of a batch, and a hit's score is the reranker's fused with the
first stage's at the stage's weight: 1 is the reranker alone, 0 the first stage's order, between
them the weight fitted on held-back questions (``semsearch tune`` in the folder, ``calibrate
--rerank`` in the index), so that a reranker which did not beat its first stage there cannot rank
below it.

What a caller asks of the stage travels whole as ``RerankOptions`` (the CLI builds it from one
decorator, ``search.cli.reranking``), as ``EmbeddingOptions`` does for the encoder; loaded, it is
a ``Reranking`` (``load_reranker``: the one place ``search`` loads a reranker), its depth by
``rerank_depth`` (the one default rule)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from indexer.errors import BadInput
from search.read.hybrid import RERANK_DEPTH, Ranking

if TYPE_CHECKING:
    from indexer.encoders.options import EmbeddingOptions
    from indexer.encoders.rerankers import Reranker


RERANKER_KEY = "reranker"
"""The meta key of an index's default reranker (``semsearch index --rerank``, ``calibrate
--rerank``): {"path", "fingerprint"} and, where ``calibrate`` fitted one on labelled questions,
the ``weight`` a search fuses its score at."""


def index_weight(meta: Mapping[str, object], fingerprint: str) -> float | None:
    """The fused weight the index ``meta`` stores for the reranker of ``fingerprint`` (None: none,
    the folder's applies)."""
    stored = meta.get(RERANKER_KEY)
    if not isinstance(stored, dict) or stored.get("fingerprint") != fingerprint:
        return None
    weight = stored.get("weight")
    return float(weight) if isinstance(weight, int | float) and not isinstance(weight, bool) else None


def rerank_depth(k: int, asked: int | None = None) -> int:
    """The first stage's entries a reranker re-orders: ``asked``, else ``RERANK_DEPTH`` (at least k)."""
    return max(k, RERANK_DEPTH) if asked is None else asked


def load_reranker(
    model: str | Path, options: EmbeddingOptions | None = None, runtime: str | None = None
) -> Reranker:
    """The reranker of the folder ``model`` (``indexer.encoders.rerankers.reranker_for``): every
    reranker a search, a study or the server runs is loaded here."""
    from indexer.encoders.rerankers import reranker_for

    return reranker_for(model, options, runtime=runtime)


@dataclass(frozen=True)
class RerankOptions:
    """What a caller asks of the rerank stage: a reranker's folder (``model``; None: the index's
    default where the command has one, else none), how deep (``depth``; None: ``rerank_depth``)
    and ``off`` (no reranking, not even the index's default)."""

    model: str | None = None
    depth: int | None = None
    off: bool = False

    def checked(self, k: int = 1, *, default: bool = False) -> RerankOptions:
        """These options if they go together at cutoff ``k``, else one line; ``default``: the
        index may name the reranker (a depth alone is then its depth)."""
        if self.off and (self.model or self.depth is not None):
            named = [
                flag for flag, value in (("--rerank", self.model), ("--rerank-depth", self.depth)) if value
            ]
            raise BadInput(f"--no-rerank takes no {' or '.join(named)}")
        if self.depth is not None and self.model is None and not default:
            raise BadInput("--rerank-depth needs --rerank MODEL")
        if self.depth is not None and self.depth < k:
            raise BadInput(f"--rerank-depth {self.depth} is under -k {k}: it must be k or more")
        return self

    @property
    def engine(self) -> str | bool:
        """What ``SearchEngine(rerank=...)`` takes: the folder, True (the index's) or False (off)."""
        return False if self.off else self.model or True

    def fields(self) -> dict[str, str | int | None]:
        """The ``SearchRequest`` fields these options ask for."""
        return {"rerank": self.model, "rerank_depth": self.depth}

    def stage(self, options: EmbeddingOptions | None = None, k: int = 1) -> Reranking | None:
        """The stage loaded (``Reranking.load``) at cutoff ``k``; None where no model is named."""
        return None if self.model is None else Reranking.load(self.model, self.depth, options, k=k)


@dataclass(frozen=True)
class Reranking:
    """The rerank stage of a search: the cross-encoder, how many of the first stage's best it
    re-orders (``depth``, at least k) and the weight its score is fused at (None: its folder's,
    ``CrossFolder.weight``)."""

    reranker: Reranker
    depth: int
    weight: float | None = None

    @classmethod
    def load(
        cls,
        model: str | Path,
        depth: int | None = None,
        options: EmbeddingOptions | None = None,
        *,
        k: int = 1,
    ) -> Reranking:
        """The stage of the reranker at ``model`` (``load_reranker``), ``depth`` by ``rerank_depth``."""
        return cls(load_reranker(model, options), rerank_depth(k, depth))

    @property
    def fused_at(self) -> float:
        """The weight a hit's score is fused at."""
        return self.reranker.folder.weight if self.weight is None else self.weight


def score_pairs(reranker: Reranker, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], float]:
    """(question, text) -> the reranker's score, each distinct pair scored once, all of them in
    the reranker's token-budget batches (``Reranker.score_pairs``)."""
    unique = list(dict.fromkeys(pairs))
    if not unique:
        return {}
    scores = np.asarray(reranker.score_pairs(unique), dtype=np.float64)
    return dict(zip(unique, scores.tolist(), strict=True))


def rerank_batch(
    questions: Sequence[str], firsts: Sequence[Ranking], texts: Mapping[int, str], reranking: Reranking
) -> list[tuple[Ranking, Ranking]]:
    """Each question's candidates (``firsts``: row id -> the first stage's score; ``texts``: row id
    -> text) after the rerank (``fused``), and row id -> the reranker's own score; the batch's
    pairs scored together, each once (``score_pairs``)."""
    pairs = [(q, texts[rowid]) for q, first in zip(questions, firsts, strict=True) for rowid in first]
    scored = score_pairs(reranking.reranker, pairs)
    return [
        fused(first, np.array([scored[(q, texts[r])] for r in first]), reranking.fused_at)
        for q, first in zip(questions, firsts, strict=True)
    ]


def fused(first: Ranking, own: np.ndarray, weight: float) -> tuple[Ranking, Ranking]:
    """Row id -> the score of each candidate of ``first`` (row id -> the first stage's score)
    given the reranker's ``own`` (in its order), fused at ``weight``, best first, equal scores in
    the first stage's order; and row id -> the reranker's own score."""
    if not first:
        return {}, {}
    pool = list(first)
    own = np.asarray(own, dtype=np.float64)
    scores = own if weight == 1.0 else weight * own + (1 - weight) * np.array(list(first.values()))
    order = np.argsort(-scores, kind="stable")
    return {pool[i]: float(scores[i]) for i in order}, dict(zip(pool, own.tolist(), strict=True))
