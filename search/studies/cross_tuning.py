"""``semsearch tune --cross-encoder``: a reranker trained as it will be used, and measured against
the first stage it re-orders before anyone is told to use it.

Ranking labels (questions with qrels, an FAQ, and 0/1 pairs grouped by question as WikiQA's)
train on each question's right entries and on negatives of two kinds: the ones the labels give
(a question's own wrong sentences) and the ones the first stage puts near the top of the whole
candidate pool (``mine``), as sentence-transformers' ``mine_hard_negatives`` does: a reranker
trained on given negatives alone has never seen an off-topic text, and ranks one first. Questions
grouped with their answers also train on lists of each other (``question_lists``): none answers
another, and an index of questions would otherwise be read as if any might.

The held-back questions are measured at the depth a search reranks (``DEPTH``): the first stage
alone, the reranker alone, and the two scores fused with one weight (``Fusion``), fitted on those
questions; a weight where the reranker does not help goes to 0, the first stage's order. The
report says plainly when the reranker does not beat the first stage, and its folder then records
weight 0 so that no search ranks below the first stage with it. Scored pairs are compared with
the bi-encoder's cosine as a pair scorer.

``--max-minutes`` holds the whole command: reading the model, mining, the measurements and the
training; the held-back share is cut to what a few measurements can score in that time.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from indexer.embedding.strategy import Strategy
from indexer.encoders.options import EmbeddingOptions
from indexer.errors import BadInput
from indexer.files import staged_dir
from search.read.hybrid import RERANK_DEPTH
from search.studies.cross_held import RANKED_AT_ONCE, HeldBack, Measured, Mined, Scores, held_back_set
from search.studies.tuning import (
    K,
    Labels,
    TuneReport,
    hold_back,
    new_or_empty,
    training_precision,
)

if TYPE_CHECKING:
    from indexer.encoders.cross_training import CrossModel, PairRows, RankingRows

DEPTH = RERANK_DEPTH
"""The first stage's best candidates a held-back question has reordered: a search's default."""
NEGATIVES = 4
"""Hard negatives mined per training question from the first stage's best (each a pair of target 0)."""
MINED_FROM = 20
"""The mined negatives are drawn from this many of the first stage's best wrong candidates: the
very top holds the texts most like a right one, and the labels may miss a right one there."""
GIVEN = 4
"""The labels' own negatives kept per training question (drawn at random, the rest left)."""
CROSS_HELD_BACK = 0.2
"""A reranker's default held-back share (cut to fit ``--max-minutes``), twice a bi-encoder's: its
verdict compares it with the first stage question by question, and on WikiQA's train split the
bi-encoder's share held back about 90 answered questions, too few to tell a gain of 2-4 MRR@10 points
from chance."""
MEASURING = 0.3
"""The share of ``--max-minutes`` the held-back measurements may take together; a larger
held-back share is cut to fit."""
MEASUREMENTS = 5
"""The measurements of the answered held-back questions a run is reckoned to make (before, then
twice an epoch until the held-back metric stops rising or the time is spent); the unanswered
ones are measured once, for the kept checkpoint."""
MIN_MEASURED = 20
"""Below this many held-back questions the verdict is said to rest on few."""
NEW_HEAD_RATE = 6e-5
"""Peak learning rate for a new head on an encoder: at equal steps (150 of 2 lists, WikiQA train's
held-back share) the reranker alone reached MRR@10 35.7 at 6e-5, 31.8 at 1e-4 and 13.6 at 2e-5."""
CONTINUED_RATE = 2e-5
"""Peak learning rate for a reranker trained on (sentence-transformers' default)."""


def grouped(labels: Labels) -> Labels:
    """Scored pairs whose scores are all 0 or 1 and whose first texts repeat (a question and each
    sentence of its paragraph, as WikiQA's) as ranking labels: each question ranks every distinct
    second text, its 1s relevant, its 0s given negatives; a question with no 1 is kept as an
    unanswered one (trained on its negatives; measured for the top score's separation). Other
    labels are returned as they are."""
    from search.studies.tuning import components

    if labels.scores is None or not set(np.unique(labels.scores).tolist()) <= {0.0, 1.0}:
        return labels
    if len(set(labels.first)) == len(labels.first):
        return labels
    edges = list(zip(labels.first, labels.second, strict=True))
    pieces = components(edges)
    candidates = list(dict.fromkeys(labels.second))
    position = {text: i for i, text in enumerate(candidates)}
    relevant: dict[str, set[int]] = {}
    negatives: dict[str, list[str]] = {}
    piece: dict[str, int] = {}
    for (a, b), score, p in zip(edges, labels.scores.tolist(), pieces.tolist(), strict=True):
        piece.setdefault(a, p)
        if score == 1.0:
            relevant.setdefault(a, set()).add(position[b])
        else:
            negatives.setdefault(a, []).append(b)
    positive = [i for i, s in enumerate(labels.scores.tolist()) if s == 1.0]
    if not positive:
        raise BadInput("0/1 pairs with no 1: a reranker needs at least some right answers to learn from")
    unanswered = {a: piece[a] for a in piece if a not in relevant}
    return Labels(
        "questions with 0/1 answers",
        [labels.first[i] for i in positive],
        [labels.second[i] for i in positive],
        pieces[positive],
        candidates=candidates,
        relevant=relevant,
        mine_negatives=True,
        rejected=labels.rejected,
        negatives=negatives,
        unanswered=unanswered,
    )


def training_rows(labels: Labels, held: HeldBack, mined: Mined | None, seed: int) -> PairRows | RankingRows:
    """The pairs not held back as a reranker's training rows: scored pairs with their score scaled
    to [0, 1]; otherwise one list per right text of a question: the right text, then up to
    ``NEGATIVES`` wrong ones mined from the first stage's best ``MINED_FROM`` over the whole pool
    (off-topic texts too) and up to ``GIVEN`` of the question's given negatives; a question with
    no answer gives one list of negatives alone. Nothing held back is trained on."""
    from indexer.encoders.cross_training import PairRows, RankingRows

    rows = np.flatnonzero(~held.mask)
    first, second = [labels.first[i] for i in rows], [labels.second[i] for i in rows]
    if labels.scores is not None:
        low, high = float(labels.scores.min()), float(labels.scores.max())
        return PairRows(first, second, ((labels.scores[rows] - low) / (high - low)).tolist())
    assert mined is not None and labels.candidates is not None and labels.relevant is not None
    rng = random.Random(seed)
    anchors = list(dict.fromkeys(first)) + [a for a in labels.unanswered or {} if a not in held.questions]
    top, _ = mined.ranked(anchors, MINED_FROM + 4 * K)
    negatives: dict[str, list[str]] = {}
    for anchor, row in zip(anchors, top, strict=True):
        right = {labels.candidates[c] for c in labels.relevant.get(anchor, ())} | {anchor}
        wrong = [t for t in (mined.texts[c] for c in row) if t not in right and t not in held.texts]
        given = [
            t for t in (labels.negatives or {}).get(anchor, []) if t not in right and t not in held.texts
        ]
        chosen = rng.sample(wrong[:MINED_FROM], min(NEGATIVES, len(wrong[:MINED_FROM])))
        chosen += rng.sample(given, min(GIVEN, len(given)))
        negatives[anchor] = list(dict.fromkeys(chosen))
    lists = [[text, *negatives[anchor]] for anchor, text in zip(first, second, strict=True)]
    quiet = [a for a in anchors if a not in labels.relevant and negatives[a]]
    questions, lists = first + quiet, lists + [negatives[a] for a in quiet]
    answered = [True] * len(first) + [False] * len(quiet)
    teacher = mined.cosines(questions, lists)
    asking, near, cosines = question_lists(labels, anchors, mined)
    answered += [False] * len(asking)
    return RankingRows(questions + asking, lists + near, answered, teacher + cosines)


KIN = 2
"""Other questions in a training question's list of questions (``question_lists``)."""


def question_lists(
    labels: Labels, anchors: list[str], mined: Mined
) -> tuple[list[str], list[list[str]], list[list[float]]]:
    """For each training question (``anchors``) of answers grouped by question, a list of the
    ``KIN`` other training questions the first stage puts nearest it, with their cosines: none
    answers it (a list with no right text, trained to score low and, by the listwise target's
    share, to keep the first stage's order). Labels of questions and their answers show a reranker
    no text that asks rather than answers; an index of questions (an FAQ) then hands it nothing
    but those, and it scores them at random. None for other labels, nor where a question of the
    labels is also one of their texts (questions matched to questions, duplicates among them): a
    question near another may be its right text there."""
    asked = set(labels.relevant or {}) | set(labels.unanswered or {})
    unique = list(dict.fromkeys(anchors))
    if labels.negatives is None or asked & set(labels.candidates or ()) or len(unique) <= KIN:
        return [], [], []
    asked, texts = mined.questions(unique), np.asarray(mined.embed(unique, role="passage"))
    near: list[list[str]] = []
    cosines: list[list[float]] = []
    for start in range(0, len(unique), RANKED_AT_ONCE):  # memory: a block's row of cosines each
        block = asked[start : start + RANKED_AT_ONCE] @ texts.T
        block[np.arange(len(block)), np.arange(start, start + len(block))] = -np.inf  # not itself
        top = np.argsort(-block, axis=1, kind="stable")[:, :KIN]
        near += [[unique[j] for j in row] for row in top]
        cosines += np.take_along_axis(block, top, axis=1).tolist()
    return unique, near, cosines


def _pairs_per_second(cross: CrossModel, labels: Labels) -> float:
    """How fast the reranker being trained scores pairs here, from a small sample."""
    sample = list(zip(labels.first, labels.second, strict=True))[:48]
    cross.scores(sample[:8])  # warm-up
    began = time.monotonic()
    cross.scores(sample)
    return len(sample) / max(time.monotonic() - began, 1e-6)


def sized_share(labels: Labels, share: float, max_minutes: float | None, pairs_per_second: float) -> float:
    """The held-back share, cut so that ``MEASUREMENTS`` measurements of its answered questions and
    one of its unanswered ones at ``DEPTH`` take at most ``MEASURING`` of ``max_minutes`` (scored
    pairs: one pair per label), but never below ``MIN_MEASURED`` answered questions: only they
    judge whether the reranker ranks right texts higher (unanswered ones judge the top score's
    separation alone)."""
    if max_minutes is None:
        return share
    if labels.scores is not None:
        answered, pairs = len(labels.first), MEASUREMENTS * len(labels.first)
    else:
        answered = len(set(labels.first))
        pairs = DEPTH * (MEASUREMENTS * answered + len(labels.unanswered or {}))
    fits = MEASURING * max_minutes * 60 * pairs_per_second / max(pairs, 1)
    return max(min(share, fits), min(share, MIN_MEASURED / max(answered, 1)))


def kept_for_last(held: HeldBack, pairs_per_second: float) -> float:
    """Seconds kept at the end of ``--max-minutes`` for the unanswered held-back questions' pairs
    (scored once, after training), with ``MARGIN`` to spare."""
    from indexer.encoders.training import MARGIN

    left = len(held.pairs()) - len(held.pairs(answered_only=True))
    return MARGIN * left / max(pairs_per_second, 1e-6)


def cross_tune(
    labels: Labels,
    output: str | Path,
    model: str | None = None,
    first_stage: Strategy | None = None,
    *,
    held_back: float = CROSS_HELD_BACK,
    epochs: int = 4,
    max_minutes: float | None = None,
    seed: int = 0,
    batch_size: int = 16,
    learning_rate: float | None = None,
    max_length: int | None = None,
    progress: bool = False,
    report: Callable[[str], object] = lambda line: None,
    options: EmbeddingOptions | None = None,
) -> TuneReport:
    """Train a cross-encoder (a reranker) from ``model`` (default: the bundled encoder, given a
    new one-label head; a cross-encoder folder trains on) on ``labels``, holding back a share of
    them by group, and save the best checkpoint to ``output`` as a sentence-transformers
    CrossEncoder folder, with the measured verdict and fused weight in its ``semsearch.json``.
    Ranking labels are mined and measured through ``first_stage`` (a bi-encoder strategy, default
    the index's default); scored pairs are compared with its cosine. ``batch_size``: the pairs a
    step reads (a question's list counts its pairs). ``learning_rate`` None: ``NEW_HEAD_RATE`` for a
    new head, ``CONTINUED_RATE`` for a reranker trained on. The best checkpoint is the one the reranker
    alone ranks best (``CrossEncoderRerankingEvaluator``'s choice): the fused score is floored at
    the first stage, so keeping by it would keep an untrained head whenever fusing gains nothing."""
    from indexer.encoders.cross_training import fine_tune_cross, load_cross, save_cross
    from indexer.encoders.factory import encoder_for
    from indexer.encoders.training import Budget

    started = time.monotonic()
    Budget(epochs, max_minutes)  # its limits checked before the model loads and labels are mined
    output = Path(output)
    options, mixed = training_precision(options)
    labels = grouped(labels)
    with staged_dir(output, new_or_empty) as staging:  # claimed now: a second tune to it stops here
        # a model that cannot load stops here, before any training row is made
        cross = load_cross(model, max_length, options.placement.device, mixed, seed)
        speed = _pairs_per_second(cross, labels)
        share = sized_share(labels, held_back, max_minutes, speed)
        if share < held_back:
            report(f"held-back share cut to {share:.3f} so that its measurements fit --max-minutes")
        embed = encoder_for(first_stage, options).embed
        mined = None if labels.scores is not None else Mined.of(labels, embed, progress)
        held = held_back_set(labels, hold_back(labels, share, seed), mined, embed, DEPTH, seed)
        rows = training_rows(labels, held, mined, seed)
        pairs = getattr(rows, "pairs", len(rows))
        report(
            f"{labels.kind}: {int((~held.mask).sum())} trained on "
            f"({len(rows)} training rows, {pairs} pairs), "
            f"{held.size} held back ({held.metric} x100)"
        )
        first = held.first_stage()
        report(f"held-back {held.metric} of the first stage alone: {first.line(held.metric)}")
        _check_worth(held, first, started, max_minutes)
        per_step = max(2, round(batch_size * len(rows) / pairs))
        rate = learning_rate or (CONTINUED_RATE if cross.continued else NEW_HEAD_RATE)
        last = kept_for_last(held, speed)
        budget = Budget(epochs, max_minutes, per_step, rate, seed, started=started, after=last)
        judge = Judged(held, progress)
        outcome = fine_tune_cross(cross, rows, judge, budget, progress=progress, report=report)
        verdict = judge.kept(outcome.best, cross.scores)
        facts = {
            "tuned_from": cross.source,
            "labels": labels.kind,
            "held_back": {
                "pairs": held.size,
                "metric": held.metric,
                "before": outcome.before,
                "after": outcome.best,
            },
            "fusion": verdict.stored(first),
        }
        save_cross(cross, staging, facts)
    head = "its head trained on" if cross.continued else "a new one-label head"
    said = f"cross-encoder from {cross.source} ({head}), pairs of at most {cross.max_length} tokens"
    counts = (int((~held.mask).sum()), held.size)
    done = TuneReport.of(output, labels, counts, outcome, said, "", reranker=True, first_stage=first.headline)
    return replace(done, verdict=verdict.lines(first), helps=verdict.helps(first), weight=verdict.weight)


Pair = tuple[str, str]


class Judged:
    """The held-back measure training reads: the reranker alone's headline on the answered
    questions (early stopping keeps the checkpoint the reranker ranks best by; unanswered
    questions judge only the top score's separation), each measurement's pair scores kept so that
    the kept checkpoint's verdict scores only the unanswered questions' pairs, once, after training."""

    def __init__(self, held: HeldBack, progress: bool):
        self.held, self.progress = held, progress
        self.seen: list[tuple[Measured, dict[Pair, float]]] = []

    def __call__(self, score: Callable[..., np.ndarray]) -> float:
        scored = self._scored(score, self.held.pairs(answered_only=True), {})
        measured = self.held.judged(scored, whole=False)
        self.seen.append((measured, scored))
        return measured.reranked.headline

    def kept(self, best: float, score: Callable[..., np.ndarray]) -> Measured:
        """The verdict of the kept checkpoint (the loop keeps the first of equals), whose weights
        ``score`` runs: its measurement completed with the pairs not yet scored."""
        scored = next(pairs for measured, pairs in self.seen if measured.reranked.headline == best)
        left = [pair for pair in self.held.pairs() if pair not in scored]
        return self.held.judged(self._scored(score, left, scored) if left else scored)

    def _scored(
        self, score: Callable[..., np.ndarray], pairs: list[Pair], known: dict[Pair, float]
    ) -> dict[Pair, float]:
        from indexer.progress import Progress

        with Progress(len(pairs), "measuring held-back", enabled=self.progress, unit="pair") as bar:
            values = np.asarray(score(pairs, progress=bar.step(len(pairs))), dtype=np.float64).tolist()
        return {**known, **dict(zip(pairs, values, strict=True))}


def _check_worth(held: HeldBack, first: Scores, started: float, max_minutes: float | None) -> None:
    """Stop before training where it cannot help: the first stage already at the ceiling on the
    held-back questions, or the time asked spent before a step (mining a large pool)."""
    if held.at_ceiling(first):
        raise BadInput(
            f"the first stage already ranks every held-back question's right entry first "
            f"({held.metric} 100 on {held.size}): a reranker cannot do better here; nothing trained"
        )
    spent = (time.monotonic() - started) / 60
    if max_minutes is not None and spent >= max_minutes:
        raise BadInput(
            f"--max-minutes {max_minutes:g} spent reading, mining and measuring ({spent:.1f} min) "
            "before a training step: give more minutes; nothing trained"
        )


def report_of(done: TuneReport) -> list[str]:
    """What the command prints after a reranker trained: the verdict, then advice only where it helps."""
    lines = list(done.verdict or [])
    if done.helps:
        lines.append(
            f"saved {done.output}: a reranker ({done.strategy}), its score fused with the first stage's "
            f"at weight {done.weight:.2f}: semsearch query INDEX QUESTION --rerank {done.output}"
        )
        lines.append(
            "that weight was fitted on held-back questions of these labels; an index of other texts "
            "(questions matched to questions, say) fits its own on its labelled questions: "
            f"semsearch calibrate INDEX --rerank {done.output} --queries Q --qrels QRELS"
        )
    else:
        lines.append(
            f"saved {done.output} for study only: it does not beat the first stage it re-orders, so a "
            "search with it keeps the first stage's order (weight 0); not advised"
        )
    return lines
