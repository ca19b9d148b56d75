"""The fused weight of an index's reranker, fitted on its labelled questions (``calibrate
--rerank``): each question's first stage at the rerank depth, the reranker's score of every
(question, candidate) pair (each scored once, all in the reranker's batches), then the weight of
``search.studies.cross_held.WEIGHTS`` with the best MRR@10, kept only where a randomization test
says it surely beats the first stage alone (``cross_held.chance_of_gain``); else 0, the first
stage's order.

The reranker's scores are kept (``Remembered``), so the rule fitted next on the reranked
neighbourhoods scores no pair twice."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from indexer.errors import BadInput
from search.read.queries import Query
from search.read.reranked import Reranking, score_pairs
from search.read.snapshot import Snapshot
from search.studies.cross_held import HeldBack, Measured, Scores
from search.studies.tuning import K

if TYPE_CHECKING:
    from indexer.embedding.cross_folder import CrossFolder
    from indexer.encoders.rerankers import Reranker

FIRST_QUESTIONS = 8
"""Questions reranked first, to measure the reranker's pairs per second before the rest."""
AT_ONCE = 64
"""Questions reranked in one batch of pairs after the first."""
TOLD_AFTER = 30.0
"""Seconds of expected reranking past which the time is stated before it starts."""


@dataclass
class Remembered:
    """A reranker whose pair scores are kept: a pair scored once is never scored again."""

    reranker: Reranker
    scores: dict[tuple[str, str], float] = field(default_factory=dict)

    @property
    def folder(self) -> CrossFolder:
        return self.reranker.folder

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        new = [pair for pair in dict.fromkeys(pairs) if pair not in self.scores]
        self.scores.update(score_pairs(self.reranker, new))
        return np.array([self.scores[pair] for pair in pairs], dtype=np.float32)

    def score(self, question: str, texts: Sequence[str]) -> np.ndarray:
        return self.score_pairs([(question, text) for text in texts])


@dataclass(frozen=True)
class Fitted:
    """The weight fitted (0 where the reranker does not surely help), what it was judged on and
    the lines that say so."""

    weight: float
    measured: Measured
    first: Scores

    def lines(self) -> list[str]:
        return self.measured.lines(self.first)


def fit_fusion(
    snapshot: Snapshot,
    questions: Sequence[Query],
    qrels: Mapping[str, Mapping[str, int]],
    vectors: np.ndarray,
    reranking: Reranking,
    mode: str,
    report: Callable[[str], None] = lambda line: None,
) -> tuple[Fitted, Reranking]:
    """The fused weight of ``reranking`` fitted on ``questions`` (embedded as ``vectors``) judged
    by ``qrels``, and the stage to fit the rule with: the same reranker remembering its scores,
    fused at that weight. ``report`` gets the expected time (on a large set) and the verdict."""
    remembered = Remembered(reranking.reranker)
    stage = replace(reranking, reranker=remembered, weight=1.0)
    texts = [q.text for q in questions]
    plan = replace(snapshot.plan(texts, reranking.depth, mode=mode, fitting=True), reranking=stage)
    found, start = [], time.perf_counter()
    for begin, end in _batches(len(texts)):
        part = replace(plan, request=replace(plan.request, queries=tuple(texts[begin:end])))
        found += snapshot.run(part, vectors[begin:end])
        if begin == 0 and end < len(texts):
            scored = len(remembered.scores)  # distinct pairs: entries may share a text
            rate = scored / max(time.perf_counter() - start, 1e-9)
            pairs = round(scored / end * (len(texts) - end))
            if pairs / rate > TOLD_AFTER:
                report(
                    f"reranking about {pairs} more pairs at {rate:.0f} pairs/s: "
                    f"about {pairs / rate / 60:.1f} minutes"
                )
    fitted = judged(questions, qrels, found)
    for line in fitted.lines():
        report(line)
    return fitted, replace(stage, weight=fitted.weight)


def _batches(count: int) -> list[tuple[int, int]]:
    """The first few questions, then ``AT_ONCE`` at a time."""
    bounds = [0, min(FIRST_QUESTIONS, count)]
    while bounds[-1] < count:
        bounds.append(min(bounds[-1] + AT_ONCE, count))
    return list(zip(bounds, bounds[1:], strict=False))


def judged(questions: Sequence[Query], qrels: Mapping[str, Mapping[str, int]], found: Sequence) -> Fitted:
    """The weight fitted on each question's reranked candidates (``found``: hits carrying the
    first stage's and the reranker's scores), answerable questions first."""
    depth = min((len(hits) for hits in found), default=0)
    if depth == 0:
        raise BadInput("calibrate --rerank: no question found any entry to rerank")
    right = {q.id: {doc for doc, grade in qrels.get(q.id, {}).items() if grade > 0} for q in questions}
    order = sorted(range(len(questions)), key=lambda i: not right[questions[i].id])
    answered = sum(bool(right[q.id]) for q in questions)
    if not answered:
        raise BadInput("calibrate --rerank: no question has a right answer in the index to fit a weight on")
    hits = [sorted(found[i], key=lambda h: -h.first_score)[:depth] for i in order]  # first-stage order
    ids = [[h.id for h in row] for row in hits]
    anchors = [questions[i].id for i in order]
    own = {(a, h.id): h.rerank_score for a, row in zip(anchors, hits, strict=True) for h in row}
    candidates = list(dict.fromkeys(i for row in ids for i in row))
    where = {c: n for n, c in enumerate(candidates)}
    held = HeldBack(
        mask=np.zeros(0, dtype=bool),
        questions=frozenset(anchors),
        texts=frozenset(),
        metric=f"mrr@{K}",
        anchors=anchors,
        answered=answered,
        candidates=candidates,
        top=np.array([[where[i] for i in row] for row in ids]),
        first=np.array([[h.first_score for h in row] for row in hits]),
        right=np.array(
            [[i in right[a] for i in row] for a, row in zip(anchors, ids[:answered], strict=False)]
        ).reshape(answered, depth),
        rights=np.array([max(len(right[a]), 1) for a in anchors[:answered]]),
    )
    measured = held.measure(lambda pairs: np.array([own[pair] for pair in pairs]))
    first = held.first_stage()
    return Fitted(measured.weight if measured.helps(first) else 0.0, measured, first)
