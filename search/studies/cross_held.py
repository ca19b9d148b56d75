"""The held-back questions a reranker is judged on, and the judgement: the first stage alone, the
reranker alone and the two fused with one weight, at the depth a search reranks.

A fused score is ``weight x reranker + (1 - weight) x first stage``: at weight 0 it is the first
stage's order exactly, so a weight fitted on held-back questions can only match or beat the
first stage there. The weight is the one of ``WEIGHTS`` with the best MRR@10, the smallest of
equals; one that gains nothing over the first stage is 0.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from search.studies.tuning import K, Labels, metric_of

SURE = 0.05
"""A fused gain counts where chance gives one as large at most this often (``chance_of_gain``)."""
FLIPS = 20_000
"""Random sign flips of the questions' gains ``chance_of_gain`` draws (a fixed seed: one verdict
for one set of scores)."""
WEIGHTS = tuple(round(w, 2) for w in np.linspace(0.0, 1.0, 21).tolist())
"""The fused weights tried on the held-back questions."""
RANKED_AT_ONCE = 256
"""Questions ranked against the whole pool in one matrix product (a pool of 100,000 candidates:
100 MB of cosines at a time, not one row per question of the labels)."""
PairScorer = Callable[[Sequence[tuple[str, str]]], np.ndarray]


@dataclass(frozen=True)
class Scores:
    """One ranking's measures x100 on the held-back questions: ``headline`` (MRR@10, or Spearman
    of scored pairs), nDCG@10, and the top score's AUROC (answered vs unanswered questions)."""

    headline: float
    ndcg: float | None = None
    auroc: float | None = None
    ranks: tuple[float, ...] = ()
    """Each answered question's reciprocal rank of its first right text in the top 10 (0: none)."""

    def line(self, metric: str) -> str:
        said = f"{metric} {self.headline:.2f}"
        if self.ndcg is not None:
            said += f", ndcg@{K} {self.ndcg:.2f}"
        if self.auroc is not None:
            said += f", top score AUROC {self.auroc:.3f}"
        return said

    def to_dict(self) -> dict[str, float | None]:
        return {"headline": self.headline, "ndcg": self.ndcg, "auroc": self.auroc}


def chance_of_gain(first: np.ndarray, fused: np.ndarray, chosen: int) -> float:
    """How often chance alone gives some weight as sure a gain over the first stage as the chosen
    one (row ``chosen`` of ``fused``, one row a weight) shows: a paired randomization test (the IR
    field's, Smucker et al. 2007) of each answered question's gain in reciprocal rank, each
    question's gains flipped in sign together at every weight, 20,000 times. Each weight's summed
    gain is read in units of its own spread under the flips (which flipping leaves unchanged), and
    the best of them taken each time, so that choosing the weight on these same questions is
    counted without letting the weights that move many questions speak loudest. A sign test
    (counting the questions a weight changes) reads neither how far each moved nor the choice."""
    gains = fused - first[None, :]
    if not gains.size or gains[chosen].sum() <= 0:
        return 1.0
    spread = np.sqrt((gains**2).sum(axis=1))
    spread[spread == 0] = np.inf  # a weight that changes nothing: 0 under every flip
    observed = gains[chosen].sum() / spread[chosen]
    rng, reached = np.random.default_rng(0), 0
    for start in range(0, FLIPS, 1_000):  # memory: a thousand flips of every question at a time
        flips = rng.choice((-1.0, 1.0), size=(min(1_000, FLIPS - start), gains.shape[1]))
        reached += int(((flips @ gains.T) / spread >= observed - 1e-12).any(axis=1).sum())
    return (1 + reached) / (1 + FLIPS)


@dataclass(frozen=True)
class Measured:
    """A reranker judged: alone (weight 1) and fused at the best ``weight``; ``value`` is what
    early stopping reads (the fused headline)."""

    metric: str
    weight: float
    reranked: Scores
    fused: Scores
    chance: float = 1.0
    """``chance_of_gain`` of the fused gain over the first stage (ranking labels)."""

    @property
    def value(self) -> float:
        return self.fused.headline

    def helps(self, first: Scores) -> bool:
        """Fused above the first stage, surely (``chance`` at most ``SURE``; scored pairs:
        Spearman above). A weight fitted on few questions finds a gain in noise (an untrained
        head's, on 21 questions)."""
        if not first.ranks:
            return self.fused.headline > first.headline
        return self.weight > 0 and self.fused.headline > first.headline and self.chance <= SURE

    def lines(self, first: Scores) -> list[str]:
        said = [
            f"held-back {self.metric}: first stage alone {first.line(self.metric)}",
            f"  reranker alone {self.reranked.line(self.metric)}",
            f"  fused at weight {self.weight:.2f} {self.fused.line(self.metric)}"
            + (f" (chance of a gain this large: {self.chance:.3f})" if first.ranks else ""),
        ]
        if self.helps(first):
            said.append(
                f"the reranker helps: {self.metric} {self.fused.headline - first.headline:+.2f} over the "
                "first stage on the held-back questions"
            )
        else:
            said.append(
                f"the reranker does not surely beat the first stage on the held-back questions "
                f"({self.metric} {first.headline:.2f} alone, {self.reranked.headline:.2f} reranked, "
                f"{self.fused.headline:.2f} fused): its weight is 0"
            )
        return said

    def stored(self, first: Scores) -> dict[str, Any]:
        """What the folder's ``semsearch.json`` keeps: the weight a search fuses with."""
        helps = self.helps(first)
        return {
            "weight": self.weight if helps else 0.0,
            "helps": helps,
            "metric": self.metric,
            "first_stage": first.to_dict(),
            "reranked": self.reranked.to_dict(),
            "fused": self.fused.to_dict(),
            "chance": self.chance if first.ranks else None,
        }


@dataclass(frozen=True)
class Mined:
    """The first stage's view of the candidate pool, embedded once: distinct candidate texts and
    their vectors, and the embedding function for questions."""

    texts: list[str]
    vectors: np.ndarray
    embed: Callable[..., np.ndarray]
    asked: dict[str, np.ndarray] = field(default_factory=dict, init=False, compare=False, repr=False)
    """Each question's vector, embedded once (``questions``)."""

    @classmethod
    def of(cls, labels: Labels, embed: Callable[..., np.ndarray], progress: bool = False) -> Mined:
        """The pool embedded (minutes for a large one: a progress line every 30 s in a log)."""
        from indexer.progress import Progress

        assert labels.candidates is not None
        texts = list(dict.fromkeys(labels.candidates))
        if not progress:
            return cls(texts, embed(texts, role="passage"), embed)
        with Progress(len(texts), "embedding the candidates to mine", enabled=True) as bar:
            return cls(texts, embed(texts, role="passage", progress=bar.step(len(texts))), embed)

    def ranked(self, questions: Sequence[str], depth: int) -> tuple[np.ndarray, np.ndarray]:
        """Each question's best ``depth`` candidates (indices into ``texts``) and their cosines."""
        depth = min(depth, len(self.texts))
        tops, cosines = [np.zeros((0, depth), dtype=np.int64)], [np.zeros((0, depth))]
        for start in range(0, len(questions), RANKED_AT_ONCE):  # memory: a block's row of cosines each
            scores = self.questions(questions[start : start + RANKED_AT_ONCE]) @ self.vectors.T
            top = np.argsort(-scores, axis=1, kind="stable")[:, :depth]
            tops.append(top)
            cosines.append(np.take_along_axis(scores, top, axis=1))
        return np.concatenate(tops), np.concatenate(cosines)

    def cosines(self, questions: Sequence[str], lists: Sequence[Sequence[str]]) -> list[list[float]]:
        """The first stage's cosine of each question and each text of its list (a list is drawn
        from the candidates, so every text is one of the pool's)."""
        where = {text: i for i, text in enumerate(self.texts)}
        return [
            (self.vectors[[where[t] for t in texts]] @ asked).tolist()
            for asked, texts in zip(self.questions(questions), lists, strict=True)
        ]

    def questions(self, texts: Sequence[str]) -> np.ndarray:
        """``texts`` embedded as questions, each once a pool (mining and the cosines read the same
        questions), ``RANKED_AT_ONCE`` at a time."""
        new = [text for text in dict.fromkeys(texts) if text not in self.asked]
        for start in range(0, len(new), RANKED_AT_ONCE):
            block = new[start : start + RANKED_AT_ONCE]
            self.asked.update(zip(block, self.embed(block), strict=True))
        return np.array([self.asked[text] for text in texts]).reshape(len(texts), self.vectors.shape[1])


@dataclass(frozen=True)
class HeldBack:
    """The held-back share: ``mask`` over the labels' pairs, every text of its pieces (never
    trained on), and what it is measured on: scored pairs with the first stage's cosines, or
    questions (answered ones first, ``answered`` of them) with the first stage's best ``top``
    candidates (indices into ``candidates``), their cosines ``first`` and which are ``right``."""

    mask: np.ndarray
    questions: frozenset[str]
    texts: frozenset[str]
    metric: str
    anchors: list[str]
    answered: int
    candidates: list[str]
    top: np.ndarray
    first: np.ndarray
    right: np.ndarray
    rights: np.ndarray
    """Each answered question's count of right texts (nDCG's ideal)."""
    gold: np.ndarray | None = None

    @property
    def size(self) -> int:
        return len(self.anchors)

    def pairs(self, answered_only: bool = False) -> list[tuple[str, str]]:
        """Every (question, candidate) pair measured, each once; ``answered_only``: the answered
        questions' alone (all that ranking, the weight and its chance read)."""
        rows = self.answered if answered_only and self.gold is None else self.size
        return list(
            dict.fromkeys(
                (a, self.candidates[c])
                for a, row in zip(self.anchors[:rows], self.top[:rows], strict=True)
                for c in row
            )
        )

    def first_stage(self) -> Scores:
        return self._scores(self.first)

    def at_ceiling(self, first: Scores) -> bool:
        return self.gold is None and self.answered > 0 and first.headline >= 100.0 - 1e-9

    def measure(self, score: PairScorer) -> Measured:
        """The reranker's pair scores, alone and fused at each of ``WEIGHTS``, the best kept."""
        pairs = self.pairs()
        return self.judged(dict(zip(pairs, np.asarray(score(pairs), dtype=np.float64).tolist(), strict=True)))

    def judged(self, scored: dict[tuple[str, str], float], whole: bool = True) -> Measured:
        """A measurement from the pairs' scores (``pairs``): of every question, or (not ``whole``)
        of the answered ones alone (no top score AUROC)."""
        rows = self.size if whole or self.gold is not None else self.answered
        matrix = np.array(
            [
                [scored[(a, self.candidates[c])] for c in row]
                for a, row in zip(self.anchors[:rows], self.top[:rows], strict=True)
            ]
        ).reshape(rows, self.top.shape[1])
        alone = self._scores(matrix)
        if self.gold is not None:  # scored pairs: a pair scorer, nothing to fuse
            return Measured(self.metric, 1.0, alone, alone)
        first = self.first[:rows]
        baseline = self._scores(first)
        tried = [self._scores(w * matrix + (1 - w) * first) for w in WEIGHTS[1:]]
        best, weight = baseline, 0.0
        for w, fused in zip(WEIGHTS[1:], tried, strict=True):
            if fused.headline > best.headline + 1e-9:
                best, weight = fused, w
        if weight == 0:
            return Measured(self.metric, weight, alone, best)
        tried_ranks = np.array([t.ranks for t in tried])
        chance = chance_of_gain(np.array(baseline.ranks), tried_ranks, WEIGHTS.index(weight) - 1)
        return Measured(self.metric, weight, alone, best, chance)

    def _scores(self, matrix: np.ndarray) -> Scores:
        if self.gold is not None:
            from search.studies.evaluate import correlations

            return Scores(correlations(matrix[:, 0], self.gold)["spearman"])
        order = np.argsort(-matrix, axis=1, kind="stable")[: self.answered, :K]
        found = np.take_along_axis(self.right, order, axis=1)
        ranks = np.arange(1, found.shape[1] + 1)
        first = np.where(found.any(axis=1), found.argmax(axis=1) + 1, 0)
        mrr = np.where(first > 0, 1 / np.maximum(first, 1), 0.0)
        dcg = (found / np.log2(ranks + 1)).sum(axis=1)
        ideal = np.array([(1 / np.log2(np.arange(2, min(n, K) + 2))).sum() for n in self.rights])
        auroc = _auroc(matrix.max(axis=1), self.answered) if len(matrix) > self.answered > 0 else None
        return Scores(float(mrr.mean() * 100), float((dcg / ideal).mean() * 100), auroc, tuple(mrr.tolist()))


def _auroc(top: np.ndarray, answered: int) -> float:
    """The chance an answered question's top score is above an unanswered one's (ties half)."""
    yes, no = top[:answered], top[answered:]
    above = (yes[:, None] > no[None, :]).sum() + 0.5 * (yes[:, None] == no[None, :]).sum()
    return float(above / (len(yes) * len(no)))


def held_back_set(
    labels: Labels,
    mask: np.ndarray,
    mined: Mined | None,
    embed: Callable[..., np.ndarray],
    depth: int,
    seed: int,
) -> HeldBack:
    """The held-back share of ``labels`` (``mask``, whole pieces) with its measure: the unanswered
    questions of held pieces, and as large a share of the others, are held back beside them."""
    rows = np.flatnonzero(mask)
    pieces = set(labels.groups[rows].tolist())
    unanswered = labels.unanswered or {}
    with_answers = set(labels.groups.tolist())
    alone = sorted(a for a, p in unanswered.items() if p not in with_answers)
    random.Random(seed).shuffle(alone)
    kept = set(alone[: round(len(alone) * len(rows) / max(len(labels.first), 1))])
    quiet = [a for a, p in unanswered.items() if p in pieces or a in kept]
    texts = {labels.first[i] for i in rows} | {labels.second[i] for i in rows} | set(quiet)
    for anchor in [labels.first[i] for i in rows] + quiet:
        texts |= set((labels.negatives or {}).get(anchor, []))
    metric = metric_of(labels)
    if mined is None:  # scored pairs: one pair a row, the first stage's cosine its score
        first = [labels.first[i] for i in rows]
        second = [labels.second[i] for i in rows]
        cosine = (embed(first) * embed(second)).sum(axis=1)
        index = {t: i for i, t in enumerate(dict.fromkeys(second))}
        assert labels.scores is not None
        return HeldBack(
            mask,
            frozenset(first),
            frozenset(texts),
            metric,
            first,
            0,
            list(index),
            np.array([[index[t]] for t in second]).reshape(-1, 1),
            cosine.reshape(-1, 1),
            np.zeros((0, 1), dtype=bool),
            np.zeros(0),
            gold=labels.scores[rows],
        )
    assert labels.candidates is not None and labels.relevant is not None
    answered = list(dict.fromkeys(labels.first[i] for i in rows))
    anchors = answered + quiet
    top, first = mined.ranked(anchors, depth)
    right_texts = [{labels.candidates[c] for c in labels.relevant[a]} for a in answered]
    right = np.array(
        [[mined.texts[c] in wanted for c in row] for row, wanted in zip(top, right_texts, strict=False)],
        dtype=bool,
    ).reshape(len(answered), top.shape[1])
    return HeldBack(
        mask,
        frozenset(anchors),
        frozenset(texts),
        metric,
        anchors,
        len(answered),
        mined.texts,
        top,
        first,
        right,
        np.array([len(w) for w in right_texts]),
    )
