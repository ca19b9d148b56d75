"""``semsearch tune --cross-encoder``: a reranker trains on scored pairs and on questions with
mined hard negatives, its held-back metric moves, the held-back share never reaches training,
the saved folder is the CrossEncoder folder sentence-transformers writes (and reads with equal
scores), an existing cross-encoder trains on from where it stopped, and what makes no sense is
refused in one line."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from indexer.embedding.strategy import Strategy
from indexer.errors import BadInput
from search.studies.cross_held import Mined, held_back_set
from search.studies.cross_tuning import DEPTH, cross_tune, grouped, training_rows
from search.studies.tuning import hold_back, read_labels
from tests.helpers import DATA, learnable_pairs, run, unit_vectors, wikiqa_like


def tiny_stage(tiny_model: str) -> Strategy:
    """The tiny BERT as the first stage a reranker is measured against."""
    return Strategy(model=tiny_model, backend="torch")


def demo_labels():
    return read_labels(
        queries=DATA / "demo_questions.jsonl",
        qrels=DATA / "demo_qrels.tsv",
        corpus=DATA / "demo_faq.csv",
        text_fields=["question"],
    )


def test_a_tiny_cross_encoder_learns_scored_pairs_and_its_held_back_spearman_rises(tiny_model, tmp_path):
    labels = read_labels(pairs=learnable_pairs(tmp_path))
    done = cross_tune(
        labels,
        tmp_path / "out",
        tiny_model,
        tiny_stage(tiny_model),
        held_back=0.3,
        epochs=8,
        batch_size=8,
        learning_rate=1e-3,
    )
    assert done.reranker and done.metric == "spearman" and done.first_stage is not None
    assert done.held_back_pairs == 18 and done.trained_pairs == 42
    assert done.after > done.before + 20, done  # the untouched head ranks at random
    assert done.losses[-1] < done.losses[0]
    facts = json.loads((tmp_path / "out" / "semsearch.json").read_text(encoding="utf-8"))
    assert facts["held_back"]["after"] == done.after and facts["tuned_from"] == tiny_model


def test_scored_pairs_are_scaled_to_targets_between_0_and_1(tmp_path):
    labels = read_labels(pairs=learnable_pairs(tmp_path))
    held = held_back_set(labels, hold_back(labels, 0.3, seed=0), None, unit_vectors, DEPTH, 0)
    rows = training_rows(labels, held, None, 0)
    assert len(rows) == int((~held.mask).sum()) and set(rows.targets) == {0.0, 1.0}


def test_questions_train_with_mined_hard_negatives_and_never_see_the_held_back_share(tiny_model, tmp_path):
    from indexer.encoders.factory import torch_encoder

    labels = demo_labels()
    embed = torch_encoder(Strategy(model=tiny_model, backend="torch")).embed
    mined = Mined.of(labels, embed)
    held = held_back_set(labels, hold_back(labels, 0.3, seed=0), mined, embed, DEPTH, 0)
    rows = training_rows(labels, held, mined, 0)
    assert len(rows) == int((~held.mask).sum()) and all(rows.answered)  # one list per right entry
    assert all(len(texts) > 1 for texts in rows.texts)  # each right entry ranked against negatives
    trained = set(rows.questions) | {t for texts in rows.texts for t in texts}
    assert not trained & held.texts
    assert labels.candidates is not None and labels.relevant is not None
    for question, texts in zip(rows.questions, rows.texts, strict=True):
        relevant = {labels.candidates[c] for c in labels.relevant[question]}
        assert texts[0] in relevant and not set(texts[1:]) & relevant  # a negative is never right
    # each list carries the first stage's cosine of its question and every text, in order, each
    # question embedded once for mining and the cosines together
    asked: list[str] = []

    def counting(texts, role="query", **how):
        asked.extend(texts if role == "query" else [])
        return embed(texts, role=role, **how)

    counted = training_rows(labels, held, replace(mined, embed=counting), 0)
    assert counted.teacher == rows.teacher and len(asked) == len(set(asked)) == len(set(rows.questions))
    assert rows.teacher is not None and list(map(len, rows.teacher)) == list(map(len, rows.texts))
    for question, texts, cosines in zip(rows.questions, rows.texts, rows.teacher, strict=True):
        expected = embed(texts, role="passage") @ embed([question])[0]
        assert np.allclose(cosines, expected, atol=1e-5)
    # the held-back measure reorders the first stage's best candidates, no others: a scorer that
    # knows the answers reaches MRR 100 over the whole corpus, and changes nothing over one

    def oracle(pairs):
        return np.array([float(t in {labels.candidates[c] for c in labels.relevant[q]}) for q, t in pairs])

    mask = hold_back(labels, 0.3, seed=0)
    everything = held_back_set(labels, mask, mined, embed, len(mined.texts), 0)
    first = everything.first_stage()
    judged = everything.measure(oracle)
    assert judged.reranked.headline == pytest.approx(100.0) and 0 < first.headline < 100
    assert judged.helps(first) and judged.weight > 0
    one = held_back_set(labels, mask, mined, embed, 1, 0)
    assert one.measure(oracle).reranked.headline == pytest.approx(one.first_stage().headline)


def test_a_reranker_that_does_not_help_gets_weight_0_and_the_first_stages_order(tiny_model, tmp_path):
    """A scorer that puts every wrong entry above the right one: alone it ranks below the first
    stage; fused, its fitted weight is 0, which is the first stage's order, and the verdict says so."""
    from indexer.encoders.factory import torch_encoder

    labels = demo_labels()
    embed = torch_encoder(Strategy(model=tiny_model, backend="torch")).embed
    mined = Mined.of(labels, embed)
    held = held_back_set(labels, hold_back(labels, 0.3, seed=0), mined, embed, DEPTH, 0)
    assert labels.candidates is not None and labels.relevant is not None

    def adversary(pairs):
        right = {q: {labels.candidates[c] for c in labels.relevant[q]} for q in labels.relevant}
        return np.array([float(t not in right[q]) for q, t in pairs])

    first = held.first_stage()
    judged = held.measure(adversary)
    assert judged.reranked.headline < first.headline
    assert judged.weight == 0.0 and not judged.helps(first)
    assert judged.fused == first
    said = "\n".join(judged.lines(first))
    assert "does not surely beat the first stage" in said and judged.stored(first)["weight"] == 0.0
    noise = np.random.default_rng(0)
    guessed = held.measure(lambda pairs: noise.random(len(pairs)))  # a weight fitted to noise...
    assert not guessed.helps(first) and guessed.stored(first)["weight"] == 0.0  # ...is no gain


def test_0_1_pairs_grouped_by_question_are_ranking_labels_with_given_negatives(tmp_path):
    labels = grouped(read_labels(pairs=wikiqa_like(tmp_path)))
    assert labels.kind == "questions with 0/1 answers" and labels.scores is None
    assert labels.candidates is not None and labels.relevant is not None and labels.negatives is not None
    assert len(labels.first) == 16 and len(labels.unanswered or {}) == 8  # every third has no answer
    assert len(labels.candidates) == 96 and all(len(n) in (3, 4) for n in labels.negatives.values())
    mined = Mined.of(labels, unit_vectors)
    held = held_back_set(labels, hold_back(labels, 0.25, seed=0), mined, unit_vectors, DEPTH, 0)
    assert held.size > held.answered > 0  # unanswered questions are held back beside the answered
    rows = training_rows(labels, held, mined, 0)
    trained = set(rows.questions)
    texts = {t for listed in rows.texts for t in listed}
    assert not trained & held.questions and not texts & held.texts
    given = {(a, t) for a, listed in labels.negatives.items() for t in listed}
    pairs = {(q, t) for q, listed in zip(rows.questions, rows.texts, strict=True) for t in listed}
    assert pairs & given and pairs - given - set(zip(labels.first, labels.second, strict=True))  # both kinds
    quiet = {
        q
        for q, listed, right in zip(rows.questions, rows.texts, rows.answered, strict=True)
        if not right and not set(listed) <= trained  # a list of other questions: the test below
    }
    assert quiet and quiet <= set(labels.unanswered or {})  # a question with no answer: negatives alone
    assert held.first_stage().auroc is not None


def test_answers_grouped_by_question_also_train_on_the_questions_nearest_each_other(tmp_path, monkeypatch):
    """Questions and their answer sentences show a reranker no text that asks; an index of
    questions (an FAQ) hands it nothing else, and it scored them at random (docs/rerank.md: the
    WikiQA reranker on the FAQ sets). Each training question also ranks the ``KIN`` other training
    questions the first stage puts nearest it: none right (each scored towards 0), their order
    the first stage's (the listwise target's share), never a held-back one."""
    from search.studies.cross_tuning import KIN

    labels = grouped(read_labels(pairs=wikiqa_like(tmp_path)))
    mined = Mined.of(labels, unit_vectors)
    held = held_back_set(labels, hold_back(labels, 0.25, seed=0), mined, unit_vectors, DEPTH, 0)
    rows = training_rows(labels, held, mined, 0)
    assert rows.teacher is not None
    trained = set(rows.questions)
    kin = [
        (q, listed, cosines, right)
        for q, listed, cosines, right in zip(
            rows.questions, rows.texts, rows.teacher, rows.answered, strict=True
        )
        if set(listed) <= trained
    ]
    assert {q for q, *_ in kin} == trained  # every training question, answered or not, once
    assert len(kin) == len(trained) and not any(right for *_, right in kin)
    others = sorted(trained)
    for question, listed, cosines, _ in kin:
        assert len(listed) == KIN and question not in listed and not set(listed) & held.questions
        expected = unit_vectors(listed, role="passage") @ unit_vectors([question])[0]
        assert np.allclose(cosines, expected, atol=1e-6)
        nearest = (
            unit_vectors([o for o in others if o != question], role="passage") @ unit_vectors([question])[0]
        )
        assert np.allclose(sorted(cosines, reverse=True), np.sort(nearest)[::-1][:KIN], atol=1e-6)
    # a large file's questions are ranked a block at a time (memory), to the same lists
    monkeypatch.setattr("search.studies.cross_tuning.RANKED_AT_ONCE", 5)
    blocked = training_rows(labels, held, mined, 0)
    assert blocked.texts == rows.texts and blocked.teacher is not None
    assert all(np.allclose(a, b, atol=1e-6) for a, b in zip(blocked.teacher, rows.teacher, strict=True))
    # questions matched to questions (a question of the labels is one of their texts): a question
    # near another may be its right text there, so none is added
    path = wikiqa_like(tmp_path)
    asked = sorted({line.split("\t")[0] for line in path.read_text(encoding="utf-8").splitlines()})
    with path.open("a", encoding="utf-8") as f:
        f.write(f"{asked[0]}\t{asked[1]}\t0\n")
    labels = grouped(read_labels(pairs=path))
    mined = Mined.of(labels, unit_vectors)
    held = held_back_set(labels, hold_back(labels, 0.25, seed=0), mined, unit_vectors, DEPTH, 0)
    rows = training_rows(labels, held, mined, 0)
    assert not any(set(listed) <= set(rows.questions) for listed in rows.texts)


def test_a_reranker_of_questions_trains_through_the_first_stage(tiny_model, tmp_path):
    done = cross_tune(
        demo_labels(),
        tmp_path / "out",
        tiny_model,
        Strategy(model=tiny_model, backend="torch"),
        held_back=0.3,
        epochs=1,
        batch_size=16,
        learning_rate=1e-3,
    )
    assert done.metric == "mrr@10" and done.first_stage is not None and done.steps > 0
    assert done.losses and all(np.isfinite(done.losses))
    assert done.verdict and done.helps is not None and done.weight is not None
    fusion = json.loads((tmp_path / "out" / "semsearch.json").read_text(encoding="utf-8"))["fusion"]
    assert fusion["weight"] == (done.weight if done.helps else 0.0)
    assert fusion["first_stage"]["headline"] == pytest.approx(done.first_stage)


def test_the_saved_folder_is_a_sentence_transformers_cross_encoder_with_equal_scores(tiny_model, tmp_path):
    from sentence_transformers import CrossEncoder

    from indexer.embedding.cross_folder import read_cross_folder
    from indexer.encoders.cross_training import load_cross
    from indexer.encoders.rerankers import reranker_for

    labels = read_labels(pairs=learnable_pairs(tmp_path))
    out = tmp_path / "out"
    cross_tune(
        labels,
        out,
        tiny_model,
        tiny_stage(tiny_model),
        held_back=0.3,
        epochs=1,
        batch_size=8,
        learning_rate=1e-3,
        max_length=48,
    )
    written = tmp_path / "written"  # what the installed sentence-transformers writes itself
    CrossEncoder(tiny_model, num_labels=1).save(str(written))
    for name in ("modules.json", "sentence_bert_config.json"):
        assert json.loads((out / name).read_text()) == json.loads((written / name).read_text()), name
    ours = json.loads((out / "config_sentence_transformers.json").read_text())
    theirs = json.loads((written / "config_sentence_transformers.json").read_text())
    assert {k: v for k, v in ours.items() if k != "__version__"} == {
        k: v for k, v in theirs.items() if k != "__version__"
    }
    assert ours["model_type"] == "CrossEncoder" and ours["activation_fn"].endswith("Sigmoid")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and len(config["id2label"]) == 1

    pairs = [(labels.first[i], labels.second[i]) for i in range(10)] + [("short", "a much longer text " * 40)]
    reader = CrossEncoder(str(out))
    assert reader.max_seq_length == 48
    ours_scores = load_cross(str(out)).scores(pairs)
    assert np.allclose(reader.predict(pairs), ours_scores, atol=1e-5)
    folder = read_cross_folder(out)
    assert (folder.activation, folder.max_length, folder.format) == ("sigmoid", 48, "sentence-transformers")
    for runtime in ("torch", "onnx"):  # semsearch's reader, on both runtimes
        assert np.allclose(reranker_for(out, runtime=runtime).score_pairs(pairs), ours_scores, atol=1e-4)


def test_an_existing_cross_encoder_trains_on_from_where_it_stopped(tiny_model, tmp_path):
    from indexer.encoders.cross_training import load_cross

    labels = read_labels(pairs=learnable_pairs(tmp_path))
    schedule = {"held_back": 0.3, "batch_size": 8, "learning_rate": 1e-3}
    first = cross_tune(labels, tmp_path / "first", tiny_model, tiny_stage(tiny_model), epochs=2, **schedule)
    assert load_cross(str(tmp_path / "first")).continued and not load_cross(tiny_model).continued
    again = cross_tune(
        labels, tmp_path / "again", str(tmp_path / "first"), tiny_stage(tiny_model), epochs=1, **schedule
    )
    assert again.before == pytest.approx(first.after, abs=1e-6)  # its head kept, not a new one
    assert "head trained on" in again.strategy


def test_what_makes_no_sense_is_refused_in_one_line(tiny_model, tmp_path):
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from indexer.encoders.cross_training import load_cross

    with pytest.raises(BadInput, match="reads pairs of 2 to 128 tokens"):
        load_cross(tiny_model, max_length=4096)
    three = tmp_path / "three-labels"
    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, num_labels=3
    )
    BertForSequenceClassification(config).save_pretrained(three)
    with pytest.raises(BadInput, match="this folder has 3 labels"):
        load_cross(str(three))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--pooling", "cls"], "--cross-encoder trains a reranker from --model: --pooling shapes"),
        (["--layers", "2"], "--layers shapes a bi-encoder's vectors"),
    ],
)
def test_bi_encoder_options_with_cross_encoder_are_a_usage_error(extra, message, tmp_path):
    from click.testing import CliRunner

    from search.cli import cli

    pairs = learnable_pairs(tmp_path)
    result = CliRunner().invoke(
        cli, ["tune", "--cross-encoder", "--pairs", str(pairs), "-o", str(tmp_path / "o"), *extra]
    )
    assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_the_command_trains_a_reranker_from_the_bundled_model(tmp_path):
    """The bundled BertModel gets a new one-label head; the command's report and the saved
    folder say it is a reranker, and how it compares with the bundled bi-encoder's cosine."""
    pairs = learnable_pairs(tmp_path)
    out = tmp_path / "out"
    done = run("tune", "--cross-encoder", "--pairs", pairs, "-o", out, "--epochs", "1", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["reranker"] and "a new one-label head" in report["strategy"]
    assert json.loads((out / "config_sentence_transformers.json").read_text())["model_type"] == "CrossEncoder"
    assert report["first_stage"] is not None and report["verdict"][0].startswith("held-back spearman")


def test_training_keeps_the_checkpoint_the_reranker_alone_ranks_best(tiny_model, tmp_path, monkeypatch):
    """The measure early stopping reads is the reranker's own ranking: the fused score is floored
    at the first stage (weight 0), so by it a reranker that learns but does not yet beat the first
    stage scores as much as an untrained head, and the untrained head was the one kept."""
    from indexer.encoders import cross_training

    read: dict = {}
    real = cross_training.fine_tune_cross

    def spy(cross, rows, measure, budget, **kwargs):
        read["measure"] = measure
        return real(cross, rows, measure, budget, **kwargs)

    monkeypatch.setattr(cross_training, "fine_tune_cross", spy)
    labels = demo_labels()
    done = cross_tune(
        labels,
        tmp_path / "out",
        tiny_model,
        tiny_stage(tiny_model),
        held_back=0.3,
        epochs=1,
        learning_rate=1e-3,
    )
    assert labels.candidates is not None and labels.relevant is not None
    right = {q: {labels.candidates[c] for c in labels.relevant[q]} for q in labels.relevant}

    def adversary(pairs, progress=None):
        return np.array([float(t not in right[q]) for q, t in pairs])

    def oracle(pairs, progress=None):
        return np.array([float(t in right[q]) for q, t in pairs])

    assert done.first_stage is not None
    assert read["measure"](adversary) < done.first_stage < read["measure"](oracle)


def test_the_ranking_loss_ranks_each_right_text_above_its_negatives():
    import torch

    from indexer.encoders.cross_training import ranking_loss

    right_first = torch.tensor([3.0, -1.0, -2.0, 0.0, -3.0])
    right_last = torch.tensor([-2.0, 3.0, 1.0, 0.0, -3.0])
    sizes, answered = [3, 2], [True, False]
    assert ranking_loss(right_first, sizes, answered) < ranking_loss(right_last, sizes, answered)
    # a list with no right text is pushed down everywhere, by the pointwise term alone
    low, high = torch.full((2,), -4.0), torch.full((2,), 4.0)
    assert ranking_loss(low, [2], [False]) < ranking_loss(high, [2], [False])
    shifted = ranking_loss(right_first + 5, sizes, answered)  # the score is absolute, not only relative
    assert shifted > ranking_loss(right_first, sizes, answered)


def test_the_ranking_loss_keeps_a_share_of_the_first_stages_order():
    import torch

    from indexer.encoders.cross_training import ranking_loss

    teacher = torch.tensor([0.2, 0.25, 0.1])  # cosines: the first stage puts the second text first
    agrees, disagrees = torch.tensor([1.0, 2.0, 0.0]), torch.tensor([0.0, 1.0, 2.0])
    # a list with no answer is ranked as the first stage ranks it
    assert ranking_loss(agrees, [3], [False], teacher) < ranking_loss(disagrees, [3], [False], teacher)
    # the labels alone give such a list no order
    assert ranking_loss(agrees, [3], [False]) == ranking_loss(disagrees, [3], [False])
    # an answered list still ranks its right text (the first) highest
    right_first, right_second = torch.tensor([3.0, 2.0, 1.0]), torch.tensor([2.0, 3.0, 1.0])
    assert ranking_loss(right_first, [3], [True], teacher) < ranking_loss(right_second, [3], [True], teacher)


def test_a_new_heads_weights_train_at_a_rate_of_their_own(tiny_model, tmp_path):
    from indexer.encoders.cross_training import NEW_HEAD_TIMES, head_groups, load_cross

    cross = load_cross(tiny_model, None, "cpu", "fp32", 0)
    body, head = head_groups(cross.network, 1e-4)
    assert "lr" not in body and head["lr"] == pytest.approx(1e-4 * NEW_HEAD_TIMES) and NEW_HEAD_TIMES > 1
    named = dict(cross.network.named_parameters())
    ids = {id(p) for p in head["params"]}
    faster = {name for name, p in named.items() if id(p) in ids}
    assert faster == {name for name in named if name.startswith("classifier.")}
    assert len(body["params"]) + len(head["params"]) == len(named)


def test_a_run_to_a_log_gets_progress_lines_while_mining_and_measuring(
    tiny_model, tmp_path, monkeypatch, capsys
):
    """Mining and held-back measurements can take minutes: a log hears from them (a fake clock
    makes every call 31 s later, so each progress bar writes lines)."""
    import indexer.progress as progress_module

    ticks = iter(range(0, 10**7, 31))
    monkeypatch.setattr(progress_module, "clock", lambda: float(next(ticks)))
    cross_tune(
        demo_labels(),
        tmp_path / "out",
        tiny_model,
        tiny_stage(tiny_model),
        held_back=0.3,
        epochs=1,
        learning_rate=1e-3,
        progress=True,
    )
    said = capsys.readouterr().err
    assert "embedding the candidates to mine:" in said and "measuring held-back:" in said


def test_a_tight_budget_still_holds_back_enough_answered_questions_to_judge_by():
    """The held-back share's floor counts answered questions: questions with no right text judge
    only the top score's separation, never whether the reranker ranks the right text higher, so a
    floor reached with them left the sign test a handful of questions (9 of 21 on WikiQA)."""
    from search.studies.cross_tuning import MIN_MEASURED, sized_share
    from search.studies.tuning import Labels

    answered = 400
    first = [f"question {i}" for i in range(answered)]
    labels = Labels(
        "pairs",
        first,
        [f"right text {i}" for i in range(answered)],
        np.arange(answered),
        scores=np.ones(answered, dtype=np.float32),
        unanswered={f"unanswered {i}": answered + i for i in range(3 * answered)},
    )
    share = sized_share(labels, 0.2, max_minutes=1, pairs_per_second=1.0)  # fits almost nothing
    assert share * answered >= MIN_MEASURED
    assert share <= 0.2


@pytest.mark.parametrize("minutes", [float("nan"), float("inf")])
def test_a_time_budget_that_is_no_number_of_minutes_is_refused_before_anything(minutes, tiny_model, tmp_path):
    labels = read_labels(pairs=learnable_pairs(tmp_path))
    with pytest.raises(BadInput, match=f"max minutes must be a positive number, not {minutes}"):
        cross_tune(labels, tmp_path / "out", tiny_model, tiny_stage(tiny_model), max_minutes=minutes)
    assert not (tmp_path / "out").exists()
