"""The verdict ``tune --cross-encoder`` and ``calibrate --rerank`` give a reranker: what its
held-back measurements score, how large a share it holds back, and the randomization test that
decides whether a fused gain over the first stage is sure."""

from __future__ import annotations

import numpy as np
import pytest

from indexer.errors import BadInput
from search.studies.cross_held import Mined, held_back_set
from search.studies.cross_tuning import DEPTH, grouped
from search.studies.tuning import hold_back, read_labels
from tests.helpers import learnable_pairs, unit_vectors, wikiqa_like


def test_training_measures_answered_questions_and_the_kept_checkpoint_once_whole(tmp_path):
    """Only answered questions judge ranking (MRR, nDCG, the weight, the sign test), so the
    measurements that pick a checkpoint score theirs alone; the unanswered ones are scored once,
    for the kept checkpoint, whose verdict then equals one measurement of everything. WikiQA
    holds back more unanswered questions than answered ones: scoring them at every measurement
    spent most of the time that could hold back more answered questions."""
    from search.studies.cross_tuning import Judged

    labels = grouped(read_labels(pairs=wikiqa_like(tmp_path)))
    mined = Mined.of(labels, unit_vectors)
    held = held_back_set(labels, hold_back(labels, 0.5, seed=0), mined, unit_vectors, DEPTH, 0)
    assert held.size > held.answered > 0
    answered = set(held.anchors[: held.answered])
    asked: list[tuple[str, str]] = []

    def scorer(shift: int):
        def score(pairs, progress=None):
            asked.extend(pairs)
            return np.array([float((len(t) + shift) % 7) for q, t in pairs])

        return score

    judge = Judged(held, progress=False)
    scorers = [scorer(shift) for shift in (0, 3, 5)]
    measured = [judge(score) for score in scorers]
    assert {q for q, _ in asked} == answered  # no unanswered question scored while choosing
    assert len(asked) == 3 * len({(q, t) for q, t in asked})
    asked.clear()
    best = measured.index(max(measured))  # the loop keeps the first of equals, its weights loaded
    verdict = judge.kept(measured[best], scorers[best])
    assert asked and {q for q, _ in asked} == set(held.anchors[held.answered :])  # once, the rest only
    whole = held.measure(scorers[best])
    assert verdict == whole and verdict.reranked.auroc is not None


def test_the_held_back_share_spends_the_time_it_is_given_on_answered_questions():
    """Answered questions are measured at each of ``MEASUREMENTS``, unanswered ones once: the
    share is as large as those pairs allow in ``MEASURING`` of the minutes, not the smaller share
    that measured every question every time."""
    from search.studies.cross_tuning import MEASUREMENTS, MEASURING, sized_share
    from search.studies.tuning import Labels

    answered, unanswered, minutes, rate = 900, 1300, 30, 80.0
    labels = Labels(
        "questions with 0/1 answers",
        [f"question {i}" for i in range(answered)],
        [f"right text {i}" for i in range(answered)],
        np.arange(answered),
        unanswered={f"unanswered {i}": answered + i for i in range(unanswered)},
    )
    share = sized_share(labels, 0.5, max_minutes=minutes, pairs_per_second=rate)
    pairs = share * DEPTH * (MEASUREMENTS * answered + unanswered)
    assert 0.95 * MEASURING * minutes * 60 * rate <= pairs <= MEASURING * minutes * 60 * rate


def held_from_ranks(first_rank: list[int], fused_rank: list[int]):
    """A held-back set of answered questions, each with 4 candidates in the first stage's order
    and one right one at ``first_rank``; a scorer that puts it at ``fused_rank`` alone and fused
    at any weight above 0 (its scores dwarf the cosines' steps)."""
    from search.studies.cross_held import HeldBack

    count = len(first_rank)
    right = np.zeros((count, 4), dtype=bool)
    right[np.arange(count), np.array(first_rank) - 1] = True
    anchors = [f"question {i}" for i in range(count)]
    held = HeldBack(
        mask=np.zeros(0, dtype=bool),
        questions=frozenset(anchors),
        texts=frozenset(),
        metric="mrr@10",
        anchors=anchors,
        answered=count,
        candidates=[f"text {n}" for n in range(4)],
        top=np.tile(np.arange(4), (count, 1)),
        first=np.tile(np.array([0.04, 0.03, 0.02, 0.01]), (count, 1)),
        right=right,
        rights=np.ones(count, dtype=int),
    )
    wanted = {(anchors[i], f"text {first_rank[i] - 1}"): fused_rank[i] for i in range(count)}

    def score(pairs):
        out = []
        for q, t in pairs:
            i = anchors.index(q)
            n = int(t.split()[1])
            places = [m for m in range(4) if m != first_rank[i] - 1]
            if (q, t) in wanted:
                out.append(10.0 - wanted[(q, t)])
            else:  # the wrong ones fill the other places, in the first stage's order
                others = [p for p in range(1, 5) if p != fused_rank[i]]
                out.append(10.0 - others[places.index(n)])
        return np.array(out)

    return held, score


def test_a_gain_of_large_steps_is_sure_where_counting_changed_questions_is_not():
    """20 questions lifted from third to first (+0.67 each) against 12 dropped from first to
    second (-0.5 each), 68 unchanged: MRR +7.3 points. Counting changed questions (20 against 12)
    leaves chance at 0.11; a paired randomization test of the gains finds it sure. The test counts
    choosing the weight on the same questions, and a scorer of noise still gains nothing."""
    first_rank = [3] * 20 + [1] * 12 + [2] * 68
    fused_rank = [1] * 20 + [2] * 12 + [2] * 68
    held, score = held_from_ranks(first_rank, fused_rank)
    first = held.first_stage()
    measured = held.measure(score)
    assert measured.fused.headline - first.headline == pytest.approx(20 * 2 / 3 - 12 * 0.5)  # x100 / 100
    assert measured.weight > 0 and measured.chance < 0.05 and measured.helps(first)
    assert measured.stored(first)["weight"] == measured.weight
    small, small_score = held_from_ranks(first_rank[10:26] + [2] * 4, fused_rank[10:26] + [2] * 4)
    few = small.measure(small_score)  # 10 up, 6 down of 20: a gain, not a sure one
    assert few.fused.headline > small.first_stage().headline and not few.helps(small.first_stage())
    noise = np.random.default_rng(0)
    guessed = held.measure(lambda pairs: noise.random(len(pairs)))
    assert not guessed.helps(first) and guessed.stored(first)["weight"] == 0.0


@pytest.mark.parametrize(("cross", "expected"), [(True, "CROSS_HELD_BACK"), (False, "HELD_BACK")])
def test_a_reranker_holds_back_a_larger_share_by_default(cross, expected, monkeypatch, tmp_path):
    """A reranker's verdict compares it with the first stage question by question, and a few
    dozen answered questions cannot tell a gain of a few MRR points from chance: without
    ``--held-back`` a reranker holds back ``CROSS_HELD_BACK`` (cut to fit ``--max-minutes``), a
    bi-encoder ``HELD_BACK``."""
    import inspect

    from click.testing import CliRunner

    import search.studies.cross_tuning as cross_tuning
    import search.studies.tuning as tuning
    from search.cli import cli

    seen: dict = {}

    def caught(function):
        def stop(*args, **kwargs):
            seen.update(kwargs, default=inspect.signature(function).parameters["held_back"].default)
            raise BadInput("stopped here")

        return stop

    monkeypatch.setattr(cross_tuning, "cross_tune", caught(cross_tuning.cross_tune))
    monkeypatch.setattr(tuning, "tune", caught(tuning.tune))
    pairs = learnable_pairs(tmp_path)
    flags = ["--cross-encoder"] if cross else []
    result = CliRunner().invoke(cli, ["tune", *flags, "--pairs", str(pairs), "-o", str(tmp_path / "o")])
    assert "stopped here" in result.output, result.output
    share = seen.get("held_back", seen["default"])
    assert share == getattr(cross_tuning if cross else tuning, expected)
    assert cross_tuning.CROSS_HELD_BACK == 2 * tuning.HELD_BACK


def test_an_advised_reranker_says_its_weight_is_its_training_datas_and_how_an_index_fits_its_own():
    """The folder's weight applies to every index it reranks without one of its own, and a
    weight fitted on answer sentences costs an index of questions (docs/rerank.md: the WikiQA
    reranker on the FAQ sets): the advice names the command that fits an index's own weight."""
    from search.studies.cross_tuning import report_of
    from search.studies.tuning import TuneReport

    def report(helps: bool) -> list[str]:
        done = TuneReport(
            output="out/rr",
            kind="cross",
            metric="mrr@10",
            trained_pairs=100,
            held_back_pairs=20,
            before=4.0,
            after=66.0,
            best_step=10,
            steps=12,
            epochs=2.0,
            minutes=30.0,
            stopped="epochs done",
            losses=[],
            strategy="BertForSequenceClassification",
            options="",
            reranker=True,
            verdict=["held back ..."],
            helps=helps,
            weight=0.3 if helps else 0.0,
        )
        return report_of(done)

    advised = " ".join(report(True))
    assert "--rerank out/rr" in advised
    assert "semsearch calibrate INDEX --rerank out/rr" in advised
    assert "calibrate" not in " ".join(report(False))
