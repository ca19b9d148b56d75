"""Whether the no-answer promise holds on questions the rule never saw: ``evaluate abstention``
calibrates on half of a labelled FAQ's threads and tests on the other half, over many splits
(docs/abstention-guarantee.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from indexer.embedding.fields import FieldScoring
from indexer.embedding.strategy import Strategy
from indexer.errors import BadInput
from search.read.reranked import Reranking
from search.studies.evaluate import RetrievalSet, described, opened, reranked

RULES = ("rule", "plain", "default")
"""The rules side by side, in the report's order: the learned one, the plain cosine threshold and
the one ``calibrate`` picks on each calibration half."""


@dataclass(frozen=True)
class Scores:
    """One rule on one split's test half; a rule no promise was possible for answers nothing
    (``refused``), so its precision is 1 and its coverage 0."""

    precision: float
    coverage: float
    auroc: float | None
    refused: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


REFUSED = Scores(precision=1.0, coverage=0.0, auroc=None, refused=True)


@dataclass(frozen=True)
class Split:
    """One seed's split: the test half's share of unanswerable questions and each rule's scores."""

    seed: int
    test_unanswerable: float
    rule: Scores
    plain: Scores
    default: Scores
    default_chose: str | None
    """The features ``calibrate`` picked on the calibration half; None where it refused."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON of ``evaluate abstention --json``'s "per seed": no "default chose" where the
        default refused."""
        chose = {} if self.default_chose is None else {"default chose": self.default_chose}
        return {
            "seed": self.seed,
            "test unanswerable": self.test_unanswerable,
            "rule": self.rule.to_dict(),
            "plain": self.plain.to_dict(),
            **chose,
            "default": self.default.to_dict(),
        }


@dataclass(frozen=True)
class Summary:
    """One rule over every split: how many kept the promise, precision and coverage (mean, worst),
    the mean AUROC of the splits that have one, and how many refused."""

    features: str
    kept: int
    runs: int
    precision_mean: float
    precision_worst: float
    coverage_mean: float
    coverage_worst: float
    auroc_mean: float | None
    refused: int

    @classmethod
    def of(cls, features: str, runs: Sequence[Scores], precision: float) -> Summary:
        got = np.array([r.precision for r in runs])
        covered = np.array([r.coverage for r in runs])
        areas = [r.auroc for r in runs if r.auroc is not None]
        return cls(
            features=features,
            kept=int((got >= precision - 1e-12).sum()),
            runs=len(runs),
            precision_mean=float(got.mean()),
            precision_worst=float(got.min()),
            coverage_mean=float(covered.mean()),
            coverage_worst=float(covered.min()),
            auroc_mean=float(np.mean(areas)) if areas else None,
            refused=sum(r.refused for r in runs),
        )

    @property
    def promise_kept(self) -> str:
        return f"{self.kept}/{self.runs} seeds"

    def to_dict(self, name: str) -> dict[str, Any]:
        """The flat keys of the report's JSON, each prefixed with the rule's ``name``."""
        return {
            f"{name} features": self.features,
            f"{name} promise kept": self.promise_kept,
            f"{name} precision mean": self.precision_mean,
            f"{name} precision worst": self.precision_worst,
            f"{name} coverage mean": self.coverage_mean,
            f"{name} coverage worst": self.coverage_worst,
            f"{name} auroc mean": self.auroc_mean,
            f"{name} refused": self.refused,
        }


@dataclass(frozen=True)
class AbstentionReport:
    """What ``evaluate abstention`` found: the split's sizes, the promise asked for, each rule's
    summary and every split's scores. ``to_dict`` is the JSON ``--json`` prints (flat keys, as
    ``evaluate``'s other reports)."""

    threads: int
    calibration_threads: int
    test_threads: int
    removed_threads: int
    mode: str
    target: str
    default_chose: str
    """How often ``calibrate`` picked each rule over the splits ("text 3/4, text,gap 1/4")."""
    rule: Summary
    plain: Summary
    default: Summary
    described: dict[str, str]
    """What it ran on (``evaluate.described``): the strategy, the also fields."""
    per_seed: tuple[Split, ...]

    @property
    def seeds(self) -> int:
        return len(self.per_seed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "threads": self.threads,
            "seeds": self.seeds,
            "calibration threads": self.calibration_threads,
            "test threads": self.test_threads,
            "removed threads": self.removed_threads,
            "mode": self.mode,
            "target": self.target,
            "default chose": self.default_chose,
            **self.rule.to_dict("rule"),
            **self.plain.to_dict("plain"),
            **self.default.to_dict("default"),
            **self.described,
            "per seed": [split.to_dict() for split in self.per_seed],
        }


def evaluate_abstention(
    corpus: str | Path,
    data: RetrievalSet,
    *,
    holdout: float = 0.33,
    seeds: Sequence[int] = range(20),
    precision: float = 0.95,
    guarantee: float | None = None,
    unanswerable: float | None = None,
    features: Sequence[str] | None = None,
    mode: str | None = None,
    strategy: Strategy | None = None,
    text_fields: Sequence[str] | None = None,
    also: FieldScoring | None = None,
    progress: bool = False,
    encoding: str = "utf-8",
    reranking: Reranking | None = None,
) -> AbstentionReport:
    """Whether the promise holds on questions the rule never saw, over many splits. Each seed
    splits the threads in half: the first half's questions calibrate (all answerable, as a FAQ
    owner's labels are), the second half's are the test, with ``holdout`` of its threads removed
    from the index (their questions must go unanswered). The learned rule (``features``) and the
    plain cosine threshold, side by side: how many seeds kept the promise (test precision >=
    ``precision``), precision and coverage (mean, worst), AUROC (answerable vs not).

    One index of the whole corpus is built and searched once; a removed thread is left out of
    each question's neighbourhood (``Neighbourhood.first``): what searching an index without it
    finds. ``reranking``: every rule fitted and tested on the reranked scores."""
    from search.read.confidence import NEIGHBOURS
    from search.studies.calibration import (
        LEARNED,
        check_features,
        check_precision,
        embedded,
        fitting_plan,
        neighbourhoods_of,
        threads,
    )
    from search.studies.promise import GUARANTEE, UNANSWERABLE, check_share

    if not 0 < holdout < 1:
        raise BadInput(f"holdout must be a fraction in (0, 1), not {holdout}")
    if not seeds:
        raise BadInput("give at least one seed")
    check_precision(precision)
    guarantee = check_share("the guarantee", GUARANTEE if guarantee is None else guarantee)
    unanswerable = check_share(
        "the unanswerable share", UNANSWERABLE if unanswerable is None else unanswerable
    )
    asked = {q.id for q in data.queries}
    found = [t for t in threads(data.qrels) if t[0] & asked]
    if len(found) < 4:
        raise BadInput(f"{len(found)} threads with questions: need at least 4 to hold some out")
    half = len(found) // 2
    removed_count = min(max(1, round(holdout * (len(found) - half))), len(found) - half - 1)
    splits = _splits(found, seeds, half, removed_count)
    questions = [q for q in data.queries if q.id in set().union(*(t[0] for t in found))]
    built = {"text_fields": text_fields, "id_field": "id", "also": also}
    with opened(None, corpus, strategy, progress=progress, encoding=encoding, **built) as snapshot:
        judged = list(dict.fromkeys(doc for docs in data.qrels.values() for doc in docs))
        indexed = snapshot.holding(judged)
        most = max(sum(d in indexed for d in t[1]) for t in found)
        gone = max(sum(d in indexed for t in split[2] for d in t[1]) for split in splits)
        count = NEIGHBOURS + snapshot.largest_group() + most + gone
        mode = snapshot.mode(mode, fitting=True)
        check_features(features, mode)
        texts = [q.text for q in questions]
        plan = fitting_plan(snapshot, texts, count, mode, reranking)
        found_near = neighbourhoods_of(snapshot, plan, embedded(snapshot, texts, progress), progress)
        near = dict(zip([q.id for q in questions], found_near, strict=True))
        ids = snapshot.ids(sorted({r for n in near.values() for r in n.rowids}))
        described_index = described(snapshot)
    learned = tuple(features) if features else LEARNED
    per_seed = []
    for seed, split in zip(seeds, splits, strict=True):
        calibration, test = _halves(split, near, ids, data.qrels, indexed, asked)
        per_seed.append(_split(seed, calibration, test, learned, precision, guarantee, unanswerable))
    target = (precision, guarantee, unanswerable)
    said = {**described_index, **reranked(plan)}
    return _report((len(found), half, removed_count), mode, target, learned, per_seed, said)


def _splits(
    found: Sequence[tuple[set[str], set[str]]], seeds: Sequence[int], half: int, removed: int
) -> list[tuple[list, list, list]]:
    """Each seed's threads shuffled: the calibration half, the test half and the test threads
    removed from the index."""
    import random

    splits = []
    for seed in seeds:
        order = list(found)
        random.Random(seed).shuffle(order)
        splits.append((order[:half], order[half:], order[half : half + removed]))
    return splits


def _split(
    seed: int,
    calibration: Sequence[Any],
    test: Sequence[Any],
    learned: tuple[str, ...],
    precision: float,
    guarantee: float,
    unanswerable: float,
) -> Split:
    """One seed's split: each rule (``RULES``) fitted on ``calibration`` and measured on ``test``."""
    from search.studies.calibration import PLAIN, choose_rule, fit_rule
    from search.studies.promise import auroc, measure

    correct = np.array([o.correct for o in test])
    answerable = np.array([o.answerable for o in test])
    scores: dict[str, Scores] = {}
    chose: str | None = None
    for name, chosen in zip(RULES, (learned, PLAIN, None), strict=True):
        try:
            if chosen is None:
                rule = choose_rule(calibration, precision, guarantee, unanswerable)
                chose = ",".join(rule.features)
            else:
                rule = fit_rule(calibration, precision, chosen, guarantee, unanswerable)
        except BadInput:  # no promise possible on this split: nothing is answered
            scores[name] = REFUSED
            continue
        confidence = rule.confidence(np.array([o.features for o in test]))
        scored = measure(confidence >= rule.threshold, correct, answerable)
        scores[name] = Scores(
            scored["precision"], scored["coverage"], auroc(confidence, answerable), refused=False
        )
    return Split(
        seed,
        float((~answerable).mean()),
        rule=scores["rule"],
        plain=scores["plain"],
        default=scores["default"],
        default_chose=chose,
    )


def _report(
    sizes: tuple[int, int, int],
    mode: str,
    target: tuple[float, float, float],
    learned: tuple[str, ...],
    per_seed: Sequence[Split],
    described: dict[str, str],
) -> AbstentionReport:
    """The report of every split: ``sizes`` (threads, calibration threads, removed threads), the
    promise asked for (``target``: precision, guarantee, unanswerable share)."""
    from search.studies.calibration import PLAIN

    threads, half, removed = sizes
    precision, guarantee, unanswerable = target
    picks = [split.default_chose for split in per_seed]
    summaries = {
        name: Summary.of(",".join(chosen), [getattr(split, name) for split in per_seed], precision)
        for name, chosen in zip(RULES, (learned, PLAIN, ("chosen per split",)), strict=True)
    }
    return AbstentionReport(
        threads=threads,
        calibration_threads=half,
        test_threads=threads - half,
        removed_threads=removed,
        mode=mode,
        target=f"precision >= {precision:g} with {guarantee:.0%} confidence, "
        f"up to {unanswerable:.0%} unanswerable",
        default_chose=", ".join(f"{c} {picks.count(c)}/{len(picks)}" for c in dict.fromkeys(picks)),
        rule=summaries["rule"],
        plain=summaries["plain"],
        default=summaries["default"],
        described=described,
        per_seed=tuple(per_seed),
    )


def _halves(
    split: tuple[list, list, list],
    near: dict[str, Any],
    ids: dict[int, str],
    qrels: Any,
    indexed: dict[str, int],
    asked: set[str],
) -> tuple[list[Any], list[Any]]:
    """One split's calibration questions and its test questions (those with their answers hidden
    left out), observed with the removed threads' entries out of every neighbourhood."""
    from search.studies.calibration import observe

    calibrating, testing, removed = split
    rows = {indexed[d] for t in removed for d in t[1] if d in indexed}
    calibration_ids = sorted(set().union(*(t[0] for t in calibrating)) & asked)
    test_ids = sorted(set().union(*(t[0] for t in testing)) & asked)
    calibration = observe(calibration_ids, [near[q] for q in calibration_ids], ids, qrels, indexed, rows)
    tested = observe(test_ids, [near[q] for q in test_ids], ids, qrels, indexed, rows)
    return calibration, [o for o in tested if not o.hidden]
