"""A sweep's grid is checked from plain values before any model loads: a typo in a pooling name
costs nothing, not a model load and a pass over the data."""

from __future__ import annotations

import pytest

from indexer.embedding.strategy import SWEPT, Strategy
from indexer.errors import BadInput
from search.cli.printing import report_modes, report_sweep
from search.studies.evaluate import Pairs
from search.studies.sweep import Cell, Modes, SweepPlan, best_first, plan_sweep, sweep_sts

PAIRS = Pairs(
    ["a cat", "a dog", "a car"], ["one cat", "one dog", "one bus"], __import__("numpy").array([5.0, 4, 3])
)


@pytest.fixture
def no_model_loads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the grid was checked")

    monkeypatch.setattr("indexer.encoders.torch_encoder.load_model", refuse)


@pytest.mark.parametrize(
    "values,message",
    [
        ({"poolings": ["mean", "median"]}, "median"),
        ({"poolings": []}, "pooling"),
        ({"postprocesses": ["none", "blur"]}, "blur"),
        ({"whiten_dims": 64}, "whiten"),
        ({"whiten_dims": 0, "postprocesses": ["whiten"]}, "whiten"),
        ({"max_length": 2}, "max_length"),
        ({"max_length": 4096}, "limit"),
        ({"model": "no-such-org/no-such-model"}, "no-such-model"),
    ],
)
def test_bad_grids_fail_before_any_model_loads(no_model_loads, values, message):
    with pytest.raises(BadInput, match=message):
        plan_sweep(**values)


def test_sweeps_check_their_grid_first(no_model_loads, tiny_model):
    with pytest.raises(BadInput, match="median"):
        sweep_sts(PAIRS, Strategy(model=tiny_model), poolings=("median",))
    with pytest.raises(BadInput, match="blur"):
        sweep_sts(PAIRS, Strategy(model=tiny_model), postprocesses=("blur",))


def test_a_good_plan(tiny_model):
    plan = plan_sweep(
        model=tiny_model,
        max_length=64,
        poolings=["mean", "cls", "mean"],
        postprocesses=["whiten"],
        whiten_dims=8,
    )
    assert plan == SweepPlan(
        Strategy(model=tiny_model, max_length=64, postprocess="whiten", whiten_dims=8),
        ("mean", "cls"),
        ("whiten",),
    )
    assert plan_sweep().poolings == SWEPT and plan_sweep().postprocesses == ("none",)


def test_sweep_outputs_go_into_a_directory_that_does_not_exist_yet(tmp_path):
    # before: `sweep ... --csv out/sweep.csv` computed the whole grid, then ended in an unexpected
    # FileNotFoundError for the missing `out/`
    from search.studies.sweep import Cell
    from search.studies.sweep_output import write_csv

    cells = [Cell("layer 1", Strategy(layers=(1,), pooling="mean"), {"mrr@10": 0.5})]
    write_csv(cells, tmp_path / "out" / "sweep.csv")
    assert (tmp_path / "out" / "sweep.csv").read_text().startswith("row,layers")
    (tmp_path / "file").write_text("")
    for place in (tmp_path / "file" / "sweep.csv", tmp_path / "file" / "deeper" / "sweep.csv"):
        said = f"^cannot write {place}: {tmp_path / 'file'} is a file, not a folder$"
        with pytest.raises(BadInput, match=said):
            write_csv(cells, place)


def modes_measured(dense: float, hybrid: dict[float, float]) -> Modes:
    """A sweep's modes with these mrr@10 figures (dense, and hybrid at each keyword share)."""
    return Modes(
        Cell("last", Strategy(), {"mrr@10": dense}),
        {"mrr@10": 0.2},
        {weight: {"mrr@10": value} for weight, value in hybrid.items()},
    )


def test_where_every_keyword_weight_scores_below_dense_the_sweep_says_dense_wins(capsys):
    modes = modes_measured(0.61, {0.05: 0.6, 0.15: 0.58, 0.5: 0.4})
    assert modes.dense_wins("mrr@10")
    report_modes(modes, "mrr@10")
    said = capsys.readouterr().out
    assert "--hybrid-weight" not in said and "store it" not in said
    assert "dense wins by mrr@10: dense 0.610, the best keyword weight 0.05 0.600" in said
    assert "--mode dense" in said and "semsearch calibrate INDEX --mode dense" in said


def test_where_a_keyword_weight_beats_dense_the_sweep_says_how_to_store_it(capsys):
    modes = modes_measured(0.55, {0.05: 0.6, 0.15: 0.58, 0.5: 0.4})
    assert not modes.dense_wins("mrr@10")
    report_modes(modes, "mrr@10")
    said = capsys.readouterr().out
    assert "best keyword weight by mrr@10: 0.05 (hybrid 0.600, dense 0.550)" in said
    assert "then semsearch calibrate INDEX --hybrid-weight 0.05" in said and "dense wins" not in said


def graded(ndcg: float, mrr: float = 1.0) -> dict[str, float]:
    """A graded passage set's retrieval metrics where every query's first hit is relevant (MRR@10
    saturated at 1) and nDCG@10 still tells the rankings apart."""
    return {
        "mrr@10": mrr,
        "ndcg@10": ndcg,
        "recall@1": 0.1,
        "recall@10": 0.6,
        "success@1": mrr,
        "success@3": 1.0,
        "queries": 43,
    }


def test_cells_that_tie_on_the_metric_are_ranked_by_the_next_and_a_saturated_metric_is_said(capsys):
    cells = [
        Cell("layer 2", Strategy(layers=(2,), pooling="mean"), graded(0.85)),
        Cell("layer 5", Strategy(layers=(5,), pooling="mean"), graded(0.897)),
        Cell("layer 6 (last)", Strategy(pooling="mean"), graded(0.904)),
    ]
    ordered = best_first(cells, "mrr@10")
    assert [c.scores["ndcg@10"] for c in ordered] == [0.904, 0.897, 0.85]
    report_sweep(ordered, "mrr@10", None, None, 15, "passages", "semsearch index C -o INDEX")
    said = capsys.readouterr().out
    assert "mrr@10 is 1.000 in every cell (saturated: it tells no cell from another)" in said
    assert "best by mrr@10, then ndcg@10: layer 6 (last), mean, none: 1.000, ndcg@10 0.904" in said
    # a metric that tells the cells apart ranks alone, and says nothing more
    mean = Strategy(pooling="mean")
    told = [Cell("a", mean, graded(0.8, 0.9)), Cell("b", mean, graded(0.7, 0.95))]
    assert [c.row for c in best_first(told, "mrr@10")] == ["b", "a"]
    report_sweep(best_first(told, "mrr@10"), "mrr@10", None, None, 15, "p", "semsearch index C -o INDEX")
    said = capsys.readouterr().out
    assert "saturated" not in said and "best by mrr@10: b, mean, none: 0.950" in said


def test_where_the_metric_ties_in_every_mode_the_sweep_advises_from_the_next(capsys):
    """MRR@10 1.000 for dense and every weight: the weight that ranks best by nDCG@10 is the advice,
    not dense (hybrid scored 0.93 against dense's 0.897 in the same table)."""
    modes = Modes(
        Cell("last", Strategy(), graded(0.897)),
        graded(0.6),
        {0.05: graded(0.93), 0.15: graded(0.923), 0.5: graded(0.88)},
    )
    assert modes.best_weight("mrr@10") == 0.05 and not modes.dense_wins("mrr@10")
    report_modes(modes, "mrr@10")
    said = capsys.readouterr().out
    assert "dense wins" not in said and "--mode dense" not in said
    assert "mrr@10 is 1.000 for dense and at every keyword weight (saturated: it tells none" in said
    assert "best keyword weight by mrr@10, then ndcg@10: 0.05 (hybrid ndcg@10 0.930, dense 0.897)" in said
    assert "then semsearch calibrate INDEX --hybrid-weight 0.05" in said
    # and where the next metric ties too, dense still wins
    level = Modes(Cell("last", Strategy(), graded(0.9)), graded(0.6), {0.05: graded(0.9), 0.5: graded(0.8)})
    assert level.dense_wins("mrr@10")


def test_the_advice_names_the_index_it_holds_for_and_keyword_alone_winning_is_said(capsys):
    """A weight measured on the best cell holds for an index built as that cell (its options
    named), not for the user's default index; keyword search beating dense and every weight is
    said with how to query so, and no weight is advised."""
    pooler = Cell("layer 6 (last)", Strategy(layers=(-1,), pooling="pooler"), {"mrr@10": 0.6})
    modes = Modes(pooler, {"mrr@10": 0.5}, {0.15: {"mrr@10": 0.65}, 0.5: {"mrr@10": 0.708}})
    report_modes(modes, "mrr@10", "semsearch index faq.csv -o INDEX --text-field text")
    said = capsys.readouterr().out
    assert (
        "store it, for an index built as the best cell: semsearch index faq.csv -o INDEX --text-field text "
        "--layers -1 --pooling pooler, then semsearch calibrate INDEX --hybrid-weight 0.5" in said
    )
    keyword = Modes(pooler, {"mrr@10": 0.755}, {0.15: {"mrr@10": 0.65}, 0.5: {"mrr@10": 0.708}})
    assert keyword.keyword_wins("mrr@10") and not modes.keyword_wins("mrr@10")
    report_modes(keyword, "mrr@10", "semsearch index faq.csv -o INDEX --text-field text")
    said = capsys.readouterr().out
    assert "keyword wins by mrr@10: keyword 0.755 beats dense in every cell (best 0.600)" in said
    assert "query with --mode keyword" in said and "semsearch calibrate INDEX --mode keyword" in said
    assert "--hybrid-weight" not in said and "dense wins" not in said


def test_a_negative_top_is_a_usage_error_before_any_model_loads(no_model_loads, tmp_path):
    # before: `--top -1` printed the table without its last row (a slice from the end), exit 0
    from click.testing import CliRunner

    from search.cli import cli

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("sentence1\tsentence2\tscore\na cat\tone cat\t5\na dog\tone dog\t4\na car\tone bus\t3\n")
    result = CliRunner().invoke(cli, ["sweep", "sts", str(pairs), "--top", "-1"])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--top': -1 is not in the range x>=0" in result.output
