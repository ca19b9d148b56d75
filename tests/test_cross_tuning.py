"""``semsearch tune --cross-encoder``: a reranker trains on scored pairs and on questions with
mined hard negatives, its held-back metric moves, the held-back share never reaches training,
the saved folder is the CrossEncoder folder sentence-transformers writes (and reads with equal
scores), an existing cross-encoder trains on from where it stopped, and what makes no sense is
refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from indexer.embedding.strategy import Strategy
from indexer.errors import BadInput
from search.studies.tuning import (
    cross_measure_for,
    cross_rows,
    cross_tune,
    hold_back,
    read_labels,
)
from tests.helpers import DATA, assert_clean_failure, run, sentence


def learnable_pairs(directory: Path, count: int = 60) -> Path:
    """Scored pairs a tiny model can learn in a few steps: a pair scores 5 when its second
    sentence says "yes", 0 when it says "no" (every sentence distinct: many groups)."""
    path = directory / "scored.tsv"
    rows = [
        f"{sentence(i)}\t{sentence(i, 1)} {'yes' if i % 2 else 'no'}\t{5 * (i % 2)}" for i in range(count)
    ]
    path.write_text("sentence1\tsentence2\tscore\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path


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
        labels, tmp_path / "out", tiny_model, held_back=0.3, epochs=8, batch_size=8, learning_rate=1e-3
    )
    assert done.reranker and done.metric == "spearman" and done.first_stage is None
    assert done.held_back_pairs == 18 and done.trained_pairs == 42
    assert done.after > done.before + 20, done  # the untouched head ranks at random
    assert done.losses[-1] < done.losses[0]
    facts = json.loads((tmp_path / "out" / "semsearch.json").read_text(encoding="utf-8"))
    assert facts["held_back"]["after"] == done.after and facts["tuned_from"] == tiny_model


def test_scored_pairs_are_scaled_to_targets_between_0_and_1(tmp_path):
    labels = read_labels(pairs=learnable_pairs(tmp_path))
    held = hold_back(labels, 0.3, seed=0)
    rows = cross_rows(labels, held, None)
    assert len(rows) == int((~held).sum()) and set(rows.targets) == {0.0, 1.0}
    assert rows.positive_weight == 1.0


def test_questions_train_with_mined_hard_negatives_and_never_see_the_held_back_share(tiny_model, tmp_path):
    from indexer.encoders.factory import torch_encoder

    labels = demo_labels()
    held = hold_back(labels, 0.3, seed=0)
    embed = torch_encoder(Strategy(model=tiny_model, backend="torch")).embed
    rows = cross_rows(labels, held, embed)
    positives = [i for i, t in enumerate(rows.targets) if t == 1.0]
    negatives = [i for i, t in enumerate(rows.targets) if t == 0.0]
    assert len(positives) == int((~held).sum()) and negatives
    assert rows.positive_weight == pytest.approx(len(negatives) / len(positives))
    held_texts = {labels.first[i] for i in np.flatnonzero(held)} | {
        labels.second[i] for i in np.flatnonzero(held)
    }
    assert not (set(rows.first) | set(rows.second)) & held_texts
    assert labels.candidates is not None and labels.relevant is not None
    for i in negatives:  # a hard negative is never an entry relevant to its question
        relevant = {labels.candidates[c] for c in labels.relevant[rows.first[i]]}
        assert rows.second[i] not in relevant
    # the held-back measure reorders the first stage's best candidates, no others: a scorer that
    # knows the answers reaches MRR 100 over the whole corpus, and changes nothing over one
    assert labels.candidates is not None

    def oracle(pairs):
        return np.array([float(t in {labels.candidates[c] for c in labels.relevant[q]}) for q, t in pairs])

    everything, alone = cross_measure_for(labels, held, embed, depth=len(labels.candidates))
    assert everything(oracle) == pytest.approx(100.0) and 0 < alone < 100
    first_only, same = cross_measure_for(labels, held, embed, depth=1)
    assert first_only(oracle) == pytest.approx(same)


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


def test_the_saved_folder_is_a_sentence_transformers_cross_encoder_with_equal_scores(tiny_model, tmp_path):
    from sentence_transformers import CrossEncoder

    from indexer.embedding.cross_folder import read_cross_folder
    from indexer.encoders.cross_training import load_cross
    from indexer.encoders.rerankers import reranker_for

    labels = read_labels(pairs=learnable_pairs(tmp_path))
    out = tmp_path / "out"
    cross_tune(
        labels, out, tiny_model, held_back=0.3, epochs=1, batch_size=8, learning_rate=1e-3, max_length=48
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
    first = cross_tune(labels, tmp_path / "first", tiny_model, epochs=2, **schedule)
    assert load_cross(str(tmp_path / "first")).continued and not load_cross(tiny_model).continued
    again = cross_tune(labels, tmp_path / "again", str(tmp_path / "first"), epochs=1, **schedule)
    assert again.before == pytest.approx(first.after, abs=1e-6)  # its head kept, not a new one
    assert "head trained on" in again.strategy


def test_what_makes_no_sense_is_refused_in_one_line(tiny_model, tmp_path):
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from indexer.encoders.cross_training import load_cross

    labels = read_labels(pairs=learnable_pairs(tmp_path))
    with pytest.raises(BadInput, match="drop --index"):
        cross_tune(labels, tmp_path / "a", tiny_model, Strategy(model=tiny_model))
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
    assert not (tmp_path / "a").exists()


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
    folder say it is a reranker; scored pairs with --index are one line."""
    pairs = learnable_pairs(tmp_path)
    out = tmp_path / "out"
    done = run("tune", "--cross-encoder", "--pairs", pairs, "-o", out, "--epochs", "1", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["reranker"] and "a new one-label head" in report["strategy"]
    assert json.loads((out / "config_sentence_transformers.json").read_text())["model_type"] == "CrossEncoder"
    refused = run("tune", "--cross-encoder", "--pairs", pairs, "--index", tmp_path, "-o", tmp_path / "x")
    assert_clean_failure(refused, "drop --index")
