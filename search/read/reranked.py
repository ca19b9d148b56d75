"""The rerank stage of a search: a cross-encoder re-orders the first stage's best ``depth``
candidates of every question of a batch, and a hit's score is the reranker's fused with the
first stage's at the stage's weight: 1 is the reranker alone, 0 the first stage's order, between
them the weight fitted on held-back questions (``semsearch tune`` in the folder, ``calibrate
--rerank`` in the index), so that a reranker which did not beat its first stage there cannot rank
below it.

What a caller asks of the stage travels whole as ``RerankOptions``, as ``EmbeddingOptions`` does
for the encoder: the CLI builds it from one decorator (``search.cli.reranking``), a search's body
and Python's keywords with ``RerankOptions.asked``, a ``SearchRequest`` carries it, and it is
checked once (``RerankOptions.checked``). Loaded (``RerankOptions.stage``), it is a ``Reranking``
(``load_reranker``: the one place ``search`` loads a reranker), its depth by ``rerank_depth`` (the
one default rule)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from indexer.errors import BadInput
from search.read.hybrid import MAX_RERANK_DEPTH, RERANK_DEPTH, Ranking

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
    """What a caller asks of the rerank stage, carried whole from the CLI, Python and HTTP to the
    plan: a reranker's folder or Hub name (``model``; None: the engine's, or the index's default,
    where the caller has one, else none), how deep (``depth``; None: ``rerank_depth``), the weight
    its score is fused at (``weight``, in [0, 1]: 0 the first stage's order, 1 the reranker's;
    None: the index's fitted one, else the folder's) and ``off`` (no reranking, not even the
    index's default). Checked once (``checked``), loaded once (``stage``)."""

    model: str | None = None
    depth: int | None = None
    weight: float | None = None
    off: bool = False

    def __post_init__(self) -> None:
        if self.model is not None:
            object.__setattr__(self, "model", str(self.model))

    @classmethod
    def asked(cls, rerank: object = True, **tuned: object) -> RerankOptions:
        """The options a Python or HTTP caller gives as ``rerank`` (a folder or name, options,
        True: the engine's, None or False: none) and ``rerank_NAME`` keywords (``TUNING``)."""
        named = {name.removeprefix("rerank_"): value for name, value in tuned.items() if value is not None}
        if isinstance(rerank, RerankOptions):
            return replace(rerank, **named)
        if rerank is None or rerank is False:
            return cls(off=True, **named)
        return cls(None if rerank is True else str(rerank), **named)

    def given(self, default: str | None) -> RerankOptions:
        """These options, their reranker ``default`` (the engine's) where they name none."""
        return self if self.off or self.model is not None else replace(self, model=default)

    @property
    def folder(self) -> str | None:
        """The reranker a search reranks with (None: not reranked)."""
        return None if self.off else self.model

    def checked(self, k: int = 1, *, default: bool = False, cli: bool = False) -> RerankOptions:
        """These options if they go together at cutoff ``k``, else one line naming them as the
        caller does (``cli``: the flags; else the fields). ``default``: the index may name the
        reranker (a depth or weight alone is then its)."""
        tuned = [name for name in TUNING if getattr(self, name) is not None]
        if self.off and (self.model is not None or tuned):
            given = [spelled(name, cli) for name in ("model", *tuned) if getattr(self, name) is not None]
            raise BadInput(f"{spelled('off', cli)} takes no {' or '.join(given)}")
        if tuned and self.model is None and not default:
            reranker = "--rerank MODEL" if cli else "a reranker (rerank)"
            raise BadInput(f"{spelled(tuned[0], cli)} needs {reranker}")
        if self.depth is not None and not k <= self.depth <= MAX_RERANK_DEPTH:
            raise BadInput(
                f"{spelled('depth', cli)} must be at least k ({k}) and at most {MAX_RERANK_DEPTH}, not "
                f"{self.depth}: the reranker re-orders the first stage's best of that many"
            )
        if self.weight is not None and not 0 <= self.weight <= 1:  # NaN fails both
            raise BadInput(
                f"{spelled('weight', cli)} must be in [0, 1] (0: the first stage's order, 1: the "
                f"reranker's), not {self.weight}"
            )
        return self

    @property
    def engine(self) -> str | bool:
        """What ``SearchEngine(rerank=...)`` takes: the folder, True (the index's) or False (off)."""
        return False if self.off else self.model or True

    def stage(
        self,
        k: int = 1,
        *,
        reranker: Reranker | None = None,
        options: EmbeddingOptions | None = None,
        meta: Mapping[str, object] | None = None,
    ) -> Reranking | None:
        """The stage at cutoff ``k`` (None where no reranker is asked): ``reranker`` where loaded
        already (the engine's), else loaded here (``load_reranker``); its depth by
        ``rerank_depth``; fused at ``weight``, else the one the index ``meta`` fitted for it
        (``index_weight``), else its folder's."""
        if self.folder is None:
            return None
        loaded = reranker or load_reranker(self.folder, options)
        weight = self.weight
        if weight is None and meta is not None:
            weight = index_weight(meta, loaded.folder.fingerprint)
        return Reranking(loaded, rerank_depth(k, self.depth), weight)


TUNING = tuple(f.name for f in fields(RerankOptions) if f.name not in ("model", "off"))
"""The options that say how a named reranker reranks (depth, weight): each a ``RerankOptions``
field, a ``--rerank-NAME`` flag (``search.cli.reranking``), a ``rerank_NAME`` field of a search's
body (``search.server.schema.Searching``) and keyword of ``SearchEngine.request``."""


def spelled(name: str, cli: bool) -> str:
    """How a caller names the rerank option ``name``: the CLI's flag, else the field."""
    if name == "model":
        return "--rerank" if cli else "rerank"
    if name == "off":
        return "--no-rerank" if cli else "rerank false"
    return f"--rerank-{name}" if cli else f"rerank_{name}"


@dataclass(frozen=True)
class Reranking:
    """The rerank stage of a search: the cross-encoder, how many of the first stage's best it
    re-orders (``depth``, at least k) and the weight its score is fused at (None: its folder's,
    ``CrossFolder.weight``)."""

    reranker: Reranker
    depth: int
    weight: float | None = None

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
