"""Whether the no-answer promise holds on questions the rule never saw: ``evaluate abstention``
calibrates on half of a labelled FAQ's threads and tests on the other half, over many splits
(docs/abstention-guarantee.md)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from indexer.embedding.fields import FieldScoring
from indexer.embedding.strategy import Strategy
from indexer.errors import BadInput
from search.studies.evaluate import RetrievalSet, described, opened


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
) -> dict[str, Any]:
    """Whether the promise holds on questions the rule never saw, over many splits. Each seed
    splits the threads in half: the first half's questions calibrate (all answerable, as a FAQ
    owner's labels are), the second half's are the test, with ``holdout`` of its threads removed
    from the index (their questions must go unanswered). The learned rule (``features``) and the
    plain cosine threshold, side by side: how many seeds kept the promise (test precision >=
    ``precision``), precision and coverage (mean, worst), AUROC (answerable vs not).

    One index of the whole corpus is built and searched once; a removed thread is left out of
    each question's neighbourhood (``Neighbourhood.first``), which is what searching an index
    without it finds (exact search; a post-processing would be fitted with it)."""
    import random

    from search.read.confidence import NEIGHBOURS
    from search.studies.calibration import (
        LEARNED,
        PLAIN,
        check_features,
        check_precision,
        choose_rule,
        embedded,
        fit_rule,
        observe,
        threads,
    )
    from search.studies.promise import GUARANTEE, UNANSWERABLE, auroc, check_share, measure

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
    splits = []
    for seed in seeds:
        order = list(found)
        random.Random(seed).shuffle(order)
        splits.append((order[:half], order[half:], order[half : half + removed_count]))
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
        plan = snapshot.plan(texts, count, mode=mode, fitting=True)
        found_near = snapshot.neighbourhoods(plan, embedded(snapshot, texts, progress))
        near = dict(zip([q.id for q in questions], found_near, strict=True))
        ids = snapshot.ids(sorted({r for n in near.values() for r in n.rowids}))
        described_index = described(snapshot)
    learned = tuple(features) if features else LEARNED
    per_seed = []
    for seed, (calibrating, testing, removed) in zip(seeds, splits, strict=True):
        rows = {indexed[d] for t in removed for d in t[1] if d in indexed}
        calibration_ids = sorted(set().union(*(t[0] for t in calibrating)) & asked)
        test_ids = sorted(set().union(*(t[0] for t in testing)) & asked)
        calibration = observe(
            calibration_ids, [near[q] for q in calibration_ids], ids, data.qrels, indexed, rows
        )
        test = [
            o
            for o in observe(test_ids, [near[q] for q in test_ids], ids, data.qrels, indexed, rows)
            if not o.hidden
        ]
        correct = np.array([o.correct for o in test])
        answerable = np.array([o.answerable for o in test])
        result: dict[str, Any] = {"seed": seed, "test unanswerable": float((~answerable).mean())}
        for name, chosen in (("rule", learned), ("plain", PLAIN), ("default", None)):
            try:
                if chosen is None:
                    rule = choose_rule(calibration, precision, guarantee, unanswerable)
                    result["default chose"] = ",".join(rule.features)
                else:
                    rule = fit_rule(calibration, precision, chosen, guarantee, unanswerable)
            except BadInput:  # no promise possible on this split: nothing is answered
                result[name] = {"precision": 1.0, "coverage": 0.0, "auroc": None, "refused": True}
                continue
            confidence = rule.confidence(np.array([o.features for o in test]))
            scored = measure(confidence >= rule.threshold, correct, answerable)
            result[name] = {**scored, "auroc": auroc(confidence, answerable), "refused": False}
        per_seed.append(result)
    report: dict[str, Any] = {
        "threads": len(found),
        "seeds": len(per_seed),
        "calibration threads": half,
        "test threads": len(found) - half,
        "removed threads": removed_count,
        "mode": mode,
        "target": f"precision >= {precision:g} with {guarantee:.0%} confidence, "
        f"up to {unanswerable:.0%} unanswerable",
    }
    chose = [r.get("default chose") for r in per_seed]
    report["default chose"] = ", ".join(f"{c} {chose.count(c)}/{len(chose)}" for c in dict.fromkeys(chose))
    for name, chosen in (("rule", learned), ("plain", PLAIN), ("default", ("chosen per split",))):
        runs = [r[name] for r in per_seed]
        got = np.array([r["precision"] for r in runs])
        covered = np.array([r["coverage"] for r in runs])
        areas = [r["auroc"] for r in runs if r["auroc"] is not None]
        report[f"{name} features"] = ",".join(chosen)
        report[f"{name} promise kept"] = f"{int((got >= precision - 1e-12).sum())}/{len(runs)} seeds"
        report[f"{name} precision mean"] = float(got.mean())
        report[f"{name} precision worst"] = float(got.min())
        report[f"{name} coverage mean"] = float(covered.mean())
        report[f"{name} coverage worst"] = float(covered.min())
        report[f"{name} auroc mean"] = float(np.mean(areas)) if areas else None
        report[f"{name} refused"] = sum(r["refused"] for r in runs)
    return {**report, **described_index, "per seed": per_seed}
