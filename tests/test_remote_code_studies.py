"""The studies on a model with code of its own: ``sweep``, ``evaluate`` and ``tune`` read it
under ``--trust-remote-code`` as ``index`` does, and refuse it in one line naming the flag
without."""

from __future__ import annotations

import numpy as np
import pytest

from indexer.embedding.strategy import Strategy
from indexer.encoders.factory import encoder_for
from indexer.errors import BadInput
from search.studies.evaluate import Pairs
from search.studies.sweep import sweep_sts
from tests.test_remote_code import TEXTS, TRUSTED, folder, own_cache  # noqa: F401 - fixtures

PAIRS = Pairs(
    [TEXTS[0], TEXTS[1], TEXTS[2], "a lock that broke"],
    ["the river bike station", "the app's map", "questions about billing", TEXTS[1]],
    np.array([4.5, 0.5, 3.0, 4.8]),
)


def test_a_sweep_reads_it_under_the_flag_and_refuses_it_without(folder):  # noqa: F811
    with pytest.raises(BadInput, match="--trust-remote-code"):
        sweep_sts(PAIRS, Strategy(model=folder))
    cells = sweep_sts(PAIRS, Strategy(model=folder), options=TRUSTED)
    assert {c.strategy.layers for c in cells} >= {(0,), (1,), (2,)}  # every hidden state of its own code
    own = next(c for c in cells if c.strategy.layers == (2,) and c.strategy.pooling == "mean")
    encoder = encoder_for(Strategy(model=folder, backend="torch"), TRUSTED)
    first = encoder.embed(PAIRS.first, role="query")
    second = encoder.embed(PAIRS.second, role="query")
    from scipy.stats import spearmanr

    expected = 100 * spearmanr((first * second).sum(1), PAIRS.gold)[0]
    assert own.scores["spearman"] == pytest.approx(expected, abs=1e-6)


def test_tune_trains_it_under_the_flag_and_its_tuned_folder_asks_for_it_again(folder, tmp_path):  # noqa: F811
    from search.studies.tuning import tune
    from tests.test_tuning import labels_of

    labels = labels_of("scored pairs", tmp_path)
    with pytest.raises(BadInput, match="--trust-remote-code"):
        tune(labels, tmp_path / "refused", Strategy(model=folder), epochs=1)
    tuned_dir = tmp_path / "tuned"
    done = tune(labels, tuned_dir, Strategy(model=folder), epochs=1, learning_rate=0.1, options=TRUSTED)
    assert done.steps > 0 and done.options.endswith("--trust-remote-code")
    with pytest.raises(BadInput, match="--trust-remote-code"):
        encoder_for(Strategy(model=str(tmp_path / "tuned")))
    tuned = encoder_for(Strategy(model=str(tmp_path / "tuned")), TRUSTED)
    assert tuned.strategy.remote_code
    before = encoder_for(Strategy(model=folder), TRUSTED).embed(TEXTS, role="query")
    assert np.abs(tuned.embed(TEXTS, role="query") - before).max() > 1e-3  # its own weights, trained


@pytest.mark.slow
def test_the_study_commands_take_the_flag(folder, tmp_path):  # noqa: F811
    import csv

    from tests.helpers import run

    pairs = tmp_path / "pairs.csv"
    with pairs.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["sentence1", "sentence2", "score"])
        writer.writerows(zip(PAIRS.first, PAIRS.second, PAIRS.gold, strict=True))
    refused = run("sweep", "sts", pairs, "--model", folder)
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.returncode != 0 and len(lines) == 1 and "--trust-remote-code" in lines[0], refused.stderr
    swept = run("sweep", "sts", pairs, "--model", folder, "--trust-remote-code")
    assert swept.returncode == 0, swept.stderr
    assert "--trust-remote-code" in swept.stdout  # the index options that reproduce the best cell
    scored = run("evaluate", "sts", pairs, "--model", folder, "--trust-remote-code", "--json")
    assert scored.returncode == 0 and '"spearman"' in scored.stdout, scored.stderr
