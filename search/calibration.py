"""Know when the index has no answer: fit the confidence rule (``search.confidence``) on labelled
questions and store it in the index (``calibrate``), so every query marks its hits ``answered``.
A tool above the engine: it searches through a ``Snapshot`` and writes through the store, under
the writer lock like any write.

``score,gap`` is the default feature set: on the StackFAQ dev split it is the set whose AUROC beats
the plain cosine's (docs/abstention.md has every set tried).

Without labelled questions, ``calibrate --self`` makes them from the corpus (``self_observations``):
each distinct text, with a third of its words dropped (a crude paraphrase), is a question whose
right answer is that text's entries (answerable), and the same question with those entries left
out is one the index cannot answer.

The rule is a logistic regression (scikit-learn) on some of the features, standardised, fitted to
say whether the top hit is right; its probability is the ``confidence`` and the threshold is the
lowest one at which the calibration questions reach the asked precision. A question with no
relevant entry in the index is an unanswerable example: its top hit is never right.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from indexer.errors import BadInput
from indexer.progress import Progress
from indexer.store import Change, apply_change, writer_lock
from search.confidence import DEFAULT_FEATURES, FEATURES, NEIGHBOURS, Neighbourhood, Rule
from search.engine import SearchEngine, Snapshot
from search.queries import Query

PLAIN = ("score",)
"""The cosine alone: the rule a held-out evaluation holds the fitted one against."""


def check_features(names: Sequence[str] | None) -> tuple[str, ...]:
    """The features asked for (None: ``DEFAULT_FEATURES``), each known."""
    if names is None:
        return DEFAULT_FEATURES
    unknown = [n for n in names if n not in FEATURES]
    if unknown or not names:
        raise BadInput(f"confidence features: choose among {', '.join(FEATURES)} (not {', '.join(unknown)})")
    return tuple(dict.fromkeys(names))


def check_precision(precision: float) -> float:
    """A precision target is a share of right top hits: in (0, 1]."""
    if not 0 < precision <= 1:
        raise BadInput(f"precision must be in (0, 1], not {precision}")
    return float(precision)


@dataclass(frozen=True)
class Observation:
    """One labelled question seen through the index: its top hit's features and what is true."""

    features: np.ndarray  # one row of FEATURES
    answerable: bool  # a relevant entry is in the index
    correct: bool  # the top hit is relevant


def observe(
    question_ids: Sequence[str],
    neighbourhoods: Sequence[Neighbourhood],
    ids: Mapping[int, str],
    qrels: Mapping[str, Mapping[str, int]],
    indexed: set[str],
) -> list[Observation]:
    """Label each question: answerable if a relevant id is indexed, correct if its top hit is
    relevant. ``ids``: row id -> external id of every top hit."""
    if not indexed.intersection(doc for judged in qrels.values() for doc in judged):
        raise BadInput("the qrels name none of the index's entries: are they for this corpus?")
    seen = []
    for question, near in zip(question_ids, neighbourhoods, strict=True):
        relevant = qrels.get(question, {})
        top = ids.get(near.rowids[0]) if near.rowids else None
        row = near.features(1)
        if not len(row):
            continue
        answerable = any(doc in indexed for doc in relevant)
        seen.append(Observation(row[0], answerable, answerable and top in relevant))
    return seen


def fit_rule(
    seen: Sequence[Observation], precision: float = 0.95, features: Sequence[str] | None = None
) -> Rule:
    """The logistic rule on ``features`` and the lowest threshold at which the answered questions
    reach ``precision`` (right top hit among those answered)."""
    from sklearn.linear_model import LogisticRegression

    precision = check_precision(precision)
    features = check_features(features)
    correct = np.array([o.correct for o in seen], dtype=bool)
    answerable = np.array([o.answerable for o in seen], dtype=bool)
    if not answerable.any():
        raise BadInput("no calibration question is answerable (none has a relevant entry in the index)")
    if correct.all() or not correct.any():
        what = "right" if correct.all() else "wrong"
        raise BadInput(
            f"every calibration question's top hit is {what}: calibrating needs both right and wrong "
            "(or unanswerable) questions"
        )
    rows = np.array([o.features for o in seen])[:, [FEATURES.index(n) for n in features]]
    mean, scale = rows.mean(axis=0), rows.std(axis=0)
    scale[scale == 0] = 1.0
    model = LogisticRegression().fit((rows - mean) / scale, correct)
    rule = Rule(
        features,
        tuple(mean.tolist()),
        tuple(scale.tolist()),
        tuple(model.coef_[0].tolist()),
        float(model.intercept_[0]),
        1.0,
        precision,
        0.0,
        0.0,
        len(seen),
    )
    confidence = rule.confidence(np.array([o.features for o in seen]))
    threshold = choose_threshold(confidence, correct, precision)
    if threshold is None:
        raise BadInput(
            f"no threshold reaches precision {precision:g} on these {len(seen)} questions: "
            "ask for a lower --precision or give more questions"
        )
    scored = measure(confidence >= threshold, correct, answerable)
    return Rule(**{**asdict(rule), "threshold": threshold, **scored, "features": features})


def choose_threshold(confidence: np.ndarray, correct: np.ndarray, precision: float) -> float | None:
    """The lowest confidence at which answering every question at or above it keeps the
    precision of the answered ones at ``precision`` or better (None if no threshold does)."""
    order = np.argsort(-confidence, kind="stable")
    ranked, hits = confidence[order], np.cumsum(correct[order])
    reached = hits / np.arange(1, len(order) + 1) >= precision - 1e-12
    last = [i for i in np.flatnonzero(reached) if i + 1 == len(ranked) or ranked[i + 1] < ranked[i]]
    return float(ranked[last[-1]]) if last else None


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


def embedded(
    snapshot: Snapshot, questions: Sequence[str], progress: bool, what: str = "questions"
) -> np.ndarray:
    """Questions embedded into the snapshot's space, with a bar of their own named ``what``."""
    with Progress(len(questions), what, enabled=progress) as bar:
        return snapshot.embed(questions, progress=bar.step(len(questions)))


def observations(
    snapshot: Snapshot,
    questions: Sequence[Query],
    qrels: Mapping[str, Mapping[str, int]],
    *,
    progress: bool = False,
) -> list[Observation]:
    """Every question searched in ``snapshot`` and labelled by ``qrels`` (``observe``)."""
    if not questions:
        raise BadInput("no calibration questions")
    near = snapshot.neighbourhoods(embedded(snapshot, [q.text for q in questions], progress))
    tops = [n.rowids[0] for n in near if n.rowids]
    judged = list(dict.fromkeys(doc for docs in qrels.values() for doc in docs))
    with snapshot.db_lock:
        ids = {rowid: row["_id"] for rowid, row in snapshot.index.rows(tops).items()}
        indexed = set(snapshot.index.catalog.rowids(judged))
    return observe([q.id for q in questions], near, ids, qrels, indexed)


SELF_QUESTIONS = 2000
"""Distinct texts a self-calibration makes questions of (a random sample past that)."""


def paraphrase(text: str, rng: np.random.Generator) -> str:
    """A crude paraphrase: the text with a third of its words dropped (order kept)."""
    words = text.split()
    if len(words) < 3:
        return text
    dropped = set(rng.choice(len(words), size=round(len(words) / 3), replace=False).tolist())
    return " ".join(w for i, w in enumerate(words) if i not in dropped)


def self_observations(
    snapshot: Snapshot, seed: int = 0, limit: int = SELF_QUESTIONS, *, progress: bool = False
) -> list[Observation]:
    """Labelled questions made from the index's own texts (see the module doc): two observations
    per distinct text, one answerable, one not."""
    with snapshot.db_lock:
        texts = snapshot.index.catalog.texts_by_hash()
        largest = snapshot.index.catalog.largest_text_group()
    if len(texts) < 2:
        raise BadInput("calibrating on the corpus itself needs at least 2 distinct texts")
    rng = np.random.default_rng(seed)
    groups = sorted(texts)
    if len(groups) > limit:
        groups = sorted(rng.choice(groups, size=limit, replace=False).tolist())
    questions = [paraphrase(texts[g], rng) for g in groups]
    vectors = embedded(snapshot, questions, progress, "paraphrases")
    near = snapshot.neighbourhoods(vectors, count=NEIGHBOURS + largest)
    seen = []
    for group, full in zip(groups, near, strict=True):
        for answerable, row in ((True, full.first(NEIGHBOURS)), (False, full.first(NEIGHBOURS, group))):
            if row.rowids:
                correct = answerable and row.groups[0] == group
                seen.append(Observation(row.features(1)[0], answerable, correct))
    return seen


def calibrate_index(
    index_dir: str | Path,
    questions: Sequence[Query] | None,
    qrels: Mapping[str, Mapping[str, int]] | None,
    *,
    precision: float = 0.95,
    features: Sequence[str] | None = None,
    wait: float = 0,
    progress: bool = False,
) -> Rule:
    """Fit the rule on labelled questions and store it in the index as a new version (under the
    writer lock, like any write). A question with no relevant entry in the index (unjudged, or
    judged against ids the index lacks) is an example of one it cannot answer. No questions (None):
    made from the corpus itself (``self_observations``)."""
    check_precision(precision)
    check_features(features)
    with writer_lock(Path(index_dir), wait):
        snapshot = SearchEngine(index_dir).snapshot
        if questions is None:
            seen = self_observations(snapshot, progress=progress)
        else:
            seen = observations(snapshot, questions, qrels or {}, progress=progress)
        rule = fit_rule(seen, precision, features)
        snapshot.index.catalog.close()
        apply_change(index_dir, Change(meta={"calibration": rule.to_dict()}))
    return rule
