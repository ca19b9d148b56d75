"""A sweep's grid is checked from plain values before any model loads: a typo in a pooling name
costs nothing, not a model load and a pass over the data."""

from __future__ import annotations

import pytest

from indexer.embedding.strategy import SWEPT, Strategy
from indexer.errors import BadInput
from search.evaluate import Pairs
from search.sweep import SweepPlan, plan_sweep, sweep_sts

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
    from search.sweep import Cell, write_csv

    cells = [Cell("layer 1", Strategy(layers=(1,), pooling="mean"), {"mrr@10": 0.5})]
    write_csv(cells, tmp_path / "out" / "sweep.csv")
    assert (tmp_path / "out" / "sweep.csv").read_text().startswith("row,layers")
    (tmp_path / "file").write_text("")
    with pytest.raises(BadInput, match="cannot write"):
        write_csv(cells, tmp_path / "file" / "sweep.csv")
