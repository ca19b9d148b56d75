"""The per-query confidence rule (the read side): a hit's features from the query's
neighbourhood and the stored ``Rule`` that turns them into a ``confidence`` and ``answered``. The
engine imports this; fitting and storing a rule is ``search.studies.calibration``, which sits above the
engine.

A hit's features come from the query's neighbourhood (the nearest ``NEIGHBOURS`` entries):

- ``score``: its cosine;
- ``margin``: its cosine minus the best cosine of an entry with another text (entries with the
  same embedded text, e.g. one FAQ question with several answers, are one candidate answer);
- ``zscore``: its cosine against the query's own neighbour distribution (the best cosine of each
  distinct text in the neighbourhood): how far it stands out of the crowd;
- ``gap``: its cosine minus the mean of the best cosines of the next nine distinct texts (rank
  based: a right answer stands above the rest, a question with no answer finds a flat field);
- ``text``: its cosine to the entry's own text alone. The same as ``score`` unless the index
  scores a second text per entry (``--also``): there the score mixes in the answer, which makes a
  near-duplicate FAQ question look as right as the right one, and the question's own cosine tells
  them apart better (docs/abstention-guarantee.md);
- ``keyword``: its keyword evidence (``search.read.hybrid``: the share of the query's words, by
  rarity, it holds), in a keyword or hybrid neighbourhood (0 in a dense one). In keyword mode
  ``score`` is the keyword score (BM25 over the most the query's words could give), which a rule
  stored before it was (``KEYWORD_SCORE``) was not fitted on: such a rule is not applied;
- ``agree``: its keyword evidence minus the best of an entry with another text: whether the
  keywords agree with the ranking's choice.

A neighbourhood is the ranking of the mode the rule serves (``Rule.mode``): in hybrid mode its
scores are the fused scores, its texts' cosines and keyword evidence ride along. A reranked search's
neighbourhood is its reranked candidates (the first stage's best ``rerank_depth``), scored by the
reranker (``text`` is that score too).

A rule is stored and applied under its key (``rule_key``): the mode it answers in and the score it
was fitted on (``Rule.score``): ``"dense"``, ``"keyword"``, ``"hybrid"`` for the first stage's
score, ``"<mode>+rerank:<fingerprint>"`` (``score_kind``) for a cross-encoder's re-ordering that
mode's candidates, the fingerprint its folder's (``indexer.embedding.cross_folder.CrossFolder``).
A search applies the rule of its own key alone: a rule fitted on another score (the first stage's
when reranked, another reranker's) is never applied, and ``unruled`` says so.

The rule is a logistic regression on some of these features, standardised: confidence =
sigmoid(weights . standardised features + bias), answered when it reaches the threshold.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from indexer.errors import BadInput
from search.read.hybrid import DENSE, HYBRID, KEYWORD

FEATURES = ("score", "margin", "zscore", "gap", "text", "keyword", "agree")
COSINES = frozenset({"score", "text", "keyword"})
"""Features a hit has by itself; the others need the query's neighbourhood."""
KEYWORD_FEATURES = frozenset({"keyword", "agree"})
"""Features only a keyword or hybrid neighbourhood has."""
KEYWORD_SCORE = "bm25-bound"
"""What a keyword-mode hit's score is (``search.read.hybrid``: its BM25 over the most the query's
words could give), marked on every rule fitted since (``Rule.keyword_score``). A keyword-mode rule
without it was fitted on the share, which keyword mode showed before: not applied (``in_force``)."""
GAP_TEXTS = 9
"""Distinct texts below a hit that ``gap`` compares it with."""
RERANKED = "rerank:"
"""How a rule key's score kind starts when a reranker's scores were fitted (``score_kind``)."""
NEIGHBOURS = 64
"""Entries looked at around each query to compute the features (a FAQ question may have two dozen
answers with one text: the margin needs an entry past them)."""


@dataclass(frozen=True)
class Neighbourhood:
    """A query's nearest distinct entries, best first: their row ids, scores and text hashes,
    (``texts``) each one's cosine to its own text where the score is not that cosine alone, and
    (``keywords``) each one's keyword evidence where the ranking read the keywords."""

    rowids: list[int]
    scores: np.ndarray
    groups: list[str]
    texts: np.ndarray | None = None
    keywords: np.ndarray | None = None

    @property
    def evidence(self) -> np.ndarray:
        """Each entry's keyword evidence (0 where the ranking did not read the keywords)."""
        return np.zeros(len(self.rowids)) if self.keywords is None else self.keywords

    @property
    def own(self) -> np.ndarray:
        """Each entry's cosine to its own text (its score, unless the index scores two texts)."""
        return self.scores if self.texts is None else self.texts

    def first(self, count: int, leave_out: str | None = None, removed: Collection[int] = ()) -> Neighbourhood:
        """The first ``count`` entries, with those of the text ``leave_out`` left out (as if the
        FAQ lacked it), and the entries ``removed`` (row ids) and every entry sharing a text with
        one of them (as if the FAQ lacked those answers)."""
        hidden = {g for r, g in zip(self.rowids, self.groups, strict=True) if r in removed}
        hidden.add(leave_out)
        kept = [i for i, g in enumerate(self.groups) if g not in hidden][:count]
        rowids, groups = [self.rowids[i] for i in kept], [self.groups[i] for i in kept]
        texts = None if self.texts is None else self.texts[kept]
        keywords = None if self.keywords is None else self.keywords[kept]
        return Neighbourhood(rowids, self.scores[kept], groups, texts, keywords)

    def features(self, count: int) -> np.ndarray:
        """One row of ``FEATURES`` for each of the first ``count`` entries."""
        return self.features_of(
            self.scores[:count], self.groups[:count], self.own[:count], self.evidence[:count]
        )

    def features_of(
        self, scores: np.ndarray, groups: Sequence[str], texts: np.ndarray, keywords: np.ndarray
    ) -> np.ndarray:
        """One row of ``FEATURES`` for each hit (its score, text hash and own text's cosine)
        against this neighbourhood, whether or not the hit is in it: a hit found under a filter is
        measured against the query's whole neighbourhood, so its confidence does not depend on the
        filter."""
        best: dict[str, float] = {}
        for group, score in zip(self.groups, self.scores.tolist(), strict=True):
            best.setdefault(group, score)
        matched: dict[str, float] = {}
        for group, evidence in zip(self.groups, self.evidence.tolist(), strict=True):
            matched[group] = max(matched.get(group, 0.0), evidence)
        distinct = np.array(list(best.values()))
        ranked = sorted(best.items(), key=lambda item: -item[1])
        spread = float(distinct.std()) if len(distinct) > 1 else 0.0
        floor = float(self.scores.min()) if len(self.scores) else 0.0
        rows = []
        cosines = np.asarray(scores, dtype=np.float64).tolist()
        own = np.asarray(texts, dtype=np.float64).tolist()
        evidence = np.asarray(keywords, dtype=np.float64).tolist()
        for score, group, text, word in zip(cosines, groups, own, evidence, strict=True):
            others = [s for g, s in ranked if g != group]
            z = (score - distinct.mean()) / spread if spread > 0 else 0.0
            below = np.mean(others[:GAP_TEXTS]) if others else floor
            rival = max((e for g, e in matched.items() if g != group), default=0.0)
            margin = score - (others[0] if others else floor)
            rows.append((score, margin, z, score - below, text, word, word - rival))
        return np.array(rows, dtype=np.float64).reshape(-1, len(FEATURES))


def score_kind(fingerprint: str | None) -> str:
    """The score a search shows: "" for the first stage's, ``rerank:<fingerprint>`` for the
    reranker's of that fingerprint."""
    return "" if fingerprint is None else RERANKED + fingerprint


def rule_key(mode: str, score: str = "") -> str:
    """The key a rule is stored and applied under: its mode, and its score kind (``score_kind``)
    where it is not the first stage's."""
    return f"{mode}+{score}" if score else mode


def unruled(rules: Mapping[str, Rule], mode: str, stale: Collection[str] = (), score: str = "") -> str | None:
    """One line where a search in ``mode`` showing ``score`` (``score_kind``) leaves its hits
    unmarked though the index keeps no-answer rules for other modes or scores (each answers by its
    own rule: ``rule_key``), or keeps one for it that is not applied (``stale``: fitted on a score
    the mode no longer shows, ``in_force``); None where it has a rule, or the index has none."""
    key = rule_key(mode, score)
    if key in rules or not rules and key not in stale:
        return None
    fit = f"fit one with `semsearch calibrate INDEX --mode {mode}` and your labelled questions (or --self)"
    if score:
        return (
            f"{mode} search reranked has no no-answer rule fitted on this reranker's scores (this index "
            f"has one for {', '.join(rules) or 'none'}, not applied to another score): its hits are not "
            "marked answered; fit one with the same reranker, or give --min-score on its scale"
        )
    if mode in stale:
        return (
            f"{mode} search has no no-answer rule in force (this index's {mode} rule was fitted on the "
            f"score {mode} search showed before, the share of the question's words, not on the one it "
            f"shows now): its hits are not marked answered; {fit}"
        )
    return (
        f"{mode} search has no no-answer rule (this index has one for {', '.join(rules)} search): its hits "
        f"are not marked answered; {fit}"
    )


FIRST_STAGE = (-1.0, 1.0)
"""The range of the first stage's score in every mode (``search.read.hybrid``): a cosine, a keyword
share in [0, 1], or the two fused."""
ACTIVATED: dict[str, tuple[float, float]] = {"sigmoid": (0.0, 1.0), "tanh": (-1.0, 1.0)}
"""The range of a reranker's score after its activation (``CrossFolder.activation``); one not here
(``identity``: the raw logit) has none."""


@dataclass(frozen=True)
class Scale:
    """The range of the scores a search shows and what they are: what a min score is checked
    against (``score_scale``). ``low`` and ``high`` None: any number (a reranker's raw logit)."""

    low: float | None
    high: float | None
    what: str

    def refusal(self, min_score: float) -> str | None:
        """Why ``min_score`` is no threshold on these scores ("must be in ..."), None where it is one."""
        if self.low is None or self.high is None or self.low <= min_score <= self.high:
            return None
        return f"must be in [{self.low:g}, {self.high:g}] ({self.what}), not {min_score}"


def score_scale(activation: str | None = None, weight: float = 1.0) -> Scale:
    """The scale of a search's scores: the first stage's (``activation`` None), else a reranker's
    after its ``activation`` fused with the first stage's at ``weight``
    (``search.read.reranked.fused``): a sigmoid's [0, 1] alone at weight 1, [w - 1, 1] at weight w."""
    if activation is None:
        return Scale(*FIRST_STAGE, "the scale of every mode's score")
    if weight == 0:
        return Scale(*FIRST_STAGE, "the first stage's score: the reranker is fused at weight 0")
    own = ACTIVATED.get(activation)
    if own is None:
        return Scale(None, None, f"the reranker's {activation} score")
    if weight == 1:
        return Scale(*own, f"the reranker's score, after its {activation}")
    low, high = (round(weight * a + (1 - weight) * b, 12) for a, b in zip(own, FIRST_STAGE, strict=True))
    fused = f"the reranker's {activation} score fused at weight {weight:g} with the first stage's"
    return Scale(low, high, fused)


def check_min_score(min_score: float | None, scale: Scale | None = None) -> None:
    """A threshold within the range of the score it thresholds (``scale``; None: the first
    stage's, in [-1, 1] in every mode), else one line naming that range."""
    refusal = None if min_score is None else (scale or score_scale()).refusal(min_score)
    if refusal is not None:
        raise BadInput(f"min score {refusal}")


@dataclass(frozen=True)
class Rule:
    """A fitted decision rule: confidence = sigmoid(weights . standardised features + bias);
    answered when confidence >= threshold. ``precision``/``coverage``: measured on the
    calibration questions at that threshold.

    The promise (``calibration.guaranteed_threshold``): with probability ``guarantee`` the
    precision of answered hits is at least ``target`` on questions like the calibration ones, of
    which a share ``unanswerable`` has no answer in the index. ``bound`` is the precision the
    calibration questions support at that level; ``unguarded_coverage`` the coverage a bare
    point estimate of the precision would have given (what the promise costs). A rule stored
    before the promise existed has ``guarantee`` 0."""

    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    weights: tuple[float, ...]
    bias: float
    threshold: float
    target: float
    precision: float
    coverage: float
    questions: int
    guarantee: float = 0.0
    unanswerable: float = 0.0
    bound: float = 0.0
    unguarded_coverage: float = 0.0
    source: str = "labels"
    measured_on: str = ""
    created: str = ""
    why: str = ""  # why these features: the learned rule against the plain one on held-out threads
    costs: tuple[tuple[float, float], ...] = ()  # (precision target, coverage) with the same guarantee
    labels_needed: int | None = None  # about how many labelled questions the target needs to answer half
    mode: str = DENSE  # the search mode whose ranking it was fitted on (``search.read.hybrid.MODES``)
    asked: int = 0  # labelled questions as asked (hidden copies aside); 0: made from the corpus
    asked_unanswerable: int = 0  # of them, those with no relevant entry in the index
    left_out: int = 0  # labelled questions left out: no relevant judgement, and none said they have no answer
    keyword_score: str = KEYWORD_SCORE  # the keyword-mode score it was fitted with; "": stored before
    score: str = ""  # the score it was fitted on (``score_kind``): "" the first stage's, else a reranker's

    @property
    def key(self) -> str:
        """Its key among an index's rules (``rule_key``)."""
        return rule_key(self.mode, self.score)

    @property
    def stale(self) -> bool:
        """Whether it is a keyword-mode rule fitted on the share (``KEYWORD_SCORE``): not applied."""
        return self.mode == KEYWORD and not self.score and self.keyword_score != KEYWORD_SCORE

    @property
    def reads_neighbours(self) -> bool:
        """Whether a hit's confidence needs the query's neighbourhood (any feature but a cosine)."""
        return not COSINES.issuperset(self.features)

    @property
    def thresholded(self) -> str:
        """What a one-feature rule's threshold reads, named: ``score`` is the mode's own score."""
        feature = self.features[0]
        if self.score:  # a reranked neighbourhood: score and text are the reranked score
            return "keyword evidence" if feature == "keyword" else "reranked score"
        own = {DENSE: "cosine", HYBRID: "hybrid score", KEYWORD: "keyword score"}.get(self.mode, "score")
        names = {"score": own, "text": "cosine of the entry's own text", "keyword": "keyword evidence"}
        return names[feature]

    def describe(self) -> str:
        """One line for ``info``: what the rule promises, what it costs, what it was measured on."""
        plain = len(self.features) == 1 and self.features[0] in COSINES
        rule = f"a threshold on the {self.thresholded} alone" if plain else "rule " + ",".join(self.features)
        promise = (
            f"precision >= {self.target:g} with {self.guarantee:.0%} confidence "
            f"(up to {self.unanswerable:.0%} of questions without an answer)"
            if self.guarantee
            else f"precision {self.target:g} (a point estimate, no guarantee)"
        )
        on = f" on {self.measured_on}" if self.measured_on else f" on {self.questions} questions"
        when = f", {self.created}" if self.created else ""
        refit = f"refit with `semsearch calibrate INDEX --mode {KEYWORD}`"
        stale = f"; not applied: fitted on the keyword share, {refit}" if self.stale else ""
        searched = f"{self.mode} search reranked ({self.score})" if self.score else f"{self.mode} search"
        described = f"{self.source}, {searched}: {rule}; {promise}; coverage {self.coverage:.2f}"
        return f"{described}{on}{when}{stale}"

    def confidence(self, rows: np.ndarray) -> np.ndarray:
        """Confidence of each row of ``FEATURES`` (as ``Neighbourhood.features`` gives them)."""
        chosen = rows[:, [FEATURES.index(name) for name in self.features]]
        z = (chosen - np.array(self.mean)) / np.array(self.scale) @ np.array(self.weights) + self.bias
        return 1 / (1 + np.exp(-z))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, stored: Mapping[str, Any]) -> Rule:
        fields = dict(stored)
        for name in ("features", "mean", "scale", "weights"):
            fields[name] = tuple(fields[name])
        fields["costs"] = tuple(tuple(pair) for pair in fields.get("costs", ()))
        fields.setdefault("keyword_score", "")  # stored before the mark: fitted on the share
        return cls(**fields)


def stored_rules(stored: Mapping[str, Any] | None) -> dict[str, Rule]:
    """The rules an index keeps, by key (``rule_key``: ``calibrate`` stores {key: rule}, one per
    mode and score, side by side). An index calibrated before that holds one rule: read as the
    rule of the mode it names (dense if it names none)."""
    if not stored:
        return {}
    if "features" in stored:
        rule = Rule.from_dict(stored)
        return {rule.key: rule}
    return {mode: Rule.from_dict(rule) for mode, rule in stored.items()}


def in_force(rules: Mapping[str, Rule]) -> dict[str, Rule]:
    """The ``rules`` a search applies: all but a keyword-mode rule fitted on the share
    (``Rule.stale``), which is as absent (``unruled`` says to refit it)."""
    return {mode: rule for mode, rule in rules.items() if not rule.stale}


def stored_form(rules: Mapping[str, Rule]) -> dict[str, Any]:
    """``rules`` as the index's meta (and ``info``) holds them: {key: the rule's fields}."""
    return {key: rule.to_dict() for key, rule in rules.items()}
