"""Measuring strategies: pair and qrels readers, metric definitions, the sweep agreeing with a
single evaluation, and the published numbers reproduced on the real data."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from indexer.embedding.strategy import Strategy
from indexer.errors import BadInput, SemsearchError
from search.studies.evaluate import (
    evaluate_retrieval,
    evaluate_sts,
    read_pairs,
    read_qrels,
    read_retrieval_set,
    retrieval_metrics,
)
from search.studies.sweep import reproduce, retrieval_sweep, sweep_sts
from search.studies.sweep_output import write_csv, write_heatmap
from tests.helpers import shared_file

PAIRS = [
    ("A man is playing a guitar.", "A person plays guitar.", 4.6),
    ("A dog runs in the park.", "A cat sleeps on a sofa.", 0.8),
    ("The stock market fell sharply.", "Shares dropped steeply today.", 4.0),
    ("A woman is slicing onions.", "Someone is cutting vegetables.", 3.5),
    ("Kids play football outside.", "The parliament passed a law.", 0.1),
    ("A plane lands at the airport.", "An aircraft touches down.", 4.8),
]


def write_pairs(tmp_path: Path) -> Path:
    path = tmp_path / "pairs.tsv"
    lines = ["score\tsentence1\tsentence2"] + [f"{g}\t{a}\t{b}" for a, b, g in PAIRS]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_pair_formats(tmp_path):
    assert read_pairs(write_pairs(tmp_path)).first[0] == PAIRS[0][0]
    original = tmp_path / "sts-dev.csv"  # STS Benchmark as distributed: no header, 7+ fields
    original.write_text(
        "".join(f'main-news\tf\t2012\t{i}\t{g}\t{a} "q"\t{b}\textra\n' for i, (a, b, g) in enumerate(PAIRS)),
        encoding="utf-8",
    )
    pairs = read_pairs(original)
    assert pairs.first[0] == PAIRS[0][0] + ' "q"' and pairs.gold.tolist() == [g for _, _, g in PAIRS]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("\n".join(json.dumps({"a": a, "b": b, "y": g}) for a, b, g in PAIRS), encoding="utf-8")
    assert len(read_pairs(jsonl, "a", "b", "y").gold) == len(PAIRS)
    with pytest.raises(SemsearchError, match="--sentence1"):
        read_pairs(write_pairs(tmp_path), s1="left")


def test_retrieval_metrics_by_hand():
    qrels = {"q1": {"d1": 1, "d2": 1}, "q2": {"d9": 2}, "q3": {"d3": 1}}
    ranked = {"q1": ["d5", "d1", "d2"], "q2": ["d9"], "q3": ["d7", "d8"], "unjudged": ["d1"]}
    m = retrieval_metrics(ranked, qrels)
    assert m["queries"] == 3
    assert m["mrr@10"] == pytest.approx((1 / 2 + 1 + 0) / 3)
    ndcg_q1 = (1 / math.log2(3) + 1 / math.log2(4)) / (1 + 1 / math.log2(3))
    assert m["ndcg@10"] == pytest.approx((ndcg_q1 + 1 + 0) / 3)
    assert m["recall@1"] == pytest.approx((0 + 1 + 0) / 3)
    assert m["recall@10"] == pytest.approx((1 + 1 + 0) / 3)
    assert m["success@1"] == pytest.approx(1 / 3) and m["success@3"] == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    ("k", "message"), [(True, "not True"), (2.5, "not 2.5"), ("5", "not '5'"), (0, "at least 1")]
)
def test_a_metric_cutoff_is_a_whole_number_as_a_search_takes(k, message):
    """``k=True`` is no cutoff of 1 (nor metrics named ``mrr@True``): refused as a search refuses it."""
    from search.studies.evaluate import evaluate_retrieval
    from search.studies.labels import RetrievalSet

    with pytest.raises(BadInput, match=message):
        retrieval_metrics({"q1": ["d1"]}, {"q1": {"d1": 1}}, k=k)
    with pytest.raises(BadInput, match=message):  # before any index is opened or built
        evaluate_retrieval(RetrievalSet([], {}), index_dir="no-such-index", k=k)


@pytest.mark.slow
def test_metric_names_follow_k(tmp_path):
    qrels = {"q1": {"d6": 1}}
    ranked = {"q1": ["d1", "d2", "d3", "d4", "d5", "d6"]}
    m = retrieval_metrics(ranked, qrels, k=5)
    assert set(m) == {"mrr@5", "ndcg@5", "recall@1", "recall@5", "success@1", "success@3", "queries"}
    assert m["mrr@5"] == 0.0 and m["recall@5"] == 0.0  # d6 is ranked 6th: outside the top 5
    assert retrieval_metrics(ranked, qrels)["mrr@10"] == pytest.approx(1 / 6)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps({"id": f"d{i}", "text": a}) for i, (a, _, _) in enumerate(PAIRS)))
    queries = tmp_path / "queries.jsonl"
    queries.write_text(json.dumps({"id": "q0", "text": PAIRS[0][1]}))
    judged = tmp_path / "qrels.tsv"
    judged.write_text("q0\td0\t1\n")
    data = read_retrieval_set(queries, judged)
    assert "mrr@5" in evaluate_retrieval(data, corpus=corpus, k=5)
    cells = retrieval_sweep(data, corpus, poolings=("mean",), k=5).cells
    assert "ndcg@5" in cells[0].scores and "ndcg@10" not in cells[0].scores


def test_qrels_with_header_trec_and_errors(tmp_path):
    path = tmp_path / "qrels.tsv"
    path.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t0\nq2 0 d3 2\n", encoding="utf-8")
    assert read_qrels(path) == {"q1": {"d1": 1}, "q2": {"d3": 2}}
    path.write_text("q1\td1\t1\nbroken line\n", encoding="utf-8")
    with pytest.raises(SemsearchError, match="line 2"):
        read_qrels(path)


def test_sweep_cell_equals_evaluate_with_that_strategy(tmp_path, tiny_model, plotting):
    pairs = read_pairs(write_pairs(tmp_path))
    cells = sweep_sts(pairs, Strategy(model=tiny_model), postprocesses=("none", "center"))
    assert len(cells) == 2 * (4 * (4 + 4) + 1)  # (layers 0..3 + 4 combos) x 4 poolings + pooler, x 2
    for cell in (cells[0], cells[len(cells) // 2], *[c for c in cells if c.strategy.pooling == "pooler"]):
        assert cell.strategy.backend == "onnx"  # the default: what `index` with these options runs
        # computed in one torch pass over every layer: the same cell alone on torch, exactly
        alone = evaluate_sts(pairs, replace(cell.strategy, backend="torch"))
        assert alone["spearman"] == pytest.approx(cell.scores["spearman"], abs=1e-6)
        assert alone["pearson"] == pytest.approx(cell.scores["pearson"], abs=1e-4)
    assert "--layers" in reproduce(cells[0].strategy)
    write_csv(cells, tmp_path / "sweep.csv")
    assert len((tmp_path / "sweep.csv").read_text().splitlines()) == len(cells) + 1
    pytest.importorskip("matplotlib")
    write_heatmap(cells, "spearman", tmp_path / "sweep.png", "pairs")
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_retrieval_sweep_cell_equals_evaluate(tmp_path):
    """Real model, and no cls cells: a layer's [CLS] vectors before fine-tuning sit at cosine 0.99999
    of each other, so float noise alone orders them."""
    corpus = tmp_path / "corpus.jsonl"
    docs = [{"id": f"d{i}", "text": a} for i, (a, _, _) in enumerate(PAIRS)]
    corpus.write_text("\n".join(json.dumps(d) for d in docs), encoding="utf-8")
    queries = tmp_path / "queries.jsonl"
    queries.write_text("\n".join(json.dumps({"id": f"q{i}", "text": b}) for i, (_, b, _) in enumerate(PAIRS)))
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query_id\tdoc_id\trelevance\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(len(PAIRS))))
    data = read_retrieval_set(queries, qrels)
    cells = retrieval_sweep(data, corpus, Strategy(), postprocesses=("none", "center")).cells
    checked = [c for c in cells if c.strategy.pooling != "cls"]
    assert len(checked) >= 6
    for cell in checked[:3] + checked[-3:]:
        alone = evaluate_retrieval(data, corpus=corpus, strategy=cell.strategy)
        for metric in ("mrr@10", "ndcg@10", "recall@1"):  # a sweep cell is dense search
            dense = alone[f"dense {metric}"]
            assert dense == pytest.approx(cell.scores[metric], abs=1e-9), (cell.row, cell.strategy)


@pytest.mark.slow
def test_bundled_model_on_stsb_dev_matches_published_and_beats_second_to_last():
    pairs = read_pairs(shared_file("stsb", "stsb-dev.tsv"))
    default = evaluate_sts(pairs)
    assert default["spearman"] == pytest.approx(86.72, abs=0.05)  # MTEB: all-MiniLM-L6-v2 dev 86.72
    second_to_last = evaluate_sts(pairs, Strategy(layers=(-2,), pooling="mean"))
    assert default["spearman"] - second_to_last["spearman"] > 5


@pytest.mark.slow
def test_stackfaq_default_beats_tfidf_floor():
    root = ("stackfaq",)
    data = read_retrieval_set(shared_file(*root, "queries.jsonl"), shared_file(*root, "qrels.tsv"))
    scores = evaluate_retrieval(
        data, corpus=shared_file(*root, "corpus.jsonl"), text_fields=["text", "answer"]
    )
    assert scores["queries"] == 499
    assert scores["mrr@10"] > 0.718  # the README's TF-IDF floor for text+answer
    assert np.isfinite(scores["ndcg@10"])


def test_a_header_of_binary_junk_is_named_without_its_bytes(tmp_path):
    """The error quotes the header it could not use: escaped and cut short, never raw control
    bytes written to the user's terminal."""
    junk = tmp_path / "junk.tsv"
    junk.write_bytes(b"\x1b[2J\x07bell\tx" + bytes(range(1, 32)) * 40 + b"\n")
    with pytest.raises(SemsearchError) as caught:
        read_pairs(junk)
    message = str(caught.value)
    assert "no columns" in message and len(message) < 400
    assert not any(ord(c) < 32 for c in message)


def write_rows(path: Path, rows: list[tuple[str, str, str]]) -> Path:
    path.write_text(
        "sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in rows), encoding="utf-8"
    )
    return path


def test_pairs_without_a_usable_score_are_rejected_rows_with_their_reasons(tmp_path):
    good = [(a, b, str(g)) for a, b, g in PAIRS]
    bad = [("x", "y", "nan"), ("x", "y", "inf"), ("x", "y", ""), ("x", "y", "high"), ("", "y", "1")]
    pairs = read_pairs(write_rows(tmp_path / "p.tsv", good + bad))
    assert pairs.first == [a for a, _, _ in PAIRS] and np.isfinite(pairs.gold).all()
    assert [(r.row, r.reason) for r in pairs.rejected] == [
        (7, "score is not a finite number: 'nan'"),
        (8, "score is not a finite number: 'inf'"),
        (9, "no score"),
        (10, "score is not a finite number: 'high'"),
        (11, "no sentence1"),
    ]
    with pytest.raises(SemsearchError, match="fewer than 3 usable sentence pairs .*4 rows rejected"):
        read_pairs(write_rows(tmp_path / "q.tsv", good[:2] + bad[:4]))


def test_scores_that_never_differ_are_one_line_saying_why(tmp_path):
    constant = write_rows(tmp_path / "c.tsv", [(a, b, "3") for a, b, _ in PAIRS])
    for need_score in (True, False):  # evaluate sts and sweep sts; tune's labels
        with pytest.raises(SemsearchError, match="all 6 pairs score 3: .*needs two different scores"):
            read_pairs(constant, need_score=need_score)


def judged_set(tmp_path: Path, judged: list[str]) -> tuple[Path, Path, Path]:
    """A corpus of six entries (e0..e5) and four questions, question i judged against
    ``judged[i]``."""
    corpus = tmp_path / "corpus.csv"
    topics = ["bikes", "billing", "parking", "helmets", "app", "stations"]
    corpus.write_text("id,text\n" + "".join(f"e{i},entry {i} about {t}\n" for i, t in enumerate(topics)))
    queries = tmp_path / "queries.jsonl"
    queries.write_text(
        "".join(json.dumps({"id": f"q{i}", "text": f"about {topics[i]}"}) + "\n" for i in range(4))
    )
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("".join(f"q{i}\t{doc}\t1\n" for i, doc in enumerate(judged)))
    return corpus, queries, qrels


def test_judged_ids_missing_from_the_index_are_said_and_none_held_is_one_error(tmp_path, tiny_model):
    """Qrels naming entries the index lacks (another corpus, rows a build dropped) score 0 in every
    mode: evaluate, sweep and calibrate say on stderr how many judged ids are not in the index,
    and stop with one line where it holds none of them."""
    from click.testing import CliRunner

    from indexer import build_index
    from search.cli import cli

    corpus, queries, qrels = judged_set(tmp_path, ["e0", "e1", "x8", "x9"])
    given = ["--corpus", str(corpus), "--queries", str(queries), "--qrels", str(qrels), "--model", tiny_model]
    note = "2 of the 4 judged ids are not in the index (x8, x9): "
    said = CliRunner().invoke(cli, ["evaluate", "retrieval", *given])
    assert said.exit_code == 0, said.output
    assert note + "questions judged only against them score 0" in said.stderr.splitlines()
    swept = CliRunner().invoke(cli, ["sweep", "retrieval", *given, "--poolings", "mean"])
    assert swept.exit_code == 0, swept.output
    assert note + "questions judged only against them score 0" in swept.stderr.splitlines()
    index = tmp_path / "index"
    build_index(corpus, index, Strategy(model=tiny_model))
    calibrated = CliRunner().invoke(
        cli,
        ["calibrate", str(index), "--queries", str(queries), "--qrels", str(qrels), "--min-precision", "0.1"],
    )
    assert note + "questions judged only against them are read as ones it cannot answer" in calibrated.stderr
    _, _, elsewhere = (
        judged_set(tmp_path / "other", ["x1", "x2", "x3", "x4"])
        if (tmp_path / "other").mkdir() is None
        else ()
    )
    for command in (["evaluate", "retrieval"], ["sweep", "retrieval"]):
        failed = CliRunner().invoke(
            cli, [*command, *given[:4], "--qrels", str(elsewhere), "--model", tiny_model]
        )
        assert failed.exit_code == 1, failed.output
        assert failed.stderr.splitlines() == [
            "Error: none of the 4 judged ids is in the index (e.g. x1, x2, x3): "
            "are the qrels for this corpus, and did the build keep their rows?"
        ]
