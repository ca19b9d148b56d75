"""``semsearch tune``: each label kind trains, the held-back share never reaches training, the
strategy the index uses is the one trained through, and the output is a model directory every
path loads (index, query, evaluate, the ONNX export, sentence-transformers)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from indexer.embedding.fields import FieldScoring
from indexer.embedding.head import Head, NetworkOutput, pad_batch
from indexer.embedding.strategy import Strategy
from indexer.errors import BadInput
from search.studies.tuning import hold_back, read_labels, training_examples, tune
from tests.helpers import DATA, assert_clean_failure, positive_pairs, run, sentence, torch_reference


def scored_pairs(directory: Path, count: int = 40) -> Path:
    path = directory / "scored.tsv"
    lines = ["sentence1\tsentence2\tscore"] + [
        f"{sentence(i)}\t{sentence(i, 1 + i % 2)}\t{i % 6}" for i in range(count)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def retrieval_files(directory: Path, entries: int = 12, per_entry: int = 3) -> dict[str, Path]:
    """A corpus of ``entries`` (text, answer), ``per_entry`` queries each, and their qrels."""
    corpus, queries, qrels = directory / "corpus.jsonl", directory / "queries.jsonl", directory / "qrels.tsv"
    corpus.write_text(
        "".join(
            json.dumps({"id": f"e{i}", "text": sentence(i), "answer": sentence(i, 3) + " answer"}) + "\n"
            for i in range(entries)
        )
    )
    asked = [(f"q{i}_{j}", i, sentence(i, j + 1) + " ?") for i in range(entries) for j in range(per_entry)]
    queries.write_text("".join(json.dumps({"id": q, "text": text}) + "\n" for q, _, text in asked))
    qrels.write_text("query_id\tdoc_id\trelevance\n" + "".join(f"{q}\te{i}\t1\n" for q, i, _ in asked))
    return {"corpus": corpus, "queries": queries, "qrels": qrels}


def labels_of(kind: str, directory: Path):
    if kind == "scored pairs":
        return read_labels(pairs=scored_pairs(directory))
    if kind == "positive pairs":
        return read_labels(pairs=positive_pairs(directory))
    files = retrieval_files(directory)
    if kind == "retrieval":
        return read_labels(queries=files["queries"], qrels=files["qrels"], corpus=files["corpus"])
    return read_labels(corpus=files["corpus"], also=FieldScoring(("answer",)))


KINDS = ("scored pairs", "positive pairs", "retrieval", "faq")


@pytest.mark.parametrize("kind", KINDS)
def test_each_label_kind_trains_and_lowers_the_loss(kind, tiny_model, tmp_path):
    from indexer.encoders.training import Budget, fine_tune, trainable

    labels = labels_of(kind, tmp_path)
    held = hold_back(labels, 0.2, seed=0)
    encoder = trainable(Strategy(model=tiny_model))
    examples = training_examples(labels, held, encoder.embed)
    assert len(examples) == int((~held).sum()) > 0
    assert (examples.scores is not None) == (kind == "scored pairs")
    assert (examples.negatives is not None) == (kind == "retrieval")
    budget = Budget(epochs=6, batch_size=8, learning_rate=1e-3, evaluations=1, patience=100)
    outcome = fine_tune(encoder, examples, lambda embed: 0.0, budget)
    assert len(outcome.losses) == 6 and outcome.steps >= 6
    assert outcome.losses[-1] < outcome.losses[0]


@pytest.mark.parametrize("kind", ("positive pairs", "retrieval"))
def test_the_held_back_share_never_reaches_training(kind, tiny_model, tmp_path, monkeypatch):
    from indexer.encoders import training

    seen: set[str] = set()
    forward = training._vectors

    def recording(encoder, texts, role="query"):
        seen.update(texts)
        return forward(encoder, texts, role)

    monkeypatch.setattr(training, "_vectors", recording)
    labels = labels_of(kind, tmp_path)
    done = tune(
        labels, tmp_path / "out", Strategy(model=tiny_model, backend="torch"), held_back=0.25, epochs=2
    )
    held = hold_back(labels, 0.25, seed=0)
    held_texts = {labels.first[i] for i in np.flatnonzero(held)} | {
        labels.second[i] for i in np.flatnonzero(held)
    }
    assert done.held_back_pairs == held.sum() > 0 and done.trained_pairs == (~held).sum()
    assert seen and held_texts and not seen & held_texts
    # whole groups are held back: no group is on both sides
    assert not set(labels.groups[held].tolist()) & set(labels.groups[~held].tolist())


@pytest.mark.parametrize("kind", ("scored pairs", "positive pairs"))
def test_training_reads_each_side_with_the_strategy_prefix(kind, tiny_model, tmp_path, monkeypatch):
    """Queries and first sentences get the query prefix, passages the passage prefix; scored
    pairs are symmetric (both sides queries). The tuned model's strategy keeps the prefixes."""
    from indexer.encoders import training

    roles: dict[str, set[str]] = {"query": set(), "passage": set()}
    forward = training._vectors

    def recording(encoder, texts, role="query"):
        roles[role].update(texts)
        return forward(encoder, texts, role)

    monkeypatch.setattr(training, "_vectors", recording)
    labels = labels_of(kind, tmp_path)
    prefixes = {"query_prefix": "query: ", "passage_prefix": "passage: "}
    done = tune(labels, tmp_path / "out", Strategy(model=tiny_model, backend="torch", **prefixes), epochs=1)
    if kind == "scored pairs":
        assert not roles["passage"] and set(labels.second) & roles["query"]
    else:
        assert roles["query"] <= set(labels.first) and roles["passage"] <= set(labels.second)
        assert roles["query"] and roles["passage"]
    saved = json.loads((tmp_path / "out" / "semsearch.json").read_text(encoding="utf-8"))["strategy"]
    assert (saved["query_prefix"], saved["passage_prefix"]) == ("query: ", "passage: ")
    assert "--query-prefix 'query: ' --passage-prefix 'passage: '" in done.options


def test_groups_are_the_pieces_the_labels_link(tmp_path):
    files = retrieval_files(tmp_path, entries=12, per_entry=3)
    labels = read_labels(queries=files["queries"], qrels=files["qrels"], corpus=files["corpus"])
    assert len(set(labels.groups.tolist())) == 12  # one thread per entry and its 3 questions
    shared = tmp_path / "shared.tsv"  # a sentence in two pairs ties them into one group
    rows = [f"{sentence(i)}\t{sentence(i, 1)}\t1" for i in range(12)] + [f"{sentence(0)}\tanother one\t2"]
    shared.write_text("sentence1\tsentence2\tscore\n" + "\n".join(rows) + "\n")
    labels = read_labels(pairs=shared)
    assert labels.groups[0] == labels.groups[-1] and len(set(labels.groups.tolist())) == 12


@pytest.mark.parametrize(
    "strategy",
    [
        Strategy(layers=(2,), pooling="mean"),
        Strategy(layers=(1,), pooling="max", skip_special=True),
        Strategy(layers=(1, 3), combine="concat", pooling="mean-max"),
        Strategy(layers=(0, 2), combine="sum", pooling="cls"),
    ],
    ids=lambda s: s.describe(),
)
def test_the_head_on_torch_tensors_is_the_head_on_numpy(strategy, tiny_model):
    """Training runs the index's own head on tensors: same vectors, and a gradient."""
    import torch


    encoder = torch_reference(replace(strategy, model=tiny_model, backend="torch"), all_layers=True)
    texts = [sentence(i) for i in range(5)]
    input_ids, attention = pad_batch(encoder.tokens.ids(texts), encoder.tokens.pad)
    head = Head(encoder.strategy, encoder.num_layers, encoder.tokens.special_ids)
    out = encoder.model(
        input_ids=torch.from_numpy(input_ids),
        attention_mask=torch.from_numpy(attention),
        output_hidden_states=True,
    )
    on_torch = head(
        NetworkOutput(out.hidden_states), torch.from_numpy(input_ids), torch.from_numpy(attention)
    )
    on_numpy = head(NetworkOutput([h.detach().numpy() for h in out.hidden_states]), input_ids, attention)
    assert on_torch.requires_grad
    np.testing.assert_allclose(on_torch.detach().numpy(), on_numpy, atol=1e-5)
    np.testing.assert_allclose(on_numpy, encoder.embed(texts), atol=1e-5)


def scripted_metric(monkeypatch, values: list[float]) -> None:
    """The held-back metric replaced by ``values``, one per evaluation (then the last again)."""
    import search.studies.tuning

    calls = iter(values)
    monkeypatch.setattr(
        search.studies.tuning, "measure_for", lambda labels, held: lambda embed: next(calls, values[-1])
    )


def test_a_strategy_other_than_last_layer_mean_is_trained_through_and_stored(
    tiny_model, tmp_path, monkeypatch
):
    from indexer.embedding.models import resolve_strategy

    asked = Strategy(model=tiny_model, layers=(1,), pooling="max", backend="torch")
    texts = [sentence(i) for i in range(6)]
    before = torch_reference(asked).embed(texts)
    scripted_metric(monkeypatch, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0])  # every evaluation better: the last is kept
    done = tune(
        read_labels(pairs=scored_pairs(tmp_path)), tmp_path / "out", asked, epochs=2, learning_rate=1e-3
    )
    assert done.best_step == done.steps and done.losses[-1] < done.losses[0]
    assert done.options == ""  # the directory states it all: cut after layer 1, max pooling
    assert json.loads((tmp_path / "out" / "config.json").read_text())["num_hidden_layers"] == 1
    stored = resolve_strategy(Strategy(model=str(tmp_path / "out")))
    assert (stored.layers, stored.pooling, stored.max_length) == ((-1,), "max", 128)
    after = torch_reference(Strategy(model=str(tmp_path / "out"), backend="torch")).embed(texts)
    assert after.shape == before.shape and not np.allclose(after, before, atol=1e-4)

    several = Strategy(model=tiny_model, layers=(1, 2), combine="concat", skip_special=True, backend="torch")
    done = tune(read_labels(pairs=scored_pairs(tmp_path)), tmp_path / "several", several, epochs=1)
    assert "--layers 1,-1 --combine concat" in done.options and "--skip-special" in done.options
    kept = json.loads((tmp_path / "several" / "semsearch.json").read_text())
    assert kept["strategy"]["layers"] == [1, -1] and kept["strategy"]["skip_special"]
    again = Strategy(model=str(tmp_path / "several"), layers=(1, -1), combine="concat", skip_special=True)
    assert torch_reference(replace(again, backend="torch")).embed(texts).shape == (6, 64)


def test_training_stops_when_the_held_back_metric_stops_improving_and_keeps_the_best(
    tiny_model, tmp_path, monkeypatch
):

    asked = Strategy(model=tiny_model, backend="torch")
    texts = [sentence(i) for i in range(6)]
    scripted_metric(monkeypatch, [1.0, 1.0, 1.0, 1.0])  # never better than before training
    done = tune(
        read_labels(pairs=scored_pairs(tmp_path)), tmp_path / "out", asked, epochs=8, learning_rate=1e-3
    )
    assert done.stopped == "held-back metric stopped improving" and done.best_step == 0
    assert done.steps < 8 * 3 and done.before == done.after == 1.0  # 36 pairs: 3 batches an epoch
    untouched = torch_reference(
        Strategy(model=str(tmp_path / "out"), layers=(-1,), pooling="mean", backend="torch")
    )
    np.testing.assert_allclose(untouched.embed(texts), torch_reference(asked).embed(texts), atol=1e-5)


def test_bad_labels_and_untrainable_models_are_one_clear_error(tiny_model, tmp_path):
    from indexer.encoders.training import trainable

    with pytest.raises(BadInput, match="too few labels"):
        read_labels(pairs=scored_pairs(tmp_path, count=6))
    files = retrieval_files(tmp_path)
    with files["qrels"].open("a") as f:
        f.write("q0_0\tnowhere\t1\n")
    with pytest.raises(BadInput, match="1 entry id.* not in .*nowhere"):
        read_labels(queries=files["queries"], qrels=files["qrels"], corpus=files["corpus"])
    with pytest.raises(BadInput, match="need --queries, --qrels and --corpus"):
        read_labels(queries=files["queries"], qrels=files["qrels"])
    with pytest.raises(BadInput, match="pooler"):
        trainable(Strategy(model=tiny_model, pooling="pooler"))
    with pytest.raises(BadInput, match="layer 0"):
        trainable(Strategy(model=tiny_model, layers=(0,)))
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("mine")
    with pytest.raises(BadInput, match="not an empty directory"):
        tune(read_labels(pairs=scored_pairs(tmp_path)), tmp_path / "taken", Strategy(model=tiny_model))
    assert (tmp_path / "taken" / "file").read_text() == "mine"


@pytest.mark.slow
def test_the_output_loads_in_index_query_evaluate_onnx_and_sentence_transformers(
    tiny_model, tmp_path, monkeypatch
):
    from sentence_transformers import SentenceTransformer

    from indexer.embedding.models import identified
    from indexer.encoders.factory import encoder_for
    from indexer.writing.build import build_index
    from search.read.engine import SearchEngine
    from search.studies.evaluate import evaluate_sts, read_pairs

    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path / "cache"))
    files = retrieval_files(tmp_path)
    out = tmp_path / "tuned"
    tune(
        read_labels(queries=files["queries"], qrels=files["qrels"], corpus=files["corpus"]),
        out,
        Strategy(model=tiny_model),
        epochs=1,
    )
    assert {"config.json", "model.safetensors", "tokenizer.json", "modules.json"} <= {
        p.name for p in out.iterdir()
    }
    assert identified(Strategy(model=str(out))).model_fingerprint.startswith("sha256:")
    onnx = encoder_for(Strategy(model=str(out)))
    assert onnx.decision.runtime == "onnx"  # exported by the existing path: queries stay torch-free
    texts = [sentence(i) for i in range(8)]
    reference = encoder_for(Strategy(model=str(out), backend="torch")).embed(texts)
    np.testing.assert_allclose(onnx.embed(texts), reference, atol=1e-5)
    peer = SentenceTransformer(str(out), device="cpu").encode(texts, normalize_embeddings=True)
    np.testing.assert_allclose(peer, reference, atol=1e-5)

    build_index(files["corpus"], tmp_path / "idx", Strategy(model=str(out)))
    hits = SearchEngine(tmp_path / "idx").search(sentence(3, 1) + " ?", k=3)
    assert len(hits) == 3
    assert evaluate_sts(read_pairs(scored_pairs(tmp_path)), Strategy(model=str(out)))["pairs"] == 40
    result = run("query", tmp_path / "idx", sentence(3, 1), "-k", "2", "--json")
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_the_read_path_and_a_plain_index_never_import_the_tuning_code(tiny_model, tmp_path):
    files = retrieval_files(tmp_path)
    code = (
        "import sys\n"
        "import search.cli, search.server, search.read.engine, search.studies.evaluate\n"
        "from indexer.writing.build import build_index\n"
        "from indexer.embedding.strategy import Strategy\n"
        "from search.read.engine import SearchEngine\n"
        f"build_index({str(files['corpus'])!r}, {str(tmp_path / 'idx')!r}, Strategy(model={tiny_model!r}))\n"
        f"SearchEngine({str(tmp_path / 'idx')!r}).search('a bike', k=2)\n"
        "print(sorted(m for m in sys.modules if m in ('search.studies.tuning',"
        " 'indexer.encoders.training')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.slow
def test_tune_on_the_bundled_model_with_a_short_budget(tmp_path):
    out = tmp_path / "tuned"
    result = run(
        "tune",
        "-o",
        out,
        "--corpus",
        DATA / "demo_faq.csv",
        "--text-field",
        "question",
        "--also",
        "answer",
        "--max-length",
        "64",
        "--max-minutes",
        "1",
        "--epochs",
        "1",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    done = json.loads(result.stdout)
    assert done["kind"] == "question-answer pairs" and done["held_back_pairs"] > 0
    assert done["steps"] > 0 and "held-back metric before tuning" in result.stderr
    assert done["minutes"] <= 1  # the budget holds, its measurements included
    scored = run("evaluate", "sts", scored_pairs(tmp_path), "--model", out, "--json")
    assert scored.returncode == 0 and json.loads(scored.stdout)["pairs"] == 40
    built = run(
        "index", DATA / "demo_faq.csv", "-o", tmp_path / "idx", "--text-field", "question", "--model", out
    )
    assert built.returncode == 0, built.stderr
    answered = run("query", tmp_path / "idx", "how do i register", "-k", "1", "--json")
    assert answered.returncode == 0 and "faq" in answered.stdout


@pytest.mark.slow
def test_bad_input_on_the_command_line_is_one_line(tmp_path):
    result = run("tune", "-o", tmp_path / "out", "--pairs", scored_pairs(tmp_path, count=5))
    assert_clean_failure(result, "too few labels")
    assert not (tmp_path / "out").exists()


def test_tune_trains_through_an_index_strategy(tiny_model, tmp_path):
    from indexer.embedding.models import resolve_strategy
    from indexer.writing.build import build_index
    from search.studies.tuning import index_strategy

    files = retrieval_files(tmp_path)
    asked = Strategy(model=tiny_model, layers=(1,), pooling="cls", backend="torch")
    build_index(files["corpus"], tmp_path / "idx", asked)
    labels = read_labels(queries=files["queries"], qrels=files["qrels"], corpus=files["corpus"])
    done = tune(labels, tmp_path / "out", index_strategy(tmp_path / "idx"), epochs=1)
    stored = resolve_strategy(Strategy(model=done.output))
    assert (stored.layers, stored.pooling) == ((-1,), "cls") and done.options == ""
    assert json.loads((tmp_path / "out" / "semsearch.json").read_text())["strategy"]["backend"] == "torch"


def test_a_time_budget_lays_the_learning_rate_decay_out_over_the_steps_it_leaves():
    from indexer.encoders.training import Schedule

    plan = Schedule(1000)
    assert plan.rate(0) == 0 and plan.rate(100) == 1 and plan.rate(1000) == 0
    plan.fit(done=50, seconds_per_step=2.0, seconds_left=100.0)  # 50 more steps fit the budget
    assert plan.planned == 100 and plan.rate(100) == 0 and 0 < plan.rate(60) < 1
    plan.fit(done=60, seconds_per_step=0.1, seconds_left=1000.0)  # faster now: never past the epochs
    assert plan.planned == 1000 and plan.rate(100) == 1


@pytest.mark.parametrize(("minutes", "after", "steps"), [(0.5, 0.0, 2), (0.25, 0.0, 0), (0.5, 15.0, 0)])
def test_a_time_budget_is_kept_with_the_last_evaluation_in_it(
    minutes, after, steps, tiny_model, tmp_path, monkeypatch
):
    """A busy machine: measuring the held-back share takes 10 s, a step 5 s. A step starts only
    when it and the evaluation after it fit in what is left, so the run ends within its budget;
    a budget that the first measurement leaves no room in trains nothing, and so does one whose
    room is kept for the command's work after the loop (``after`` seconds)."""
    from types import SimpleNamespace

    import indexer.encoders.training as training

    clock = [0.0]
    monkeypatch.setattr(training, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(training, "MARGIN", 1.0)  # these costs never vary: no margin needed
    step = training._batch_loss

    def slow_step(*args):
        clock[0] += 5
        return step(*args)

    def slow_measure(embed) -> float:
        clock[0] += 10
        return clock[0]  # always better: only the budget stops it

    monkeypatch.setattr(training, "_batch_loss", slow_step)
    labels = labels_of("scored pairs", tmp_path)
    held = hold_back(labels, 0.2, seed=0)
    encoder = training.trainable(Strategy(model=tiny_model))
    examples = training_examples(labels, held, encoder.embed)
    budget = training.Budget(epochs=20, batch_size=8, max_minutes=minutes, after=after)
    outcome = training.fine_tune(encoder, examples, slow_measure, budget)
    assert outcome.minutes <= minutes - after / 60 and outcome.stopped == "time budget spent"
    assert outcome.steps == steps and outcome.best_step == steps  # the last steps were measured too


def test_a_time_budget_holds_when_a_later_measurement_takes_longer(tiny_model, tmp_path, monkeypatch):
    """A machine that gets busier: the first measurement takes 10 s, the next 14 s, a step 5 s,
    one measurement an epoch (longer than the budget). The last measurement is the first slow
    one, and the budget still holds: a step and its measurement are reckoned with a margin over
    the longest yet."""
    from types import SimpleNamespace

    import indexer.encoders.training as training

    clock = [0.0]
    monkeypatch.setattr(training, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    step = training._batch_loss
    measured = []

    def slow_step(*args):
        clock[0] += 5
        return step(*args)

    def slower_measure(embed) -> float:
        clock[0] += 14 if measured else 10
        measured.append(clock[0])
        return clock[0]

    monkeypatch.setattr(training, "_batch_loss", slow_step)
    labels = labels_of("scored pairs", tmp_path)
    held = hold_back(labels, 0.2, seed=0)
    encoder = training.trainable(Strategy(model=tiny_model))
    examples = training_examples(labels, held, encoder.embed)
    budget = training.Budget(epochs=20, batch_size=2, max_minutes=1.0, evaluations=1)
    outcome = training.fine_tune(encoder, examples, slower_measure, budget)
    assert outcome.steps > 0 and outcome.stopped == "time budget spent" and len(measured) == 2
    assert outcome.minutes <= 1.0


def test_a_tuned_model_directory_gives_its_strategy_as_the_default(tiny_model, tmp_path):
    from indexer.embedding.models import strategy_request
    from indexer.errors import StrategyConflict

    several = Strategy(model=tiny_model, layers=(1, 2), combine="concat", skip_special=True, backend="torch")
    tune(read_labels(pairs=scored_pairs(tmp_path)), tmp_path / "tuned", several, epochs=1)
    model = str(tmp_path / "tuned")
    strategy, said = strategy_request({"model": model})
    assert (strategy.layers, strategy.combine, strategy.skip_special) == ((1, -1), "concat", True)
    assert said == "using the strategy saved with the model: layers -2,-1, concat, mean pooling, skip-special"
    same, _ = strategy_request({"model": model, "layers": (-2, -1), "max_length": 64, "backend": "onnx"})
    assert (same.layers, same.max_length, same.backend) == ((1, -1), 64, "onnx")  # options it leaves open
    with pytest.raises(StrategyConflict, match=r"--layers -1 .* tuned with layers -2,-1"):
        strategy_request({"model": model, "layers": (-1,)})
    with pytest.raises(StrategyConflict, match="--keep-special .* tuned with skip-special"):
        strategy_request({"model": model, "skip_special": False})
    plain, said = strategy_request({"model": tiny_model, "layers": (-1,)})  # not tuned here: as asked
    assert plain == Strategy(model=tiny_model, layers=(-1,)) and said is None


@pytest.mark.slow
def test_index_and_evaluate_with_a_tuned_model_read_it_as_it_was_tuned(tiny_model, tmp_path, monkeypatch):
    from indexer.store import open_index

    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path / "cache"))
    several = Strategy(model=tiny_model, layers=(1, 2), combine="concat", skip_special=True)
    tune(read_labels(pairs=scored_pairs(tmp_path)), tmp_path / "tuned", several, epochs=1)
    corpus = retrieval_files(tmp_path)["corpus"]
    built = run("index", corpus, "-o", tmp_path / "idx", "--model", tmp_path / "tuned", "-q")
    assert built.returncode == 0, built.stderr
    assert "using the strategy saved with the model: layers -2,-1, concat" in built.stderr
    stored = open_index(tmp_path / "idx", vectors=False).strategy
    assert (stored.layers, stored.combine, stored.skip_special) == ((1, -1), "concat", True)
    contradicted = run(
        "evaluate", "sts", scored_pairs(tmp_path), "--model", tmp_path / "tuned", "--combine", "mean"
    )
    assert_clean_failure(contradicted, "--combine mean contradicts")


def test_labels_that_cannot_teach_are_refused_before_training(tmp_path):
    repeated = tmp_path / "repeated.tsv"
    rows = [f"{sentence(0)}\t{sentence(0, 1)}\t1", f"{sentence(1)}\t{sentence(1, 1)}\t4"] * 50
    repeated.write_text("sentence1\tsentence2\tscore\n" + "\n".join(rows) + "\n", encoding="utf-8")
    with pytest.raises(BadInput, match="100 scored pairs but 2 distinct"):
        read_labels(pairs=repeated)
    junk = tmp_path / "junk.tsv"
    junk.write_text(scored_pairs(tmp_path).read_text() + f"{sentence(50)}\t{sentence(51)}\tnan\n")
    assert [r.reason for r in read_labels(pairs=junk).rejected] == ["score is not a finite number: 'nan'"]


@pytest.mark.slow
def test_junk_scores_on_the_command_line_are_counted_or_refused(tmp_path):
    junk = tmp_path / "junk.tsv"
    junk.write_text(scored_pairs(tmp_path).read_text().replace("\t3\n", "\tnan\n"))
    rejected = run("evaluate", "sts", junk, "--json")
    assert rejected.returncode == 0, rejected.stderr
    assert "rejected 7 rows: 7 score is not a finite number" in rejected.stderr
    assert "row 4: score is not a finite number: 'nan'" in rejected.stderr
    constant = tmp_path / "constant.tsv"
    constant.write_text(
        "sentence1\tsentence2\tscore\n" + "".join(f"{sentence(i)}\t{sentence(i, 1)}\t2\n" for i in range(40))
    )
    assert_clean_failure(run("evaluate", "sts", constant), "a correlation needs two different scores")
    assert_clean_failure(run("tune", "-o", tmp_path / "out", "--pairs", constant), "all 40 pairs score 2")
    assert not (tmp_path / "out").exists()


def test_pairs_per_step_has_its_own_name_and_the_old_one_still_works_with_a_note(tmp_path, monkeypatch):
    """``--batch-size`` counts texts in every other command; tune's pairs per step is
    ``--pairs-per-step``, and the old spelling still reaches training, with a note."""
    from click.testing import CliRunner

    import search.studies.tuning
    from search.cli import cli

    asked: list[int] = []

    def fake_tune(labels, output, strategy, *, batch_size, **rest):  # noqa: ANN001, ANN003
        asked.append(batch_size)
        raise BadInput("stopped before training")

    monkeypatch.setattr(search.studies.tuning, "tune", fake_tune)
    pairs = scored_pairs(tmp_path)
    for flag in ("--pairs-per-step", "--batch-size"):
        command = ["tune", "-o", str(tmp_path / "out"), "--pairs", str(pairs), flag, "5"]
        result = CliRunner().invoke(cli, command)
        assert "stopped before training" in result.output, result.output
        assert ("now --pairs-per-step" in result.output) == (flag == "--batch-size"), result.output
    assert asked == [5, 5]


def test_a_tuned_folder_of_any_pooling_is_written_as_sentence_transformers_reads_it(tiny_model, tmp_path):
    """The tuned folder's modules are saved by each module kind's own ``save``: a pooling mode
    beyond cls, mean and max is written too, and read by sentence-transformers as semsearch reads it."""
    from sentence_transformers import SentenceTransformer

    from indexer.encoders.training import save_model, trainable

    encoder = trainable(Strategy(model=tiny_model, pooling="weighted-mean"))
    texts = [sentence(i) for i in range(4)]
    expected = encoder.embed(texts)
    out = tmp_path / "tuned"
    out.mkdir()
    save_model(encoder, out, out, {}, "torch")
    peer = SentenceTransformer(str(out), device="cpu").encode(texts, normalize_embeddings=True)
    np.testing.assert_allclose(peer, expected, atol=1e-5)


@pytest.mark.parametrize("minutes", [float("nan"), float("inf")])
def test_a_time_budget_that_is_no_number_of_minutes_is_refused_before_anything(minutes, tiny_model, tmp_path):
    labels = read_labels(pairs=positive_pairs(tmp_path))
    with pytest.raises(BadInput, match=f"max minutes must be a positive number, not {minutes}"):
        tune(labels, tmp_path / "out", Strategy(model=tiny_model), max_minutes=minutes)
    assert not (tmp_path / "out").exists()
