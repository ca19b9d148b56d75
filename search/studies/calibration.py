"""Know when the index has no answer: fit the confidence rule (``search.read.confidence``) on labelled
questions and store it in the index (``calibrate``), so every query marks its hits ``answered``.
A tool above the engine: it searches through a ``Snapshot`` and writes through the store, under
the writer lock like any write.

Labels a FAQ owner has are answerable questions, so each one is also asked with its relevant
entries hidden from its neighbourhood: an example of a question the index cannot answer, made
from what the user has (``observe``). A question with no relevant entry in the index is one too.

The rule is a logistic regression (scikit-learn) on some of the features, standardised, fitted to
say whether the top hit is right; its probability is the ``confidence``. The threshold keeps a
promise, not an average (``search.studies.promise.Curve.guaranteed``): precision >= the target with a stated
probability, on questions of which an assumed share has no answer, resampling whole threads.
The plain cosine (``PLAIN``) is the rule unless the learned ``text,gap`` beats it on held-out
threads of the user's own labels (``choose_rule``): a rule that won on one data set need not win
on another (docs/abstention-guarantee.md).

Without labelled questions, ``calibrate --self`` makes them from the corpus (``self_observations``):
each distinct text, with a third of its words dropped (a crude paraphrase), is a question whose
right answer is that text's entries (answerable), and the same question with those entries left
out is one the index cannot answer.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np

from indexer.errors import BadInput
from indexer.progress import Progress, note
from search.read.components import groups
from search.read.confidence import (
    FEATURES,
    KEYWORD_FEATURES,
    NEIGHBOURS,
    Neighbourhood,
    Rule,
)
from search.read.hybrid import DENSE, HYBRID
from search.read.queries import Query
from search.read.reranked import Reranking
from search.read.snapshot import Plan, Snapshot
from search.studies.labels import held
from search.studies.promise import (
    GUARANTEE,
    HALF,
    MIN_THREADS,
    TARGETS,
    UNANSWERABLE,
    Curve,
    check_share,
    weighted_precision,
)

PLAIN = ("text",)
"""A cosine alone, each entry's own text's (its score unless the index scores a second text: for
an FAQ indexed with its answers, the question's, which tells near-duplicate questions apart
better): the rule kept unless the learned one wins on held-out threads (``choose_rule``)."""
LEARNED = ("text", "gap")
"""The learned rule ``evaluate abstention`` holds against the plain one by default."""
KEYWORDS = ("text", "gap", "keyword", "agree")
"""The learned rule with the keyword evidence (keyword and hybrid mode, ``--features``). Not a
candidate of ``choose_rule``: on StackFAQ dev its held-out halves (12 threads) chose it on 11 of
20 splits, it answered no more than ``LEARNED`` and kept the promise on fewer
(docs/abstention-guarantee.md)."""
DEFAULT_FEATURES = PLAIN
CANDIDATES = (PLAIN, LEARNED)
"""The rules ``choose_rule`` holds against each other in every mode, the plain one first."""
NAMES = {PLAIN: "plain", LEARNED: "learned"}


def check_features(names: Sequence[str] | None, mode: str = DENSE) -> tuple[str, ...]:
    """The features asked for (None: ``DEFAULT_FEATURES``), each known and read in ``mode``
    (a dense ranking has no keyword evidence)."""
    if names is None:
        return DEFAULT_FEATURES
    known = [n for n in FEATURES if mode != DENSE or n not in KEYWORD_FEATURES]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise BadInput(
            f"confidence features in {mode} mode: choose among {', '.join(known)} (not {', '.join(unknown)})"
        )
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
    cluster: int = 0  # questions of one thread (or made from one text) share it: the unit resampled
    hidden: bool = False  # an answerable question asked again with its answers hidden


def threads(qrels: Mapping[str, Mapping[str, int]]) -> list[tuple[set[str], set[str]]]:
    """Questions and entries linked by judgements, as (question ids, entry ids) per connected
    component: a FAQ thread, removed or kept whole so no paraphrase leaks across a split.
    Threads come in the order of their smallest entry id."""
    links = [("q:" + question, "d:" + doc) for question, docs in qrels.items() for doc in docs]
    return [
        ({n[2:] for n in nodes if n[0] == "q"}, {n[2:] for n in nodes if n[0] == "d"})
        for nodes in groups([q for q, _ in links], [d for _, d in links])
    ]


def observe(
    question_ids: Sequence[str],
    neighbourhoods: Sequence[Neighbourhood],
    ids: Mapping[int, str],
    qrels: Mapping[str, Mapping[str, int]],
    indexed: Mapping[str, int],
    removed: Collection[int] = (),
) -> list[Observation]:
    """Label each question: answerable if a relevant entry is indexed, correct if its top hit is
    relevant. An answerable question is seen twice: as asked, and with its relevant entries
    hidden from its neighbourhood (one the index cannot answer), so labels that are all
    answerable still teach the rule to abstain. ``ids``: row id -> external id of every
    neighbour; ``indexed``: external id -> row id of the judged entries the index holds;
    ``removed``: row ids seen as absent from the index (a held-out evaluation)."""
    if not set(indexed).intersection(doc for judged in qrels.values() for doc in judged):
        raise BadInput("the qrels name none of the index's entries: are they for this corpus?")
    cluster = {q: number for number, (questions, _) in enumerate(threads(qrels)) for q in questions}
    seen = []
    for question, near in zip(question_ids, neighbourhoods, strict=True):
        relevant = qrels.get(question, {})
        rows = {indexed[doc] for doc in relevant if doc in indexed and indexed[doc] not in removed}
        unit = cluster.get(question, len(cluster) + len(seen))
        asked = near.first(NEIGHBOURS, removed=removed)
        if asked.rowids:
            top = ids.get(asked.rowids[0])
            seen.append(Observation(asked.features(1)[0], bool(rows), bool(rows) and top in relevant, unit))
        hidden = near.first(NEIGHBOURS, removed={*removed, *rows})
        if rows and hidden.rowids:
            seen.append(Observation(hidden.features(1)[0], False, False, unit, hidden=True))
    return seen


def fittable(seen: Sequence[Observation]) -> tuple[np.ndarray, np.ndarray]:
    """Whether each question's top hit is right and whether it is answerable, where a rule can be
    fitted on them; else one line saying what is missing."""
    correct = np.array([o.correct for o in seen], dtype=bool)
    answerable = np.array([o.answerable for o in seen], dtype=bool)
    if not answerable.any():
        raise BadInput("no calibration question is answerable (none has a relevant entry in the index)")
    if not correct.any():
        raise BadInput("cannot learn when to abstain: no calibration question's top hit is right")
    if answerable.all():
        raise BadInput(
            "cannot learn when to abstain: every calibration question is answerable and none could be "
            "asked with its answers hidden (the index needs at least two distinct texts)"
        )
    threads = len({o.cluster for o in seen})
    if threads < MIN_THREADS:
        raise BadInput(
            f"cannot promise a precision from questions on {threads} threads (distinct answers): "
            f"give labelled questions on at least {MIN_THREADS}"
        )
    return correct, answerable


def fit_rule(
    seen: Sequence[Observation],
    precision: float = 0.95,
    features: Sequence[str] | None = None,
    guarantee: float = GUARANTEE,
    unanswerable: float = UNANSWERABLE,
) -> Rule:
    """The logistic rule on ``features`` and the lowest threshold at which the answered questions
    reach ``precision`` with probability ``guarantee`` (``guaranteed_threshold``), unanswerable
    questions weighted to make up the share ``unanswerable``."""
    from sklearn.linear_model import LogisticRegression

    precision = check_precision(precision)
    features = check_features(features, HYBRID)  # every feature: the caller checks its mode reads them
    check_share("the guarantee", guarantee)
    check_share("the unanswerable share", unanswerable)
    correct, answerable = fittable(seen)
    rows = np.array([o.features for o in seen])[:, [FEATURES.index(n) for n in features]]
    mean, scale = rows.mean(axis=0), rows.std(axis=0)
    scale[scale == 0] = 1.0
    weight = np.where(
        answerable, 1.0, unanswerable / (1 - unanswerable) * answerable.sum() / (~answerable).sum()
    )
    model = LogisticRegression().fit((rows - mean) / scale, correct, sample_weight=weight)
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
    clusters = np.unique([o.cluster for o in seen], return_inverse=True)[1]
    curve = Curve(confidence, correct, answerable, clusters, unanswerable)
    threshold, bound = curve.guaranteed(precision, guarantee)
    if threshold is None:
        raise BadInput(
            f"these {len(seen)} questions ({clusters.max() + 1} threads) cannot promise precision "
            f"{precision:g} with {guarantee:.0%} confidence (at best {bound:.3f}): give more labelled "
            "questions, on more entries, or ask for a lower --min-precision or --guarantee"
        )
    unguarded = curve.unguarded(precision)
    answered = confidence >= threshold
    targets, labels_needed = {*TARGETS, precision}, None
    if curve.coverage(threshold) < HALF:  # say what answers more: a looser target, or more labels
        looser = curve.looser_target(precision, guarantee)
        targets |= {looser} if looser is not None else set()
        labels_needed = curve.questions_for(precision, guarantee, sum(not o.hidden for o in seen))
    return Rule(
        **{
            **asdict(rule),
            "threshold": threshold,
            "precision": weighted_precision(answered, correct, answerable, unanswerable),
            "coverage": float(answered[answerable].mean()),
            "guarantee": guarantee,
            "unanswerable": unanswerable,
            "bound": bound,
            "unguarded_coverage": float((confidence[answerable] >= unguarded).mean()),
            "features": features,
            "costs": curve.costs(sorted(targets), guarantee),
            "labels_needed": labels_needed,
        }
    )


def choose_rule(
    seen: Sequence[Observation],
    precision: float = 0.95,
    guarantee: float = GUARANTEE,
    unanswerable: float = UNANSWERABLE,
) -> Rule:
    """The plain cosine threshold, unless the learned rule (``CANDIDATES``) beats it on
    threads it was not fitted on: the threads are cut in two, each rule is fitted on one half and
    measured on the other (both ways). A learned one beats the best so far only if it answers
    more of the held-out answerable questions, at a held-out precision that reaches the target
    (or the other's, if that misses it): never for a lower held-out coverage (a rule answering
    nothing keeps any precision vacuously), nor one that, fitted on everything, answers less
    than the plain rule with the same promise. The winner is fitted on everything and says why
    (``Rule.why``). Too few threads to cut in two (``MIN_THREADS`` each): plain."""
    units = sorted({o.cluster for o in seen})
    if len(units) < 2 * MIN_THREADS:
        rule = fit_rule(seen, precision, PLAIN, guarantee, unanswerable)
        return replace(rule, why=f"plain: too few threads ({len(units)}) to hold a learned rule against it")
    half = set(np.random.default_rng(0).permutation(units)[: len(units) // 2].tolist())
    held: dict[tuple[str, ...], list[tuple[float, float]]] = {features: [] for features in CANDIDATES}
    for fitted_half in (True, False):
        fit_on = [o for o in seen if (o.cluster in half) == fitted_half]
        test = [o for o in seen if (o.cluster in half) != fitted_half]
        correct = np.array([o.correct for o in test])
        answerable = np.array([o.answerable for o in test])
        for features in held:
            try:
                rule = fit_rule(fit_on, precision, features, guarantee, unanswerable)
            except BadInput:
                held[features].append((1.0, 0.0))
                continue
            answered = rule.confidence(np.array([o.features for o in test])) >= rule.threshold
            scored = weighted_precision(answered, correct, answerable, unanswerable)
            held[features].append((scored, float(answered[answerable].mean())))
    measured = {features: tuple(np.mean(runs, axis=0).tolist()) for features, runs in held.items()}

    def beats(one: tuple[str, ...], other: tuple[str, ...]) -> bool:
        (one_precision, one_coverage), (other_precision, other_coverage) = measured[one], measured[other]
        return one_coverage > other_coverage and one_precision >= min(precision, other_precision) - 1e-9

    chosen = PLAIN
    for features in held:
        chosen = features if beats(features, chosen) else chosen
    plain_precision, plain_coverage = measured[PLAIN]
    told = "; ".join(
        f"{NAMES[f]} vs plain held-out coverage {c:.3f} vs {plain_coverage:.3f}, "
        f"precision {p:.3f} vs {plain_precision:.3f}"
        for f, (p, c) in measured.items()
        if f != PLAIN
    )
    rule = fit_rule(seen, precision, chosen, guarantee, unanswerable)
    if chosen != PLAIN:  # and on all the labels, with the same promise, it must not answer less
        try:
            plain = fit_rule(seen, precision, PLAIN, guarantee, unanswerable)
        except BadInput:  # the plain rule cannot keep the promise at all: the learned one stands
            plain = None
        if plain is not None and rule.coverage < plain.coverage:
            told += f"; fitted on all {len(units)} threads it answers {rule.coverage:.3f}"
            told += f" vs {plain.coverage:.3f}"
            chosen, rule = PLAIN, plain
    why = f"{'plain' if chosen == PLAIN else 'learned ' + ','.join(chosen)}: {told}"
    return replace(rule, why=why)


def embedded(
    snapshot: Snapshot, questions: Sequence[str], progress: bool, what: str = "questions"
) -> np.ndarray:
    """Questions embedded into the snapshot's space, with a bar of their own named ``what``."""
    with Progress(len(questions), what, enabled=progress) as bar:
        return snapshot.embed(questions, progress=bar.step(len(questions)))


def fitting_plan(
    snapshot: Snapshot, texts: Sequence[str], count: int, mode: str, reranking: Reranking | None = None
) -> Plan:
    """The search a rule is fitted on: each question's ``count`` nearest in ``mode``, or
    (``reranking``) the first stage's best ``max(count, depth)`` re-ordered by the reranker, as a
    reranked search orders them (``Snapshot.neighbourhoods``): the score the rule then reads is
    the reranker's."""
    return replace(snapshot.plan(texts, count, mode=mode, fitting=True), reranking=reranking)


RERANKED_AT_ONCE = 64
"""Questions a study's reranked search runs in one call (their pairs scored in one batch), between
moves of its progress bar."""


def neighbourhoods_of(
    snapshot: Snapshot, plan: Plan, vectors: np.ndarray, progress: bool
) -> list[Neighbourhood]:
    """``Snapshot.neighbourhoods`` of ``plan``, a reranked one a few questions at a time under a
    bar of its own (the reranker's work is most of a reranked study's)."""
    if plan.reranker is None:
        return snapshot.neighbourhoods(plan, vectors)
    found: list[Neighbourhood] = []
    queries = plan.request.queries
    with Progress(len(queries), "reranking", enabled=progress) as bar:
        for start in range(0, len(queries), RERANKED_AT_ONCE):
            part = replace(
                plan, request=replace(plan.request, queries=queries[start : start + RERANKED_AT_ONCE])
            )
            found += snapshot.neighbourhoods(part, vectors[start : start + len(part.queries)])
            bar.step(len(part.queries))(1.0)
    return found


def observations(
    snapshot: Snapshot,
    questions: Sequence[Query],
    qrels: Mapping[str, Mapping[str, int]],
    *,
    mode: str = DENSE,
    progress: bool = False,
    reranking: Reranking | None = None,
    vectors: np.ndarray | None = None,
) -> list[Observation]:
    """Every question searched in ``snapshot`` in ``mode`` (reranked by ``reranking``) and labelled
    by ``qrels`` (``observe``); ``vectors``: the questions embedded already."""
    if not questions:
        raise BadInput("no calibration questions")
    judged = list(dict.fromkeys(doc for docs in qrels.values() for doc in docs))
    indexed = snapshot.holding(judged)
    missing = held(judged, indexed, "questions judged only against them are read as ones it cannot answer")
    if missing:
        note(missing)
    most = max(sum(doc in indexed for doc in qrels.get(q.id, {})) for q in questions)
    texts = [q.text for q in questions]
    plan = fitting_plan(snapshot, texts, NEIGHBOURS + snapshot.largest_group() + most, mode, reranking)
    vectors = embedded(snapshot, texts, progress) if vectors is None else vectors
    near = neighbourhoods_of(snapshot, plan, vectors, progress)
    ids = snapshot.ids(sorted({r for n in near for r in n.rowids}))
    return observe([q.id for q in questions], near, ids, qrels, indexed)


def described_labels(seen: Sequence[Observation], left_out: int = 0) -> str:
    """What a rule fitted on labelled questions was measured on, for ``info``."""
    asked = [o for o in seen if not o.hidden]
    unanswerable = sum(not o.answerable for o in asked)
    unjudged = f"; {left_out} unjudged left out" if left_out else ""
    return (
        f"{len(asked)} labelled questions on {len({o.cluster for o in asked})} threads "
        f"({unanswerable} without an answer in the index{unjudged}), each answerable one also asked "
        "with its answers hidden"
    )


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
    snapshot: Snapshot,
    seed: int = 0,
    limit: int = SELF_QUESTIONS,
    *,
    mode: str = DENSE,
    progress: bool = False,
    reranking: Reranking | None = None,
) -> list[Observation]:
    """Labelled questions made from the index's own texts (see the module doc): two observations
    per distinct text, one answerable, one not (each text its own cluster); searched in ``mode``,
    reranked by ``reranking``."""
    texts = snapshot.texts()
    if len(texts) < 2:
        raise BadInput("calibrating on the corpus itself needs at least 2 distinct texts")
    rng = np.random.default_rng(seed)
    groups = sorted(texts)
    if len(groups) > limit:
        groups = sorted(rng.choice(groups, size=limit, replace=False).tolist())
    questions = [paraphrase(texts[g], rng) for g in groups]
    plan = fitting_plan(snapshot, questions, NEIGHBOURS + snapshot.largest_group(), mode, reranking)
    near = neighbourhoods_of(snapshot, plan, embedded(snapshot, questions, progress, "paraphrases"), progress)
    seen = []
    for unit, (group, full) in enumerate(zip(groups, near, strict=True)):
        for answerable, row in ((True, full.first(NEIGHBOURS)), (False, full.first(NEIGHBOURS, group))):
            if row.rowids:
                correct = answerable and row.groups[0] == group
                seen.append(Observation(row.features(1)[0], answerable, correct, unit))
    return seen
