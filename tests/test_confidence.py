"""Abstention: the confidence features, the fitted and stored rule, hits marked answered, the
plain --min-score threshold, the held-out evaluation, and every way calibration can be misused."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from indexer import Strategy, build_index
from indexer.errors import BadInput
from indexer.store import Change, apply_change, live_version, open_index
from indexer.writing.update import add_to_index
from search.read.confidence import FEATURES, Neighbourhood, Rule, stored_rules
from search.read.engine import SearchEngine
from search.studies.abstention import evaluate_abstention
from search.studies.calibrate import calibrate_index, remove_calibration
from search.studies.calibration import (
    Observation,
    choose_rule,
    fit_rule,
    observe,
    paraphrase,
    self_observations,
    threads,
)
from search.studies.evaluate import read_retrieval_set
from search.studies.promise import Curve, measure
from tests.helpers import DATA, assert_clean_failure, run, shared_file

TOPICS = [
    "How do I reset my password?",
    "Where can I park my bicycle?",
    "Can I get a refund for a cancelled ride?",
    "Is there a mobile app for Android?",
    "How do I change the email address on my account?",
    "What payment cards are accepted?",
    "Why was I charged twice?",
    "How do I delete my account?",
    "Can I share my subscription with family?",
    "What happens if the bike breaks down?",
]
OTHERS = [
    "purple elephants dance at midnight",
    "quantum chromodynamics lecture notes",
    "recipe for sourdough bread with rye",
    "the migration of arctic terns",
    "medieval castle architecture in Wales",
    "volcanic soil and vineyard yields",
    "a sonnet about autumn leaves",
    "tax law for offshore trusts",
    "knitting patterns for wool socks",
    "the history of the printing press",
]


def write_faq(directory: Path) -> tuple[Path, Path, Path]:
    """Ten questions, each with two answers (two entries with one text), questions that copy them
    (answerable, judged) and unrelated ones (unjudged: unanswerable)."""
    corpus, queries, qrels = directory / "faq.jsonl", directory / "q.jsonl", directory / "qrels.tsv"
    rows = [
        {"id": f"e{i}{a}", "text": text, "answer": f"answer {a} to {i}"}
        for i, text in enumerate(TOPICS)
        for a in "ab"
    ]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    asked = [{"id": f"in{i}", "text": t} for i, t in enumerate(TOPICS)]
    asked += [{"id": f"out{i}", "text": t} for i, t in enumerate(OTHERS)]
    queries.write_text("".join(json.dumps(q) + "\n" for q in asked))
    qrels.write_text(
        "query_id\tdoc_id\trelevance\n" + "".join(f"in{i}\te{i}{a}\t1\n" for i in range(10) for a in "ab")
    )
    return corpus, queries, qrels


def faq_index(folder: Path, model: str) -> Path:
    build_index(write_faq(folder)[0], folder / "idx", Strategy(model=model))
    return folder / "idx"


@pytest.fixture()
def faq(tmp_path, tiny_model, built_once) -> tuple[Path, Path, Path, Path]:
    corpus, queries, qrels = write_faq(tmp_path)
    index = built_once("confidence faq", functools.partial(faq_index, model=tiny_model), tmp_path / "idx")
    return index, corpus, queries, qrels


def calibrate(index: Path, queries: Path, qrels: Path, **options) -> Rule:
    data = read_retrieval_set(queries, qrels)
    return calibrate_index(index, data.queries, data.qrels, **options)


def test_margin_is_to_the_best_entry_of_another_text():
    near = Neighbourhood([1, 2, 3, 4], np.array([0.9, 0.9, 0.7, 0.5]), ["a", "a", "b", "c"])
    rows = near.features(3)
    assert rows[:, 0].tolist() == pytest.approx([0.9, 0.9, 0.7])
    assert rows[:, 1].tolist() == pytest.approx([0.2, 0.2, -0.2])  # the sibling "a" is not a rival
    assert rows[0, 2] > 0 > rows[2, 2] - 1  # z-score against the distinct texts 0.9, 0.7, 0.5
    # gap: the hit's cosine minus the mean of the next (up to nine) other texts' best cosines
    assert rows[:, 3].tolist() == pytest.approx([0.9 - 0.6, 0.9 - 0.6, 0.7 - 0.7])
    many = Neighbourhood(list(range(12)), np.linspace(1.0, 0.45, 12), [str(i) for i in range(12)])
    assert many.features(1)[0, 3] == pytest.approx(1.0 - np.linspace(1.0, 0.45, 12)[1:10].mean())


def test_measure_gives_the_precision_of_the_answered_and_the_coverage_of_the_answerable():
    confidence = np.array([0.9, 0.8, 0.7, 0.6, 0.5])
    correct = np.array([True, True, False, True, False])
    scored = measure(confidence >= 0.6, correct, np.array([True, True, False, True, True]))
    assert scored == {"precision": 0.75, "coverage": 0.75}


def test_calibration_is_stored_and_marks_hits(faq):
    index, _, queries, qrels = faq
    before = live_version(index)
    rule = calibrate(index, queries, qrels)
    assert live_version(index) != before  # a new version, like any write
    assert stored_rules(open_index(index).meta["calibration"]) == {"hybrid": rule}
    # 20 asked, and the 10 answerable ones again with their answers hidden; the default: the cosine
    assert rule.precision >= 0.95 and rule.questions == 30 and rule.features == ("text",)
    engine = SearchEngine(index)
    answered = engine.search(TOPICS[3], k=3)
    assert answered[0].id in ("e3a", "e3b") and answered[0].answered is True
    assert answered[0].confidence >= rule.threshold
    assert [h.answered for h in answered[2:]] == [False]  # another text: its margin is negative
    unanswered = engine.search(OTHERS[4], k=2)
    assert unanswered and all(h.answered is False for h in unanswered)
    assert all(0 <= h.confidence < rule.threshold for h in unanswered)
    assert set(answered[0].to_dict()) >= {"answered", "confidence"}


def test_rule_survives_an_update_and_plain_threshold_overrides_it(faq, tmp_path):
    index, _, queries, qrels = faq
    rule = calibrate(index, queries, qrels)
    extra = tmp_path / "extra.jsonl"
    extra.write_text(json.dumps({"id": "new", "text": "Opening hours of the depot"}) + "\n")
    add_to_index(index, extra)
    engine = SearchEngine(index)
    assert engine.snapshot.rules == {"hybrid": rule}
    hits = engine.search(OTHERS[0], k=2, min_score=-1.0)
    assert all(h.answered is True for h in hits) and hits[0].confidence is not None
    assert [h.answered for h in engine.search(TOPICS[0], k=3, min_score=0.999)[2:]] == [False]


def test_without_calibration_hits_say_neither(faq):
    index = faq[0]
    hit = SearchEngine(index).search(TOPICS[0], k=1)[0]
    assert (hit.answered, hit.confidence) == (None, None)
    assert SearchEngine(index).search(TOPICS[0], k=1, min_score=0.5)[0].answered is True


@pytest.mark.parametrize("precision", [0, -0.1, 1.5, math.nan])
def test_precision_outside_0_1_is_refused_and_nothing_written(faq, precision):
    index, _, queries, qrels = faq
    before = live_version(index)
    with pytest.raises(BadInput, match="precision"):
        calibrate(index, queries, qrels, precision=precision)
    assert live_version(index) == before


@pytest.mark.parametrize("score", [1.5, -2, math.nan])
def test_min_score_must_be_a_cosine(faq, score):
    with pytest.raises(BadInput, match="min score"):
        SearchEngine(faq[0]).search(TOPICS[0], min_score=score)


@pytest.mark.parametrize(
    ("activation", "weight", "low", "high"),
    [
        (None, 1.0, -1, 1),
        ("sigmoid", 1.0, 0, 1),
        ("sigmoid", 0.7, -0.3, 1),
        ("sigmoid", 0.0, -1, 1),
        ("tanh", 0.4, -1, 1),
        ("identity", 0.0, -1, 1),
        ("identity", 0.5, None, None),
        ("identity", 1.0, None, None),
    ],
)
def test_a_min_score_is_checked_against_the_range_of_the_score_it_thresholds(activation, weight, low, high):
    """The first stage's score is in [-1, 1]; a reranker's is its activation's range (a sigmoid's
    [0, 1], tanh's [-1, 1], none for a raw logit) fused with the first stage's at its weight."""
    from search.read.confidence import score_scale

    scale = score_scale(activation, weight)
    assert (scale.low, scale.high) == (low, high)
    if low is None:
        assert scale.refusal(-1e9) is None and scale.refusal(1e9) is None
        return
    assert all(scale.refusal(inside) is None for inside in (low, high, (low + high) / 2))
    for outside in (low - 0.01, high + 0.01):
        said = scale.refusal(outside)
        assert said is not None and said.startswith(f"must be in [{low:g}, {high:g}] (")
        assert said.endswith(f"not {outside}") and "\n" not in said


def test_no_answerable_question(faq, tmp_path):
    index, _, queries, _ = faq
    qrels = tmp_path / "gone.tsv"  # judged against ids of which one exists but no question has it
    qrels.write_text("nobody\te0a\t1\n")
    with pytest.raises(BadInput, match="no calibration question is answerable"):
        calibrate(index, queries, qrels)


def row(score: float, margin: float = 0.0, zscore: float = 0.0, gap: float = 0.0) -> np.ndarray:
    """A hit's features (``FEATURES``) on an index that scores one text: its ``text`` is its score."""
    return np.array([score, margin, zscore, gap, score])


def test_all_right_or_all_wrong_cannot_calibrate():
    right = [Observation(row(0.9, 0.2, 1.0, 0.3), True, True)] * 3
    wrong = [Observation(row(0.5), True, False)] * 3
    with pytest.raises(BadInput, match="every calibration question is answerable and none could be"):
        fit_rule(right)
    with pytest.raises(BadInput, match="no calibration question's top hit is right"):
        fit_rule(wrong)


def test_qrels_naming_unknown_ids(faq, tmp_path):
    index, _, queries, _ = faq
    qrels = tmp_path / "other.tsv"
    qrels.write_text("in1\tzzz\t1\nin2\tyyy\t1\n")
    before = live_version(index)
    with pytest.raises(BadInput, match="none of the 2 judged ids is in the index"):
        calibrate(index, queries, qrels)
    assert live_version(index) == before


def test_unknown_feature_and_no_questions(faq):
    index, _, queries, qrels = faq
    with pytest.raises(BadInput, match="choose among"):
        calibrate(index, queries, qrels, features=["loudness"])
    with pytest.raises(BadInput, match="no calibration questions"):
        calibrate_index(index, [], {"x": {"e0a": 1}})


def test_unreachable_precision_is_said():
    same = row(0.8, 0.1, 1.0, 0.2)  # right and wrong questions that look alike: no cut separates them
    seen = [
        Observation(same, answerable, right, thread)
        for thread in range(10)
        for answerable, right in ((True, True), (True, False), (False, False))
    ]
    with pytest.raises(BadInput, match="cannot promise precision 0.95 with 90% confidence"):
        fit_rule(seen, 0.95)
    assert fit_rule(seen, 0.3).coverage == 1.0  # half right, a third without an answer: precision 1/3


def test_threads_are_connected_components():
    found = threads({"q1": {"a": 1}, "q2": {"a": 1, "b": 1}, "q3": {"c": 1}})
    assert sorted((sorted(q), sorted(d)) for q, d in found) == [(["q1", "q2"], ["a", "b"]), (["q3"], ["c"])]


ABSTENTION_KEYS = [
    "threads",
    "seeds",
    "calibration threads",
    "test threads",
    "removed threads",
    "mode",
    "target",
    "default chose",
    *(
        f"{name} {key}"
        for name in ("rule", "plain", "default")
        for key in (
            "features",
            "promise kept",
            "precision mean",
            "precision worst",
            "coverage mean",
            "coverage worst",
            "auroc mean",
            "refused",
        )
    ),
]
"""The keys of ``evaluate abstention --json``, in order, before what it ran on and "per seed":
scripts read them."""


def test_abstention_evaluation_removes_whole_threads(tmp_path, tiny_model):
    corpus, queries, qrels = write_faq(tmp_path)
    report = evaluate_abstention(
        corpus,
        read_retrieval_set(queries, qrels),
        strategy=Strategy(model=tiny_model),
        holdout=0.4,
        seeds=range(3),
        precision=0.5,
    )
    assert (report.threads, report.calibration_threads, report.removed_threads) == (10, 5, 2)
    assert [split.seed for split in report.per_seed] == [0, 1, 2]
    for split in report.per_seed:
        assert split.test_unanswerable == pytest.approx(2 / 5)  # one question per thread
    for name in ("rule", "plain"):
        precisions = [getattr(run, name).precision for run in report.per_seed]
        kept = sum(p >= 0.5 for p in precisions)
        summary = getattr(report, name)
        assert summary.promise_kept == f"{kept}/3 seeds"
        assert summary.precision_worst == min(precisions)
        assert 0 <= summary.coverage_mean <= 1
    assert (report.plain.features, report.rule.features) == ("text", "text,gap")
    assert list(json.loads(json.dumps(report.to_dict()))) == ABSTENTION_KEYS + ["strategy", "per seed"]
    seed = report.to_dict()["per seed"][0]
    assert list(seed) == ["seed", "test unanswerable", "rule", "plain", "default"]  # the default refused
    assert list(seed["rule"]) == ["precision", "coverage", "auroc", "refused"]
    with pytest.raises(BadInput, match="holdout"):
        evaluate_abstention(corpus, read_retrieval_set(queries, qrels), holdout=1.0)
    with pytest.raises(BadInput, match="guarantee"):
        evaluate_abstention(corpus, read_retrieval_set(queries, qrels), guarantee=1.0)


@pytest.mark.slow
def test_cli_calibrate_then_query(faq):
    index, _, queries, qrels = faq
    result = run("calibrate", index, "--queries", queries, "--qrels", qrels, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["precision"] >= 0.95
    table = run("calibrate", index, "--queries", queries, "--qrels", qrels).stdout
    assert "trade-off:  coverage at each precision target, same guarantee and rule (--features text" in table
    result = run("query", index, OTHERS[2], "-k", "1", "--json")
    hit = json.loads(result.stdout)["hits"][0]
    assert hit["answered"] is False and 0 <= hit["confidence"] <= 1
    table = run("query", index, OTHERS[2], "-k", "1")
    assert "no answer" in table.stdout and "answered: no" in table.stdout
    out_of_range = run("query", index, "x", "--min-score", "3")
    assert_clean_failure(out_of_range, "--min-score must be in [-1, 1]")
    assert out_of_range.returncode == 2
    assert_clean_failure(
        run("calibrate", index, "--queries", queries, "--qrels", qrels, "--min-precision", "0"), "precision"
    )
    assert_clean_failure(
        run("calibrate", index, "--queries", queries, "--qrels", qrels, "--guarantee", "1"), "guarantee"
    )
    info = run("info", index).stdout
    promise = "a threshold on the cosine of the entry's own text alone; precision >= 0.95 with 90% confidence"
    assert f"calibration: labels, hybrid search: {promise}" in info
    dense = run("calibrate", index, "--queries", queries, "--qrels", qrels, "--mode", "dense", "--json")
    assert json.loads(dense.stdout)["mode"] == "dense", dense.stderr
    info = run("info", index).stdout
    assert f"calibration: labels, hybrid search: {promise}" in info and "labels, dense search: " in info
    for mode in ("hybrid", "dense"):
        asked = run("query", index, OTHERS[2], "-k", "1", "--mode", mode, "--json")
        hit = json.loads(asked.stdout)["hits"][0]
        assert hit["answered"] is False and 0 <= hit["confidence"] <= 1, mode
    keyword = run("query", index, OTHERS[2], "-k", "1", "--mode", "keyword", "--json")
    assert keyword.returncode == 0 and json.loads(keyword.stdout)["hits"][0]["answered"] is None
    assert "semsearch calibrate INDEX --mode keyword" in keyword.stderr
    assert_clean_failure(run("calibrate", index, "--remove", "--self"), "--remove takes no questions")
    assert run("calibrate", index, "--remove").stdout.strip() == "calibration removed"
    assert "calibration: none" in run("info", index).stdout
    nothing = run("calibrate", index, "--remove").stdout.strip()
    assert nothing == "not calibrated: nothing to remove (calibration)"
    hit = json.loads(run("query", index, OTHERS[2], "-k", "1", "--json").stdout)["hits"][0]
    assert hit["answered"] is None


@pytest.mark.slow
def test_stackfaq_abstention_keeps_its_promise_on_held_out_threads():
    """The real dev split, FAQ default index (question, and question + answer scored together),
    answerable labels only: over 20 splits the promise (precision >= 0.95 with 90% confidence)
    must hold on most held-out test halves, for the plain threshold and the learned rule alike
    (docs/abstention.md has the numbers)."""
    from indexer.embedding.fields import FieldScoring

    corpus = shared_file("stackfaq", "corpus.jsonl")
    data = read_retrieval_set(shared_file("stackfaq", "queries.jsonl"), shared_file("stackfaq", "qrels.tsv"))
    report = evaluate_abstention(corpus, data, text_fields=["text"], also=FieldScoring(("text", "answer")))
    for summary in (report.plain, report.rule):
        assert summary.kept >= 10, report
        assert summary.precision_mean >= 0.94
        assert summary.coverage_mean >= 0.4
        assert summary.auroc_mean >= 0.9


def test_http_search_marks_hits(faq):
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from search.server import create_app

    index, _, queries, qrels = faq
    calibrate(index, queries, qrels)
    with TestClient(create_app(index)) as client:
        hit = client.post("/search", json={"query": OTHERS[1], "k": 1}).json()["hits"][0]
        assert hit["answered"] is False and 0 <= hit["confidence"] <= 1
        body = {"queries": [OTHERS[1]], "k": 1, "min_score": -1}
        assert client.post("/search/batch", json=body).json()["results"][0]["hits"][0]["answered"] is True
        assert client.post("/search", json={"query": "x", "min_score": 2}).status_code == 400
        assert "note" not in client.post("/search", json={"query": OTHERS[1], "k": 1}).json()
        for mode in ("dense", "keyword"):  # no rule for them: they answer, their hits unmarked
            answer = client.post("/search", json={"query": TOPICS[0], "k": 2, "mode": mode})
            assert answer.status_code == 200, answer.text
            assert [h["answered"] for h in answer.json()["hits"]] == [None, None]
            assert f"semsearch calibrate INDEX --mode {mode}" in answer.json()["note"]
            batch = client.post("/search/batch", json={"queries": [TOPICS[0]], "k": 1, "mode": mode}).json()
            assert (
                batch["results"][0]["hits"][0]["answered"] is None and batch["note"] == answer.json()["note"]
            )
            marked = client.post(
                "/search", json={"query": TOPICS[0], "k": 1, "mode": mode, "min_score": 1}
            )
            assert marked.json()["hits"][0]["answered"] is not None and "note" not in marked.json()


def test_a_query_in_a_mode_with_no_rule_answers_unmarked_and_says_how_to_fit_one(faq):
    from click.testing import CliRunner

    from search.cli import cli

    index, _, queries, qrels = faq
    calibrate(index, queries, qrels, precision=0.5)
    result = CliRunner().invoke(cli, ["query", str(index), OTHERS[1], "-k", "2", "--mode", "dense"])
    assert result.exit_code == 0, result.output
    assert "answered:" not in result.stdout and "query: " in result.stdout
    notes = result.stderr.strip().splitlines()
    assert len(notes) == 1 and "semsearch calibrate INDEX --mode dense" in notes[0], result.stderr
    marked = CliRunner().invoke(
        cli, ["query", str(index), OTHERS[1], "--mode", "dense", "--min-score", "0.1"]
    )
    assert marked.exit_code == 0 and "answered:" in marked.stdout and not marked.stderr


@pytest.mark.slow
def test_cli_evaluate_abstention(tmp_path, tiny_model):
    corpus, queries, qrels = write_faq(tmp_path)
    common = ["--corpus", corpus, "--queries", queries, "--qrels", qrels, "--model", tiny_model]
    result = run("evaluate", "abstention", *common, "--holdout", "0.4", "--seeds", "3", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["removed threads"] == 2 and len(report["per seed"]) == 3
    assert list(report) == ABSTENTION_KEYS + ["strategy", "per seed"]
    table = run("evaluate", "abstention", *common, "--seeds", "2", "--min-precision", "0.5")
    assert "plain promise kept" in table.stdout and "seed  rule precision" in table.stdout
    assert_clean_failure(run("evaluate", "abstention", *common, "--holdout", "1.5"), "holdout")


def test_paraphrase_drops_a_third_of_the_words_in_order():
    rng = np.random.default_rng(0)
    made = paraphrase("one two three four five six", rng)
    assert len(made.split()) == 4
    assert [w for w in ["one", "two", "three", "four", "five", "six"] if w in made.split()] == made.split()
    assert paraphrase("two words", rng) == "two words"  # too short to lose any
    assert paraphrase("é 分类 x ☃ y z", np.random.default_rng(1)).count(" ") == 3


def test_neighbourhood_leaves_a_text_out():
    near = Neighbourhood([1, 2, 3, 4], np.array([0.9, 0.8, 0.7, 0.5]), ["a", "b", "a", "c"])
    kept = near.first(2, leave_out="a")
    assert (kept.rowids, kept.scores.tolist(), kept.groups) == ([2, 4], [0.8, 0.5], ["b", "c"])
    assert near.first(9, leave_out="zzz").rowids == [1, 2, 3, 4]


def test_self_observations_pair_each_text_with_its_absence(faq):
    index = faq[0]
    seen = self_observations(SearchEngine(index).snapshot)
    assert len(seen) == 2 * len(TOPICS)  # two entries share each text: one question per text
    assert [o.answerable for o in seen] == [True, False] * len(TOPICS)
    assert not any(o.correct for o in seen if not o.answerable)  # left out: never right
    assert all(o.features[0] >= -1 for o in seen)


@pytest.mark.slow
def test_calibrate_from_the_corpus_alone(tmp_path, bundled):
    corpus, _, _ = write_faq(tmp_path)
    build_index(corpus, tmp_path / "idx")
    rule = calibrate_index(tmp_path / "idx", None, None)
    assert rule.questions == 2 * len(TOPICS) and rule.precision >= 0.95
    assert stored_rules(open_index(tmp_path / "idx").meta["calibration"]) == {rule.mode: rule}
    engine = SearchEngine(tmp_path / "idx")
    assert engine.search("How can I reset the password", k=1)[0].answered is True
    assert all(h.answered is False for h in engine.search(OTHERS[4], k=2))


def test_self_calibration_needs_two_texts(tmp_path, tiny_model):
    corpus = tmp_path / "one.jsonl"
    corpus.write_text('{"id": "a", "text": "same"}\n{"id": "b", "text": "same"}\n')
    build_index(corpus, tmp_path / "idx", Strategy(model=tiny_model))
    before = live_version(tmp_path / "idx")
    with pytest.raises(BadInput, match="at least 2 distinct texts"):
        calibrate_index(tmp_path / "idx", None, None)
    assert live_version(tmp_path / "idx") == before


@pytest.mark.slow
def test_cli_calibrate_self_and_its_misuse(faq):
    index, _, queries, qrels = faq
    assert_clean_failure(run("calibrate", index), "give --queries and --qrels")
    assert_clean_failure(run("calibrate", index, "--self", "--queries", queries), "or --self")
    assert_clean_failure(run("calibrate", index, "--queries", queries), "or --self")
    result = run("calibrate", index, "--self", "--min-precision", "0.5", "--json")
    if result.returncode == 0:  # the tiny random model may reach no threshold: then one clean line
        assert json.loads(result.stdout)["questions"] == 2 * len(TOPICS)
    else:
        assert_clean_failure(result, "cannot promise precision")


def imported_modules(path: Path) -> set[str]:
    """Every module a source file imports, wherever the import stands (top level, a function, a
    ``TYPE_CHECKING`` block)."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_rule_is_read_side_and_calibration_sits_above_the_engine():
    """The engine imports the rule; the rule imports neither the engine, calibration nor the
    store's writing side, so the engine never reaches a module that writes to the index."""
    source = Path(__file__).resolve().parents[1] / "search" / "read"
    rule = imported_modules(source / "confidence.py")
    assert not rule & {
        "search.read.engine",
        "search.studies.calibration",
        "indexer.store",
        "indexer.writing.update",
    }
    assert "search.studies.calibration" not in imported_modules(source / "engine.py")


class LockCheckedDb:
    """A connection that records every statement run while ``lock`` was not held."""

    def __init__(self, db, lock) -> None:
        self.db, self.lock, self.unlocked = db, lock, []

    def execute(self, sql, *args):
        if not self.lock.locked():
            self.unlocked.append(sql)
        return self.db.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self.db, name)


def test_self_observations_read_the_catalog_under_the_snapshot_lock(faq):
    snapshot = SearchEngine(faq[0]).snapshot
    checked = LockCheckedDb(snapshot.index.catalog.db, snapshot.db_lock)
    snapshot.index.catalog.db = checked
    assert len(self_observations(snapshot)) == 2 * len(TOPICS)
    assert checked.unlocked == []


def threaded_neighbourhoods(threads: int = 20, per: int = 3, seed: int = 0):
    """Synthetic labels of a FAQ whose every question is answerable: thread t owns entries 2t and
    2t+1 (one text), its questions find them first (0.75-0.9), every other thread below 0.6."""
    rng = np.random.default_rng(seed)
    ids = {r: f"e{r}" for r in range(2 * threads)}
    questions, near, qrels = [], [], {}
    for t in range(threads):
        for n in range(per):
            own = rng.uniform(0.75, 0.9)
            others = sorted((u for u in range(threads) if u != t), key=lambda u: rng.random())
            scores = np.sort(rng.uniform(0.3, 0.6, len(others)))[::-1]
            rowids = [2 * t, 2 * t + 1] + [r for u in others for r in (2 * u, 2 * u + 1)]
            values = np.array([own, own] + [s for s in scores for _ in range(2)])
            groups = [f"g{t}"] * 2 + [f"g{u}" for u in others for _ in range(2)]
            questions.append(f"q{t}-{n}")
            near.append(Neighbourhood(rowids, values, groups))
            qrels[f"q{t}-{n}"] = {f"e{2 * t}": 1, f"e{2 * t + 1}": 1}
    return questions, near, ids, qrels, {v: k for k, v in ids.items()}


def test_answerable_only_labels_learn_to_abstain():
    """Labels that are all answerable (and all right) still teach the rule to abstain: each
    question is also asked with its thread's entries hidden, and what it then finds is wrong."""
    questions, near, ids, qrels, indexed = threaded_neighbourhoods()
    seen = observe(questions, near, ids, qrels, indexed)
    asked = [o for o in seen if not o.hidden]
    assert len(asked) == len(questions) and all(o.answerable and o.correct for o in asked)
    hidden = [o for o in seen if o.hidden]
    assert len(hidden) == len(questions) and not any(o.answerable or o.correct for o in hidden)
    assert all(o.features[0] <= 0.6 for o in hidden)  # the best other thread, not its own entries
    rule = fit_rule(seen, 0.95)
    unrelated, answered = rule.confidence(np.array([row(0.58), row(0.86)]))
    assert unrelated < rule.threshold <= answered
    assert rule.unanswerable == pytest.approx(1 / 3) and rule.guarantee == 0.9 and rule.bound >= 0.95


def test_a_set_that_cannot_teach_abstention_is_one_line():
    questions, near, ids, qrels, indexed = threaded_neighbourhoods(threads=12, per=1)
    alone = [Neighbourhood(n.rowids[:2], n.scores[:2], n.groups[:2]) for n in near]  # nothing else indexed
    with pytest.raises(BadInput, match="none could be asked with its answers hidden"):
        fit_rule(observe(questions, alone, ids, qrels, indexed))
    few = observe(questions[:3], near[:3], ids, qrels, indexed)
    with pytest.raises(BadInput, match="questions on 3 threads .* at least 10"):
        fit_rule(few)
    assert fit_rule(observe(questions, near, ids, qrels, indexed)).threshold < 1


def clustered(rng: np.random.Generator, threads: int, per: int = 6) -> list[Observation]:
    """Observations whose threads differ (a thread's questions share a shift: right or wrong
    together), each question answerable (right 95% of the time) and again with its answers hidden."""
    seen = []
    for t in range(threads):
        shift = rng.normal(0, 0.05)
        for _ in range(per):
            right = rng.random() < 0.95  # a wrong top hit scores lower, as a right one stands out
            score = (0.72 if right else 0.6) + shift + rng.normal(0, 0.06)
            seen.append(Observation(row(score), True, right, t))
            hidden = row(0.55 + shift + rng.normal(0, 0.07))
            seen.append(Observation(hidden, False, False, t, hidden=True))
    return seen


def as_arrays(population: list[Observation]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The features, answerable and correct of each observation: made once, read by every rule."""
    names = ("features", "answerable", "correct")
    return tuple(np.array([getattr(o, name) for o in population]) for name in names)


def true_precision(
    rule: Rule, threshold: float, population: tuple[np.ndarray, np.ndarray, np.ndarray], share: float
) -> float:
    """Precision of the answered hits on questions (``as_arrays``) of which ``share`` have no answer."""
    features, answerable, correct = population
    answered = rule.confidence(features) >= threshold
    right = (answered & correct & answerable).sum() / answerable.sum()
    wrong = (answered & ~correct & answerable).sum() / answerable.sum()
    absent = (answered & ~answerable).sum() / (~answerable).sum()
    return (1 - share) * right / ((1 - share) * (right + wrong) + share * absent)


def test_the_promise_holds_over_seeded_calibration_sets():
    """Precision >= 0.95 with 90% confidence: over 30 calibration sets of 40 threads drawn from
    one population, the precision the population sees at the chosen threshold reaches 0.95 in
    at least 25 of them (nominal 27); the bare point estimate (no guarantee) misses it far more often."""
    population = as_arrays(clustered(np.random.default_rng(999), 3000))
    kept = unguarded_kept = 0
    for seed in range(30):
        sample = clustered(np.random.default_rng(seed), 40)
        rule = fit_rule(sample, 0.95)
        kept += true_precision(rule, rule.threshold, population, rule.unanswerable) >= 0.95
        point = Curve(
            rule.confidence(np.array([o.features for o in sample])),
            np.array([o.correct for o in sample]),
            np.array([o.answerable for o in sample]),
            np.array([o.cluster for o in sample]),
            rule.unanswerable,
        ).unguarded(0.95)
        unguarded_kept += true_precision(rule, point, population, rule.unanswerable) >= 0.95
    assert kept >= 25, kept
    assert unguarded_kept <= 20, unguarded_kept


def test_remove_calibration(faq):
    index, _, queries, qrels = faq
    assert remove_calibration(index) is False  # nothing to remove: no new version
    calibrate(index, queries, qrels)
    assert open_index(index, vectors=False).info()["calibration"]["hybrid"]["source"] == "labels"
    before = live_version(index)
    assert remove_calibration(index) is True
    assert live_version(index) != before and not open_index(index).meta.get("calibration")
    engine = SearchEngine(index)
    assert engine.snapshot.rules == {}
    assert (engine.search(TOPICS[0], k=1)[0].answered, open_index(index).info()["calibration"]) == (
        None,
        None,
    )


def test_a_filter_does_not_change_a_hits_confidence(faq):
    """A learned rule reads the query's neighbourhood: a filtered search measures its hits
    against the same whole neighbourhood, so the same hit has the same confidence."""
    index, _, queries, qrels = faq
    calibrate(index, queries, qrels, features=["score", "gap"], precision=0.8)
    engine = SearchEngine(index)
    for question in (TOPICS[3], OTHERS[2]):
        everything = {h.id: h.confidence for h in engine.search(question, k=20)}
        filtered = engine.search(question, k=2, where="answer = 'answer a to 3'")
        assert filtered  # the filter admits hits to compare
        for hit in filtered:
            assert hit.confidence == pytest.approx(everything[hit.id])


def test_info_states_the_calibration(faq):
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from search.server import create_app

    index, _, queries, qrels = faq
    rule = calibrate(index, queries, qrels)
    line = Rule.from_dict(open_index(index, vectors=False).info()["calibration"]["hybrid"]).describe()
    promise = "a threshold on the cosine of the entry's own text alone; precision >= 0.95 with 90% confidence"
    assert line.startswith(f"labels, hybrid search: {promise}")
    assert f"coverage {rule.coverage:.2f} on 20 labelled questions on 20 threads" in line
    assert rule.created[:4] in line
    dense = calibrate(index, queries, qrels, precision=0.5, mode="dense")
    with TestClient(create_app(index)) as client:
        info = client.get("/info").json()
        answered = client.post("/search", json={"query": OTHERS[2], "k": 1, "mode": "dense"}).json()
    assert (info["default_mode"], sorted(info["calibration"])) == ("hybrid", ["dense", "hybrid"])
    assert info["calibration"]["dense"]["coverage"] == dense.coverage
    assert 0 <= answered["hits"][0]["confidence"] <= 1
    shown = info["calibration"]["hybrid"]
    assert {k: shown[k] for k in ("source", "target", "guarantee", "coverage", "created")} == {
        "source": "labels",
        "target": 0.95,
        "guarantee": 0.9,
        "coverage": rule.coverage,
        "created": rule.created,
    }


@pytest.fixture(scope="module")
def demo_labels(tmp_path_factory) -> tuple[Path, Path, Path, list[dict]]:
    """The demo FAQ indexed the FAQ default way, and its user questions as labels: every one of
    them answerable (qrels from ``answer_id``)."""
    directory = tmp_path_factory.mktemp("demo-labels")
    from indexer.embedding.fields import FieldScoring

    build_index(
        DATA / "demo_faq.csv",
        directory / "idx",
        text_fields=["question"],
        also=FieldScoring(("question", "answer")),
    )
    asked = [json.loads(line) for line in (DATA / "demo_questions.jsonl").read_text().splitlines()]
    qrels = directory / "qrels.tsv"
    qrels.write_text("".join(f"{q['id']}\t{q['answer_id']}\t1\n" for q in asked))
    return directory / "idx", DATA / "demo_questions.jsonl", qrels, asked


def right_answered(index: Path, asked: list[dict]) -> tuple[int, int, int]:
    """(right top hits, of them answered, answered) over the demo's user questions."""
    results = SearchEngine(index).search_many([q["text"] for q in asked], k=1)
    right = [hits[0].id == q["answer_id"] for q, hits in zip(asked, results, strict=True)]
    answered = [hits[0].answered for hits in results]
    return sum(right), sum(r and a for r, a in zip(right, answered, strict=True)), sum(answered)


@pytest.mark.slow
def test_answerable_only_labels_abstain_on_what_the_faq_lacks(demo_labels, bundled):
    """The demo's own user questions, all answerable, as labels: the rule still says "no answer"
    to questions the FAQ does not cover, and what it answers is right (a quarter of the demo's
    top hits are wrong, at cosines as high as right ones: few pass at precision 0.95)."""
    index, queries, qrels, asked = demo_labels
    rule = calibrate(index, queries, qrels)
    assert rule.coverage < 1
    # an FAQ indexed with its answers too: the rule reads each question's own cosine, not the
    # score that mixes in the answer (near-duplicate questions look right through their answers)
    assert rule.features[0] == "text"
    engine = SearchEngine(index)
    for stranger in ("what is the capital of France", "asdf qwerty", "recipe for sourdough bread with rye"):
        assert engine.search(stranger, k=1)[0].answered is False, stranger
    _, answered_right, answered = right_answered(index, asked)
    assert answered_right >= 10 and answered_right / answered >= 0.9


@pytest.mark.slow
def test_self_calibration_says_what_its_coverage_was_measured_on(demo_labels, bundled):
    index = demo_labels[0]
    result = run("calibrate", index, "--self")
    assert result.returncode == 0, result.stderr
    assert "made from the index's own texts (not questions users asked)" in result.stdout
    assert "promise:    precision >= 0.95 with 90% confidence" in result.stdout


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="at its default promise --self answers 38% of the demo's right hits, and 62% when it assumes "
    "only 1% of questions lack an answer (docs/abstention-guarantee.md, the demo)",
)
def test_self_calibration_answers_most_right_hits_of_the_demo(demo_labels, bundled):
    index, _, _, asked = demo_labels
    calibrate_index(index, None, None)
    right, answered_right, answered = right_answered(index, asked)
    assert answered_right >= 0.75 * right
    assert answered_right / answered >= 0.9


def separable(rng: np.random.Generator, gap_helps: bool, threads: int = 40) -> list[Observation]:
    """Answerable questions and their hidden twins whose cosines overlap; ``gap`` tells them
    apart when ``gap_helps``, else it is the same for every question."""
    seen = []
    for t in range(threads):
        for _ in range(4):
            for answerable, score, gap in ((True, 0.7, 0.3), (False, 0.62, 0.05)):
                spread = gap + rng.normal(0, 0.03) if gap_helps else 0.2
                features = row(score + rng.normal(0, 0.05), gap=spread)
                seen.append(Observation(features, answerable, answerable, t, hidden=not answerable))
    return seen


def test_the_learned_rule_earns_its_place_on_held_out_threads():
    rng = np.random.default_rng(0)
    learned = choose_rule(separable(rng, gap_helps=True))
    assert learned.features == ("text", "gap") and learned.why.startswith("learned text,gap")
    plain = choose_rule(separable(rng, gap_helps=False))  # gap adds nothing: no more coverage
    assert plain.features == ("text",) and plain.why.startswith("plain: learned vs plain held-out")
    few = choose_rule(separable(rng, gap_helps=True, threads=12))
    assert few.features == ("text",) and "too few threads (12)" in few.why


@pytest.mark.parametrize("learned_cut, learned_coverage", [(0.2, "0.500"), (9.0, "0.000")])
def test_a_rule_is_never_chosen_for_a_lower_held_out_coverage(monkeypatch, learned_cut, learned_coverage):
    """The plain threshold answers every held-out question, at a precision below the target; the
    learned rule answers half of the answerable ones, all right, or none at all (whose precision
    is vacuously perfect). It answers less: the plain rule is kept, and says why."""
    seen = [
        Observation(row(score, gap=gap), answerable, answerable, thread, hidden=not answerable)
        for thread in range(20)
        for answerable, score, gap in ((True, 0.8, 0.3 if thread % 2 else 0.0), (False, 0.7, 0.0))
    ]

    def fitted(seen, precision=0.95, features=None, guarantee=0.9, unanswerable=1 / 3) -> Rule:
        """A plain rule whose threshold passes every question; a learned one reading only ``gap``."""
        plain = tuple(features) == ("text",)
        weights, threshold = ((1.0,), 0.5) if plain else ((0.0, 1.0), 1 / (1 + math.exp(-learned_cut)))
        zeros = tuple(0.0 for _ in weights)
        return Rule(
            tuple(features), zeros, tuple(1.0 for _ in weights), weights, 0.0, threshold, precision, 0, 0, 1
        )

    monkeypatch.setattr("search.studies.calibration.fit_rule", fitted)
    rule = choose_rule(seen)
    assert rule.features == ("text",)
    assert rule.why.startswith(f"plain: learned vs plain held-out coverage {learned_coverage} vs 1.000")


def test_a_learned_rule_that_answers_less_on_all_the_labels_is_not_chosen(monkeypatch):
    """The learned rule answers more held-out questions than the plain one, all right, but
    fitted on every thread it answers less with the same promise (its step-down can stop early):
    the plain rule is stored, and says why."""
    seen = [
        Observation(row(score), answerable, answerable, thread, hidden=not answerable)
        for thread in range(20)
        for answerable, score in ((True, 0.8), (False, 0.7))
    ]
    between = 1 / (1 + math.exp(-0.75))  # the confidence between the two kinds of question

    def fitted(seen, precision=0.95, features=None, guarantee=0.9, unanswerable=1 / 3) -> Rule:
        """On half the threads, the learned rule answers the answerable questions and the plain
        one none; on all of them, the learned one answers none and the plain one those."""
        on_all = len({o.cluster for o in seen}) == 20
        answers = (tuple(features) == ("text",)) == on_all
        n = len(features)
        rule = Rule(tuple(features), (0.0,) * n, (1.0,) * n, (1.0,) + (0.0,) * (n - 1), 0.0,
                    between if answers else 1.0, precision, 0, 0, 1)  # fmt: skip
        return replace(rule, coverage=1.0 if answers else 0.0)

    monkeypatch.setattr("search.studies.calibration.fit_rule", fitted)
    rule = choose_rule(seen)
    assert rule.features == ("text",)
    assert rule.why.startswith("plain: learned vs plain held-out coverage 1.000 vs 0.000, precision 1.000")
    assert rule.why.endswith("fitted on all 20 threads it answers 0.000 vs 1.000")


def test_every_trade_off_reproduces_when_asked_for_with_the_rule_it_was_measured_on():
    """The coverage a rule reports at another precision target is what calibrating at that
    target with the same features gives: the advice names both, so it reproduces exactly."""
    rng = np.random.default_rng(1)
    seen = separable(rng, gap_helps=True)
    rule = choose_rule(seen, 0.99)
    for target, coverage in rule.costs:
        if coverage > 0:
            assert fit_rule(seen, target, rule.features).coverage == coverage, target


def test_a_rule_says_what_other_precision_targets_would_cost():
    """Beside its own promise, a rule reports the coverage the same guarantee gives at other
    precision targets: a stricter one answers less, its own is its coverage, and it survives
    being stored."""
    rng = np.random.default_rng(0)
    seen = [
        Observation(row(centre + rng.normal(0, 0.06)), answerable, answerable, t, not answerable)
        for t in range(40)
        for _ in range(4)
        for answerable, centre in ((True, 0.72), (False, 0.6))
    ]
    rule = fit_rule(seen, 0.95, ("score",))
    targets = [target for target, _ in rule.costs]
    assert targets == sorted(targets) and {0.8, 0.9, 0.95, 0.98} <= set(targets)
    coverages = [coverage for _, coverage in rule.costs]
    assert coverages == sorted(coverages, reverse=True) and coverages[0] > coverages[-1]
    assert dict(rule.costs)[0.95] == rule.coverage
    assert Rule.from_dict(json.loads(json.dumps(rule.to_dict()))) == rule


@pytest.mark.slow
def test_a_promise_that_answers_under_half_says_what_would_answer_more(demo_labels, bundled):
    """The demo's 110 labels at precision 0.95 answer about a fifth of the right top hits: the
    trade-off names the strictest target that answers half, and the labels 0.95 would need
    (measured in dense mode, where these figures were taken)."""
    index, queries, qrels, _ = demo_labels
    rule = calibrate(index, queries, qrels, mode="dense")
    assert rule.coverage < 0.5
    looser = max(target for target, coverage in rule.costs if coverage >= 0.5)
    assert 0.6 <= looser < 0.95
    # a quarter of the demo's top hits are wrong at cosines as high as right ones: at 0.95 more
    # labels like these buy at most the coverage without the guarantee, never half
    assert rule.labels_needed is None and rule.unguarded_coverage < 0.5
    assert Rule.from_dict(json.loads(json.dumps(rule.to_dict()))) == rule
    said = run("calibrate", index, "--queries", queries, "--qrels", qrels, "--mode", "dense", "-q")
    assert said.returncode == 0, said.stderr
    advice = [line for line in said.stdout.splitlines() if line.startswith("under half:")]
    assert len(advice) == 1, said.stdout
    features = ",".join(rule.features)
    promised = dict(rule.costs)[looser]
    assert f"--min-precision {looser:g} --features {features} answers {promised:.2f}" in advice[0]
    assert f"lift 0.95 to at most {rule.unguarded_coverage:.2f}" in advice[0]
    # the advice, run as said, answers what it said
    again = run(
        "calibrate", index, "--queries", queries, "--qrels", qrels, "--mode", "dense",
        "--min-precision", f"{looser:g}", "--features", features, "--json",
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["coverage"] == promised
    looser_rule = calibrate(index, queries, qrels, precision=0.85, mode="dense")
    assert looser_rule.coverage < 0.5 and looser_rule.labels_needed > 110  # its own precision gets there


def test_calibrate_says_the_labels_share_of_unanswerable_questions_and_when_to_change_it(faq):
    """The promise assumes a third of the questions asked have no answer: calibrate says the
    share the labels hold and suggests --unanswerable where they differ beyond sampling noise
    (here 40 of 50), and says so where every labelled question is answerable."""
    from click.testing import CliRunner

    from search.cli import cli

    index, _, queries, qrels = faq
    off_topic = [{"id": f"far{i}", "text": f"{OTHERS[i % 10]} number {i}"} for i in range(30)]
    with queries.open("a") as file:
        file.write("".join(json.dumps(q) + "\n" for q in off_topic))
    rule = calibrate(index, queries, qrels, precision=0.5)
    assert (rule.asked, rule.asked_unanswerable) == (50, 40)
    said = CliRunner().invoke(cli, ["calibrate", str(index), "--queries", str(queries), "--qrels", str(qrels),
                                    "--min-precision", "0.5"])  # fmt: skip
    assert said.exit_code == 0, said.output
    line = next(x for x in said.stdout.splitlines() if x.startswith("labels:"))
    assert "80% of the 50 labelled questions have no answer in the index" in line
    assert "the promise assumes 33%" in line and "--unanswerable 0.80" in line
    answerable = queries.parent / "answerable.jsonl"
    answerable.write_text("".join(x + "\n" for x in queries.read_text().splitlines()[:10]))
    said = CliRunner().invoke(cli, ["calibrate", str(index), "--queries", str(answerable), "--qrels",
                                    str(qrels), "--min-precision", "0.5"])  # fmt: skip
    line = next(x for x in said.stdout.splitlines() if x.startswith("labels:"))
    assert "all 10 labelled questions have an answer in the index" in line and "--unanswerable" in line
    said = CliRunner().invoke(cli, ["calibrate", str(index), "--self", "--min-precision", "0.5"])
    assert said.exit_code == 0 and "labels:" not in said.stdout


def test_the_labels_a_target_needs_are_estimated_from_the_margin_the_guarantee_takes():
    """More labels shrink the guarantee's margin as 1/sqrt(n): a target the labels' own precision
    reaches at half coverage needs more of them; one it does not reach, no number of them."""
    rng = np.random.default_rng(0)
    answerable = np.arange(200) % 2 == 0
    correct = answerable & (rng.random(200) < 0.8)
    confidence = np.where(correct, rng.normal(0.7, 0.1, 200), rng.normal(0.5, 0.1, 200))
    curve = Curve(confidence, correct, answerable, np.repeat(np.arange(100), 2), 1 / 3)
    threshold, _ = curve.guaranteed(0.93, 0.9)
    assert curve.coverage(threshold) < 0.5
    assert 100 < curve.questions_for(0.93, 0.9, 100) < 10_000
    assert curve.questions_for(0.999, 0.9, 100) is None
    looser = curve.looser_target(0.93, 0.9)
    assert looser < 0.93 and curve.coverage(curve.guaranteed(looser, 0.9)[0]) >= 0.5
    assert curve.coverage(curve.guaranteed(looser + 0.01, 0.9)[0] or 2.0) < 0.5


def test_each_mode_keeps_its_own_rule_and_the_default_stays_hybrid(faq):
    """Fitting a second mode keeps the first mode's rule: both answer, hybrid stays the default;
    a mode with no rule answers too, its hits unmarked, with one line naming the command that fits
    one (none where --min-score marks them)."""
    index, _, queries, qrels = faq
    rule = calibrate(index, queries, qrels, precision=0.5)
    assert rule.mode == "hybrid"
    engine = SearchEngine(index)
    assert engine.snapshot.mode(None) == "hybrid"
    hits = engine.search("how do I pay", k=3)
    assert all(h.answered is not None and 0 <= h.confidence <= 1 for h in hits)
    assert engine.no_rule_note(None) is None and engine.no_rule_note("hybrid") is None
    unmarked = engine.search("how do I pay", k=3, mode="dense")
    assert len(unmarked) == 3 and all(h.answered is None and h.confidence is None for h in unmarked)
    note = engine.no_rule_note("dense")
    assert "dense search has no no-answer rule" in note and "semsearch calibrate INDEX --mode dense" in note
    assert engine.no_rule_note("dense", min_score=0.5) is None
    scored = engine.search("how do I pay", k=3, mode="dense", min_score=0.5)  # a plain threshold instead
    assert all(h.answered == (h.score >= 0.5) and h.confidence is None for h in scored)
    dense = calibrate(index, queries, qrels, precision=0.5, mode="dense")
    engine = SearchEngine(index)
    assert engine.snapshot.rules == {"hybrid": rule, "dense": dense}
    assert engine.snapshot.mode(None) == "hybrid"
    for mode in (None, "hybrid", "dense"):
        hits = engine.search("how do I pay", k=2, mode=mode)
        assert all(h.answered is not None and 0 <= h.confidence <= 1 for h in hits), mode
    assert all(h.answered is None for h in engine.search("how do I pay", k=3, mode="keyword"))
    assert "semsearch calibrate INDEX --mode keyword" in engine.no_rule_note("keyword")
    stored = open_index(index, vectors=False).info()["calibration"]
    assert {mode: Rule.from_dict(r) for mode, r in stored.items()} == {"hybrid": rule, "dense": dense}
    assert remove_calibration(index, mode="hybrid") is True
    engine = SearchEngine(index)
    assert (engine.snapshot.rules, engine.snapshot.mode(None)) == ({"dense": dense}, "dense")


def test_an_old_single_rule_is_the_rule_of_the_mode_it_names(faq):
    """An index calibrated before rules were kept per mode stored one rule: it is read as its
    mode's rule (dense if it names none), and a new mode's rule is kept beside it."""
    index, _, queries, qrels = faq
    rule = calibrate(index, queries, qrels, precision=0.5, mode="dense")
    old = {k: v for k, v in rule.to_dict().items() if k != "mode"}
    apply_change(index, Change(meta={"calibration": old}))
    engine = SearchEngine(index)
    assert (engine.snapshot.rules, engine.snapshot.mode(None)) == ({"dense": rule}, "dense")
    assert engine.search("how do I pay", k=1)[0].confidence is not None
    hybrid = calibrate(index, queries, qrels, precision=0.5)
    engine = SearchEngine(index)
    assert engine.snapshot.rules == {"dense": rule, "hybrid": hybrid}
    assert engine.snapshot.mode(None) == "hybrid"


def test_keyword_signals_are_features_in_keyword_and_hybrid_mode_only(faq):
    evidence = np.array([0.2, 0.7, 0])
    near = Neighbourhood([1, 2, 3], np.array([0.9, 0.8, 0.5]), ["a", "b", "c"], keywords=evidence)
    rows = near.features(2)
    assert rows[:, FEATURES.index("keyword")].tolist() == pytest.approx([0.2, 0.7])
    assert rows[:, FEATURES.index("agree")].tolist() == pytest.approx([0.2 - 0.7, 0.7 - 0.2])
    index, _, queries, qrels = faq
    with pytest.raises(BadInput, match="in dense mode"):
        calibrate(index, queries, qrels, features=["text", "keyword"], mode="dense")
    rule = calibrate(index, queries, qrels, precision=0.5, features=["text", "keyword", "agree"])
    assert rule.mode == "hybrid" and rule.features == ("text", "keyword", "agree")
    assert SearchEngine(index).search("how do I pay", k=1)[0].confidence is not None


def test_the_default_rule_leaves_the_keyword_signals_to_features(faq):
    """In hybrid mode the rule is still chosen between the plain and the learned one: with the
    keyword signals it was chosen on 11 of 20 StackFAQ dev splits by noise on 12-thread halves,
    answered no more, and kept the promise less often (docs/abstention-guarantee.md); asked for
    by ``features`` it is still fitted."""
    index, _, queries, qrels = faq
    rule = calibrate(index, queries, qrels, precision=0.5)
    assert rule.mode == "hybrid" and rule.features in (("text",), ("text", "gap"))
    assert "learned vs plain" in rule.why and "keywords" not in rule.why


def calibrate_cli(index: Path, queries: Path, qrels: Path, *options: str) -> tuple[str, Rule]:
    """``semsearch calibrate`` in this process: what it printed, and the rule it stored."""
    from click.testing import CliRunner

    from search.cli import cli

    args = ["calibrate", str(index), "--queries", str(queries), "--qrels", str(qrels), "--mode", "dense"]
    said = CliRunner().invoke(cli, [*args, "--min-precision", "0.5", *options])
    assert said.exit_code == 0, said.output
    return said.stdout, SearchEngine(index).snapshot.rules["dense"]


def test_trec_qrels_leave_unjudged_questions_out_of_calibration_as_evaluate_does(faq):
    """TREC's qrels judge a pool: a question they never name is unjudged, not one without an
    answer. Calibrate reads the questions evaluate scores (and those judged with no relevant
    entry, which have none), and says how it read the rest."""
    from search.studies.evaluate import evaluate_retrieval

    index, _, queries, _ = faq
    trec = queries.parent / "qrels.trec"
    judged = [f"in{i} 0 e{i}{a} {1 + i % 3}" for i in range(10) for a in "ab"]
    judged += [f"in{i} 0 e{(i + 1) % 10}a 0" for i in range(10)]  # judged, not relevant
    judged += [f"out{j} 0 e{j}a 0" for j in range(5)]  # judged: no relevant entry
    trec.write_text("\n".join(judged) + "\n")  # out5..out9: never judged
    said, rule = calibrate_cli(index, queries, trec)
    assert (rule.asked, rule.asked_unanswerable, rule.left_out) == (15, 5, 5)
    scored = evaluate_retrieval(read_retrieval_set(queries, trec), index_dir=index)["queries"]
    assert rule.asked - rule.asked_unanswerable == scored == 10
    line = next(x for x in said.splitlines() if x.startswith("unjudged:"))
    assert "10 of the 20 questions have no relevant judgement" in line
    assert "5 judged with none relevant read as ones with no answer in the index" in line
    assert "5 never judged left out, as evaluate leaves them out" in line
    assert "--unanswerable-ids" in line
    assert "33% of the 15 labelled questions have no answer in the index" in said
    assert "5 unjudged left out" in rule.measured_on


def test_the_mixed_file_convention_still_reads_unjudged_questions_as_unanswerable_and_says_so(faq):
    """Qrels of relevant judgements alone, beside a questions file holding questions none of
    them names (the off-topic ones): those have no answer, and calibrate says it read them so."""
    index, _, queries, qrels = faq
    said, rule = calibrate_cli(index, queries, qrels)
    assert (rule.asked, rule.asked_unanswerable, rule.left_out) == (20, 10, 0)
    line = next(x for x in said.splitlines() if x.startswith("unjudged:"))
    assert "10 of the 20 questions have no relevant judgement: read as ones with no answer" in line
    assert "qrels of relevant judgements alone" in line and "--unanswerable-ids" in line


def test_unanswerable_ids_name_the_questions_without_an_answer_and_leave_the_other_unjudged_out(faq):
    index, _, queries, qrels = faq
    named = queries.parent / "none.txt"
    named.write_text("out0\nout1\nout2\n")
    said, rule = calibrate_cli(index, queries, qrels, "--unanswerable-ids", str(named))
    assert (rule.asked, rule.asked_unanswerable, rule.left_out) == (13, 3, 7)
    line = next(x for x in said.splitlines() if x.startswith("unjudged:"))
    assert "3 named by --unanswerable-ids read as ones with no answer in the index" in line
    assert "7 never judged left out, as evaluate leaves them out" in line
    for wrong, message in (("in3\n", "in3 is named unanswerable"), ("nobody\n", "no question asked")):
        named.write_text(wrong)
        with pytest.raises(BadInput, match=message):
            data = read_retrieval_set(queries, qrels)
            calibrate_index(index, data.queries, data.qrels, no_answer=data.without_answer([wrong.strip()]))


@pytest.mark.parametrize(
    ("feature", "mode", "score", "said"),
    [
        ("score", "dense", "", "a threshold on the cosine alone"),
        ("score", "hybrid", "", "a threshold on the hybrid score alone"),
        ("score", "keyword", "", "a threshold on the keyword score alone"),
        ("text", "hybrid", "", "a threshold on the cosine of the entry's own text alone"),
        ("keyword", "hybrid", "", "a threshold on the keyword evidence alone"),
        ("score", "dense", "rerank:abc", "a threshold on the reranked score alone"),
        ("text", "hybrid", "rerank:abc", "a threshold on the reranked score alone"),
    ],
)
def test_info_names_the_score_a_one_feature_rule_thresholds(feature, mode, score, said):
    rule = Rule((feature,), (0.0,), (1.0,), (1.0,), 0.0, 0.5, 0.9, 0.95, 0.5, 40, mode=mode, score=score)
    searched = f"search reranked ({score})" if score else "search"
    assert f"{mode} {searched}: {said}; precision 0.9" in rule.describe()
