"""The studies with a second stage: STS scored by a cross-encoder, retrieval measured through the
search's own rerank stage, and the no-answer rule fitted on the reranker's scores, stored under
that score's key and never applied to another score."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from indexer import Strategy, build_index
from indexer.embedding.cross_folder import CrossFolder, read_cross_folder
from indexer.store import open_index
from search.read.confidence import FEATURES, Neighbourhood, rule_key, score_kind, stored_rules
from search.read.engine import SearchEngine
from search.read.reranked import RERANKER_KEY, Reranking, RerankOptions
from search.studies.abstention import evaluate_abstention
from search.studies.calibrate import calibrate_index, remove_calibration
from search.studies.evaluate import (
    evaluate_retrieval,
    evaluate_sts_reranked,
    read_pairs,
    read_retrieval_set,
    retrieval_metrics,
)
from tests.helpers import random_cross_encoder

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
    "Do you offer student discounts?",
    "How long can I keep a bike?",
]
OTHERS = ["purple elephants dance at midnight", "quantum chromodynamics lecture notes"]
PAIRS = [
    ("A man is playing a guitar.", "A person plays guitar.", 4.6),
    ("A dog runs in the park.", "A cat sleeps on a sofa.", 0.8),
    ("The stock market fell sharply.", "Shares dropped steeply today.", 4.0),
    ("A woman is slicing onions.", "Someone is cutting vegetables.", 3.5),
    ("Kids play football outside.", "The parliament passed a law.", 0.1),
    ("A plane lands at the airport.", "An aircraft touches down.", 4.8),
]


class Overlap:
    """A reranker (``indexer.encoders.rerankers.Reranker``) that knows the right answer: a pair
    scores the share of the question's words the text holds, as a raw logit (``logits``: 12 *
    share - 6, what a reranker without an activation gives) or as the share. Its ``folder``
    (a real one) gives it the identity a rule is stored under."""

    runtime = "test"

    def __init__(self, folder: CrossFolder, logits: bool = True):
        self.folder, self.logits = folder, logits

    def score(self, question: str, texts: Sequence[str]) -> np.ndarray:
        return self.score_pairs([(question, text) for text in texts])

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        shares = [len(_words(q) & _words(t)) / max(len(_words(q)), 1) for q, t in pairs]
        found = np.array(shares, dtype=np.float32)
        return 12 * found - 6 if self.logits else found


def _words(text: str) -> set[str]:
    return {w.strip("?.,").lower() for w in text.split()}


def write_faq(directory: Path) -> tuple[Path, Path, Path]:
    """Twelve questions, each with two answers (one text), questions worded a little otherwise
    (answerable, judged) and unrelated ones (unjudged: unanswerable)."""
    corpus, queries, qrels = directory / "faq.jsonl", directory / "q.jsonl", directory / "qrels.tsv"
    rows = [
        {"id": f"e{i}{a}", "text": t, "answer": f"answer {a} to {i}"}
        for i, t in enumerate(TOPICS)
        for a in "ab"
    ]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    asked = [{"id": f"in{i}", "text": "please, " + t.lower()} for i, t in enumerate(TOPICS)]
    asked += [{"id": f"out{i}", "text": t} for i, t in enumerate(OTHERS)]
    queries.write_text("".join(json.dumps(q) + "\n" for q in asked))
    judged = "".join(f"in{i}\te{i}{a}\t1\n" for i in range(len(TOPICS)) for a in "ab")
    qrels.write_text("query_id\tdoc_id\trelevance\n" + judged)
    return corpus, queries, qrels


@pytest.fixture()
def faq(tmp_path, tiny_model) -> tuple[Path, Path, Path, Path]:
    corpus, queries, qrels = write_faq(tmp_path)
    build_index(corpus, tmp_path / "idx", Strategy(model=tiny_model))
    return tmp_path / "idx", corpus, queries, qrels


@pytest.fixture(scope="module")
def cross(tmp_path_factory) -> str:
    """A random raw-logit cross-encoder, as sentence-transformers saves one."""
    return random_cross_encoder(tmp_path_factory.mktemp("cross"), activation="identity")


def test_sts_reranked_is_the_cross_encoders_correlation(tmp_path, cross):
    from scipy.stats import pearsonr, spearmanr
    from sentence_transformers import CrossEncoder

    path = tmp_path / "pairs.tsv"
    path.write_text("score\tsentence1\tsentence2\n" + "".join(f"{g}\t{a}\t{b}\n" for a, b, g in PAIRS))
    pairs = read_pairs(path)
    scores = evaluate_sts_reranked(pairs, cross)
    predicted = CrossEncoder(cross, device="cpu").predict([(a, b) for a, b, _ in PAIRS])
    gold = [g for _, _, g in PAIRS]
    assert scores["spearman"] == pytest.approx(spearmanr(predicted, gold).statistic * 100, abs=1e-6)
    assert scores["pearson"] == pytest.approx(pearsonr(predicted, gold).statistic * 100, abs=1e-3)
    assert scores["pairs"] == len(PAIRS) and "identity activation" in scores["reranker"]


def test_sts_rerank_takes_no_strategy_and_depth_needs_a_reranker(tmp_path, cross):
    from search.cli import cli

    path = tmp_path / "pairs.tsv"
    path.write_text("score\tsentence1\tsentence2\n" + "".join(f"{g}\t{a}\t{b}\n" for a, b, g in PAIRS))
    said = CliRunner().invoke(cli, ["evaluate", "sts", str(path), "--rerank", cross, "--pooling", "cls"])
    assert said.exit_code == 2 and "drop the strategy options" in said.output
    asked = ["evaluate", "retrieval", "--corpus", str(path), "--queries", str(path), "--qrels", str(path)]
    said = CliRunner().invoke(cli, [*asked, "--rerank-depth", "20"])
    assert said.exit_code == 2 and "--rerank-depth needs --rerank" in said.output


def test_retrieval_is_measured_through_the_searchs_rerank_stage(faq, cross):
    index, _, queries, qrels = faq
    data = read_retrieval_set(queries, qrels)
    report = evaluate_retrieval(data, index_dir=index, rerank=RerankOptions(cross, 12))
    engine = SearchEngine(index, rerank=cross)
    hits = engine.search_many([q.text for q in data.queries], 10, rerank_depth=12)
    searched = retrieval_metrics(
        {q.id: [h.id for h in found] for q, found in zip(data.queries, hits, strict=True)}, data.qrels
    )
    assert {name: report[name] for name in searched} == searched
    assert report["mode"] == "hybrid reranked" and report["rerank depth"] == "12"
    first = evaluate_retrieval(data, index_dir=index)  # each mode's first stage beside the reranked
    assert all(report[f"{m} mrr@10"] == first[f"{m} mrr@10"] for m in ("dense", "keyword", "hybrid"))


def test_a_rule_on_a_rerankers_logits_is_stored_under_its_score_and_squashes_them(faq, cross):
    index, _, queries, qrels = faq
    data = read_retrieval_set(queries, qrels)
    first = calibrate_index(index, data.queries, data.qrels)
    folder = read_cross_folder(cross)
    alone = Reranking(Overlap(folder), 20, weight=1.0)  # a weight given is kept, not fitted
    rule = calibrate_index(index, data.queries, data.qrels, reranking=alone)
    kind = score_kind(folder.fingerprint)
    meta = open_index(index).meta
    stored = stored_rules(meta["calibration"])
    assert stored == {"hybrid": first, rule_key("hybrid", kind): rule}  # side by side, each its key
    assert rule.score == kind and rule.precision >= 0.95
    assert meta[RERANKER_KEY] == {
        "path": folder.path,
        "fingerprint": folder.fingerprint,
        "weight": 1.0,
    }
    # the rule maps the reranker's raw logits to a probability, rising with the logit (Platt)
    groups = [str(i) for i in range(12)]
    confidence = [
        float(
            rule.confidence(
                Neighbourhood(list(range(12)), np.array([top] + [-6.0] * 11), groups).features(1)
            )[0]
        )
        for top in (-4.0, 0.0, 4.0)
    ]
    assert 0 < confidence[0] < confidence[1] < confidence[2] < 1
    row = np.zeros((1, len(FEATURES)))
    assert rule.confidence(row)[0] != first.confidence(row)[0]  # two rules, two scores


class Contrary(Overlap):
    """A reranker that ranks the right answer last: worse than any first stage."""

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        return -super().score_pairs(pairs)


class Counted(Overlap):
    """``Overlap`` noting every batch of pairs it is asked to score."""

    def __init__(self, folder: CrossFolder):
        super().__init__(folder)
        self.batches: list[list[tuple[str, str]]] = []

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        self.batches.append(list(pairs))
        return super().score_pairs(pairs)


def test_a_reranker_that_does_not_help_is_fused_at_weight_0_so_the_search_keeps_the_first_stage(
    faq, cross, monkeypatch
):
    from search.studies import fusion

    monkeypatch.setattr(fusion, "TOLD_AFTER", 0.0)  # every set is large: its time is said first
    index, _, queries, qrels = faq
    data = read_retrieval_set(queries, qrels)
    folder = read_cross_folder(cross)
    told: list[str] = []
    calibrate_index(
        index, data.queries, data.qrels, reranking=Reranking(Contrary(folder), 20), report=told.append
    )
    assert open_index(index).meta[RERANKER_KEY]["weight"] == 0.0
    assert any("does not surely beat the first stage" in line for line in told)
    assert "more pairs at" in told[0] and "minutes" in told[0]  # said before the rest is reranked
    reranked = SearchEngine(index).search(TOPICS[3], 5)  # the index's reranker, at its weight 0
    first = SearchEngine(index, rerank=False).search(TOPICS[3], 5)
    assert [h.id for h in reranked] == [h.id for h in first]
    assert all(h.score == h.first_score for h in reranked)


def test_a_batchs_pairs_are_scored_together_each_once(faq, cross):
    index, *_ = faq
    counted = Counted(read_cross_folder(cross))
    engine = SearchEngine(index, rerank=counted)
    asked = [TOPICS[0], TOPICS[1], TOPICS[0]]
    found = engine.answer(engine.request(asked, k=3, rerank_depth=10))
    assert len(counted.batches) == 1  # the whole batch's pairs in one call
    (pairs,) = counted.batches
    assert len(pairs) == len(set(pairs))  # the repeated question, and texts two entries share: once
    assert {q for q, _ in pairs} == {TOPICS[0], TOPICS[1]}
    assert found[0] == found[2]
    alone = engine.search(TOPICS[1], 3)  # a batch of one ranks as in the batch
    assert [h.id for h in alone] == [h.id for h in found[1]] and alone == found[1]


def test_a_first_stage_rule_never_marks_reranked_hits(faq, cross):
    index, _, queries, qrels = faq
    data = read_retrieval_set(queries, qrels)
    calibrate_index(index, data.queries, data.qrels)
    engine = SearchEngine(index, rerank=cross)
    (top, *_) = engine.search(TOPICS[0], 3)
    assert top.first_score is not None and top.answered is None and top.confidence is None
    assert "reranked has no no-answer rule" in engine.no_rule_note(None, rerank=cross)
    (plain, *_) = SearchEngine(index, rerank=False).search(TOPICS[0], 3)
    assert plain.first_score is None and plain.confidence is not None  # its own score's rule
    # fitted on this reranker's scores, the reranked search is marked by it, by default
    folder = read_cross_folder(cross)
    calibrate_index(index, data.queries, data.qrels, reranking=Reranking(Overlap(folder), 20))
    (marked, *_) = SearchEngine(index).search(TOPICS[0], 3)
    assert marked.first_score is not None and marked.confidence is not None
    assert remove_calibration(index, score=score_kind(folder.fingerprint)) is True
    assert set(stored_rules(open_index(index).meta["calibration"])) == {"hybrid"}


def test_abstention_is_measured_on_the_rerankers_scores(faq, cross, tiny_model):
    _, corpus, queries, qrels = faq
    data = read_retrieval_set(queries, qrels)
    folder = read_cross_folder(cross)
    tiny = Strategy(model=tiny_model)
    logits = evaluate_abstention(
        corpus, data, seeds=range(2), strategy=tiny, reranking=Reranking(Overlap(folder), 20)
    )
    shares = evaluate_abstention(
        corpus, data, seeds=range(2), strategy=tiny, reranking=Reranking(Overlap(folder, logits=False), 20)
    )
    assert logits.described["reranker"].startswith(folder.path)
    assert int(logits.described["rerank depth"]) >= 20  # what was reranked: the neighbourhood a rule reads
    # the rules read the reranker's score: a monotone map of it ranks the test questions alike
    assert [s.rule.auroc for s in logits.per_seed] == pytest.approx([s.rule.auroc for s in shares.per_seed])


def test_a_sweep_reranks_its_best_cell_through_the_search(faq, cross, tiny_model, monkeypatch):
    from indexer.errors import BadInput
    from search.studies import sweep

    _, corpus, queries, qrels = faq
    data = read_retrieval_set(queries, qrels)
    base = Strategy(model=tiny_model)
    found = sweep.retrieval_sweep(data, corpus, base, poolings=("mean",), rerank=RerankOptions(cross, 12))
    best = found.cells[0].strategy
    alone = evaluate_retrieval(data, corpus=corpus, strategy=best, rerank=RerankOptions(cross, 12))
    assert found.reranked == alone and found.reranked["mode"] == "hybrid reranked"
    monkeypatch.setattr(sweep, "_embed_grid", lambda *a, **k: pytest.fail("embedded before the check"))
    with pytest.raises(BadInput, match="rerank_depth must be at least k"):
        sweep.retrieval_sweep(data, corpus, base, rerank=RerankOptions(cross, 5))


def test_calibrate_rerank_says_what_it_stored(faq, cross, monkeypatch):
    from search.cli import cli
    from search.studies import calibrate

    index, _, queries, qrels = faq
    folder = read_cross_folder(cross)
    asked = []

    def reranking_of(rerank: RerankOptions) -> Reranking:
        asked.append((rerank.model, rerank.depth, rerank.weight))
        return Reranking(Overlap(folder), rerank.depth or 50, rerank.weight)

    monkeypatch.setattr(calibrate, "reranking_of", reranking_of)
    command = ["calibrate", str(index), "--queries", str(queries), "--qrels", str(qrels)]
    tuned = ["--rerank-depth", "30", "--rerank-weight", "0.25"]
    said = CliRunner().invoke(cli, [*command, "--rerank", cross, *tuned, "--min-precision", "0.9"])
    assert said.exit_code == 0, said.output
    assert asked == [(cross, 30, 0.25)] and f"(hybrid search reranked by {cross})" in said.output
    assert open_index(index).meta[RERANKER_KEY]["weight"] == 0.25  # a weight given is stored, not fitted
    assert f"reranker:   {cross} stored as the index's default" in said.output
    assert open_index(index).meta[RERANKER_KEY]["fingerprint"] == folder.fingerprint
    removed = CliRunner().invoke(cli, ["calibrate", str(index), "--remove", "--rerank", cross])
    assert removed.exit_code == 0 and f"calibration reranked by {cross} removed" in removed.output
    assert CliRunner().invoke(cli, [*command, "--rerank-depth", "30"]).exit_code == 2


def test_sweep_rerank_prints_the_best_cells_reranked_search(faq, cross, tiny_model):
    from search.cli import cli

    _, corpus, queries, qrels = faq
    asked = ["sweep", "retrieval", "--corpus", str(corpus), "--queries", str(queries), "--qrels", str(qrels)]
    said = CliRunner().invoke(cli, [*asked, "--model", tiny_model, "--poolings", "mean", "--rerank", cross])
    assert said.exit_code == 0, said.output
    line = next(line for line in said.output.splitlines() if line.startswith("reranked:"))
    assert "in hybrid mode, its best 50 reranked by" in line and "mrr@10" in line and "(first stage" in line


def test_studies_of_an_index_never_load_its_default_reranker(faq, tmp_path):
    import shutil

    index, _, queries, qrels = faq
    data = read_retrieval_set(queries, qrels)
    folder = read_cross_folder(random_cross_encoder(tmp_path / "gone", seed=1))
    calibrate_index(index, data.queries, data.qrels, reranking=Reranking(Overlap(folder), 20))
    shutil.rmtree(folder.path)  # the index's default reranker is no longer on this machine
    assert evaluate_retrieval(data, index_dir=index)["mode"] == "hybrid"
    assert calibrate_index(index, data.queries, data.qrels).score == ""
