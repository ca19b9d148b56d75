"""Thresholds that keep a promise rather than an average: precision of the answered questions at
least a target, with a stated probability, on questions of which an assumed share has no answer.

``Curve`` holds the calibration questions' precision at every candidate threshold, weighting the
unanswerable ones to the assumed share, and resamples whole threads (a cluster bootstrap) for the
lower bound; ``search.studies.calibration`` fits rules with it and ``evaluate abstention`` scores them with
``measure`` and ``auroc``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from indexer.errors import BadInput

UNANSWERABLE = 1 / 3
"""Share of the questions asked that have no answer in the index, assumed by default: precision
depends on it (``guaranteed_threshold``), so the promise names it."""
GUARANTEE = 0.9
"""Default probability that the promised precision holds."""
RESAMPLES = 1000
"""Cluster bootstrap resamples behind a promise."""
CUTS = 200
"""Candidate thresholds tried (quantiles of the calibration confidences)."""
TARGETS = (0.8, 0.85, 0.9, 0.95, 0.98)
"""Precision targets whose coverage ``calibrate`` also reports (``Curve.costs``)."""
MIN_THREADS = 10
"""Threads (distinct answers) below which no promise is made: the resampling needs some."""
HALF = 0.5
"""Coverage below which ``calibrate`` names the strictest target that answers more, and about how
many labelled questions its own target would need (``Curve.looser_target``, ``Curve.questions_for``)."""


def check_share(name: str, value: float) -> float:
    """A guarantee level or a share of unanswerable questions: in (0, 1)."""
    if not 0 < value < 1:
        raise BadInput(f"{name} must be in (0, 1), not {value}")
    return float(value)


class Curve:
    """Precision of the answered calibration questions at each candidate threshold, with the
    unanswerable ones weighted to make up the share ``unanswerable`` (precision depends on it:
    the more questions without an answer, the more wrong hits pass a threshold).

    The promise resamples whole clusters (a thread's paraphrases are not independent questions:
    they are right or wrong together), ``RESAMPLES`` times with a fixed seed, so the same
    questions always give the same rule."""

    def __init__(
        self,
        confidence: np.ndarray,
        correct: np.ndarray,
        answerable: np.ndarray,
        clusters: np.ndarray,
        unanswerable: float,
    ):
        self.confidence, self.correct, self.answerable = confidence, correct, answerable
        self.unanswerable = unanswerable
        self.cuts = np.unique(np.quantile(confidence, np.linspace(0, 1, CUTS), method="lower"))[::-1]
        # the first cut (from the top) each question passes: answered at that cut and every lower one
        passes = np.searchsorted(-self.cuts, -confidence, side="left")
        count = clusters.max() + 1

        def cumulative(mask: np.ndarray) -> np.ndarray:
            table = np.zeros((count, len(self.cuts) + 1))
            np.add.at(table, (clusters[mask], passes[mask]), 1.0)
            return np.cumsum(table, axis=1)[:, :-1]

        self.right = cumulative(correct & answerable)
        self.wrong = cumulative(~correct & answerable)
        self.absent = cumulative(~answerable)
        self.answerable_counts = np.bincount(clusters, weights=answerable, minlength=count)
        self.absent_counts = np.bincount(clusters, weights=~answerable, minlength=count)
        self.clusters = count
        self._lower: dict[float, np.ndarray] = {}

    def precisions(self, weights: np.ndarray) -> np.ndarray:
        """Precision at each cut for each row of cluster ``weights`` (one row: the sample itself)."""
        share = self.unanswerable
        answerable = (weights @ self.answerable_counts)[:, None]
        absent = np.maximum(weights @ self.absent_counts, 1e-12)[:, None]
        right = share_of(weights @ self.right, answerable)
        wrong = share_of(weights @ self.wrong, answerable)
        answered = (1 - share) * (right + wrong) + share * (weights @ self.absent) / absent
        return np.where(answered > 0, (1 - share) * right / np.maximum(answered, 1e-12), 1.0)

    def lower(self, guarantee: float) -> np.ndarray:
        """The precision at each cut that all but ``1 - guarantee`` of the cluster resamples reach."""
        if guarantee not in self._lower:
            rng = np.random.default_rng(0)
            weights = rng.multinomial(self.clusters, [1 / self.clusters] * self.clusters, size=RESAMPLES)
            self._lower[guarantee] = np.quantile(
                self.precisions(weights.astype(np.float64)), 1 - guarantee, axis=0
            )
        return self._lower[guarantee]

    def guaranteed(self, precision: float, guarantee: float) -> tuple[float | None, float]:
        """The lowest cut, stepping down from the top, whose precision is at least ``precision``
        in all but ``1 - guarantee`` of the cluster resamples, and that lower quantile (the
        stated bound); the step-down stops at the first cut that fails, so trying many cuts does
        not buy a lucky one. None (and the best quantile) if no cut passes."""
        lower = self.lower(guarantee)
        passed = np.flatnonzero(lower >= precision - 1e-12)
        if not len(passed):
            return None, float(lower.max())
        failed = np.flatnonzero(lower[passed[0] :] < precision - 1e-12)
        last = passed[0] + (failed[0] - 1 if len(failed) else len(lower) - 1 - passed[0])
        return float(self.cuts[last]), float(lower[last])

    def coverage(self, threshold: float) -> float:
        """Share of the answerable calibration questions whose confidence reaches ``threshold``."""
        return float((self.confidence[self.answerable] >= threshold).mean())

    def costs(self, targets: Sequence[float], guarantee: float) -> tuple[tuple[float, float], ...]:
        """``(target, coverage)`` for each precision target the same promise could make (coverage 0
        where none can be kept): what a stricter or looser target costs or buys."""
        found = []
        for target in targets:
            threshold, _ = self.guaranteed(target, guarantee)
            found.append((float(target), 0.0 if threshold is None else self.coverage(threshold)))
        return tuple(found)

    def looser_target(self, precision: float, guarantee: float, coverage: float = HALF) -> float | None:
        """The highest precision target below ``precision`` (in steps of 0.01, down to 0.5) whose
        promise answers at least ``coverage`` of the answerable questions; None if none does."""
        for hundredths in range(math.ceil(precision * 100) - 1, 49, -1):
            threshold, _ = self.guaranteed(hundredths / 100, guarantee)
            if threshold is not None and self.coverage(threshold) >= coverage:
                return hundredths / 100
        return None

    def questions_for(
        self, precision: float, guarantee: float, questions: int, coverage: float = HALF
    ) -> int | None:
        """About how many labelled questions like these ``questions`` would let the promise at
        ``precision`` answer ``coverage``: at the strictest cut answering that much, the margin
        between the sample's own precision and the guaranteed bound shrinks as 1/sqrt(threads),
        so it must shrink by (own - target) / margin. None when the sample's own precision there
        is below the target (no number of labels like these reaches it). Two significant digits:
        a rough estimate (docs/abstention-guarantee.md)."""
        covered = np.flatnonzero([self.coverage(cut) >= coverage for cut in self.cuts])
        if not len(covered):
            return None
        cut = covered[0]
        own = float(self.precisions(np.ones((1, self.clusters)))[0][cut])
        if own <= precision:
            return None
        shrink = ((own - float(self.lower(guarantee)[cut])) / (own - precision)) ** 2
        return int(float(f"{questions * max(1.0, shrink):.2g}"))

    def unguarded(self, precision: float) -> float:
        """The lowest cut at which the sample's own precision reaches ``precision`` (no promise)."""
        reached = np.flatnonzero(self.precisions(np.ones((1, self.clusters)))[0] >= precision - 1e-12)
        return float(self.cuts[reached[-1]]) if len(reached) else float(self.cuts[0])


def share_differs(share: float, questions: int, assumed: float) -> bool:
    """Whether the share of unanswerable questions among ``questions`` labelled ones is further
    from the ``assumed`` share than sampling would put it (two binomial standard errors)."""
    return abs(share - assumed) > 2 * math.sqrt(assumed * (1 - assumed) / max(questions, 1))


def weighted_precision(
    answered: np.ndarray, correct: np.ndarray, answerable: np.ndarray, share: float
) -> float:
    """Precision of the answered questions were a share ``share`` of all questions unanswerable."""
    right = (answered & correct & answerable).sum() / max(answerable.sum(), 1)
    wrong = (answered & ~correct & answerable).sum() / max(answerable.sum(), 1)
    absent = (answered & ~answerable).sum() / max((~answerable).sum(), 1)
    total = (1 - share) * (right + wrong) + share * absent
    return float((1 - share) * right / total) if total > 0 else 1.0


def share_of(counts: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """``counts / totals``, 0 where a total is 0."""
    return np.where(totals > 0, counts / np.maximum(totals, 1e-12), 0.0)


def measure(answered: np.ndarray, correct: np.ndarray, answerable: np.ndarray) -> dict[str, float]:
    """Precision of the answered questions and coverage (answered answerable / answerable)."""
    return {
        "precision": float(correct[answered].mean()) if answered.any() else 1.0,
        "coverage": float((answered & answerable).sum() / max(answerable.sum(), 1)),
    }


def auroc(confidence: np.ndarray, positive: np.ndarray) -> float | None:
    """Area under the ROC curve of ``confidence`` for ``positive`` (None with one class only)."""
    from sklearn.metrics import roc_auc_score

    if positive.all() or not positive.any():
        return None
    return float(roc_auc_score(positive, confidence))
