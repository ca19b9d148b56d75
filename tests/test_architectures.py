"""Every encoder architecture users bring reads its layers and pools as asked, on torch and on its
exported ONNX graph: each vector equals the one made by hand from the whole transformers model's
``hidden_states`` (tiny random models of each ``model_type``, the bundled tokenizer)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from indexer.embedding.strategy import Strategy
from indexer.encoders.factory import encoder_for, torch_encoder
from tests.helpers import ARCHITECTURES, random_encoder, run

TEXTS = ["the bike station near the river", "a broken lock", "billing questions about the app and the map"]
CHOICES = [((-2,), "mean", "mean"), ((1, -1), "max", "mean"), ((0, 2), "cls", "concat")]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("architectures")
    return {kind: random_encoder(kind, root / kind) for kind in ARCHITECTURES}


def by_hand(folder: str, layers: tuple[int, ...], pooling: str, combine: str) -> np.ndarray:
    """The strategy's vectors from the whole model's hidden states, pooled over the real tokens."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.inference_mode():
        states = model(**batch, output_hidden_states=True).hidden_states
    mask = batch["attention_mask"].numpy()[..., None].astype(bool)
    picked = [states[i].numpy() for i in layers]
    tokens = np.concatenate(picked, -1) if combine == "concat" else sum(picked) / len(picked)
    if pooling == "cls":
        vectors = tokens[:, 0]
    elif pooling == "max":
        vectors = np.where(mask, tokens, -np.inf).max(1)
    else:
        vectors = (tokens * mask).sum(1) / mask.sum(1)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.mark.parametrize("kind", list(ARCHITECTURES))
def test_each_architecture_reads_the_layers_asked_on_torch(models, kind):
    for layers, pooling, combine in CHOICES:
        strategy = Strategy(model=models[kind], layers=layers, pooling=pooling, combine=combine)
        vectors = encoder_for(replace(strategy, backend="torch")).embed(TEXTS)
        expected = by_hand(models[kind], layers, pooling, combine)
        np.testing.assert_allclose(vectors, expected, atol=1e-5, err_msg=f"{kind} {layers} {pooling}")


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(ARCHITECTURES))
def test_each_architecture_exports_to_onnx_with_the_same_vectors(models, kind, tmp_path, monkeypatch):
    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path))
    for layers, pooling, combine in CHOICES:
        strategy = Strategy(model=models[kind], layers=layers, pooling=pooling, combine=combine)
        encoder = encoder_for(strategy)
        assert encoder.decision.runtime == "onnx", encoder.decision.why
        expected = by_hand(models[kind], layers, pooling, combine)
        np.testing.assert_allclose(encoder.embed(TEXTS), expected, atol=1e-5, err_msg=f"{kind} {layers}")


def test_a_sweep_reads_the_same_layers_as_an_index_of_one(models):
    """ModernBERT normalises its last hidden state: a network cut after layer 2 would give
    another layer 2 than the sweep's whole network."""
    for kind in ("modernbert", "distilbert", "albert"):
        strategy = Strategy(model=models[kind], layers=(2,), pooling="mean", backend="torch")
        alone = torch_encoder(strategy).embed(TEXTS)
        swept = torch_encoder(strategy, all_layers=True).embed_grid(TEXTS, [strategy])[0]
        np.testing.assert_allclose(alone, swept, atol=1e-6, err_msg=kind)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["distilbert", "modernbert"])
def test_distilbert_and_modernbert_index_query_sweep_and_export(models, kind, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    index = tmp_path / "index"
    built = run("index", corpus, "-o", index, "--model", models[kind])
    assert built.returncode == 0, built.stderr
    answered = run("query", index, "a broken lock", "--json")
    assert answered.returncode == 0, answered.stderr
    assert "a broken lock" in answered.stdout
    info = run("info", index)
    assert "encoder:     onnx" in info.stdout, info.stdout
    pairs = tmp_path / "pairs.csv"
    pairs.write_text(
        "sentence1,sentence2,score\na bike,a bicycle,4.5\na lock,the river,0.5\na map,the map,5\n"
        "the app,billing,1\n",
        encoding="utf-8",
    )
    swept = run("sweep", "sts", pairs, "--model", models[kind])
    assert swept.returncode == 0, swept.stderr
    words = run("words", "a broken lock", "--model", models[kind])
    assert words.returncode == 0, words.stderr
    exported = run("export-encoder", index, "-o", tmp_path / "encoder")
    assert exported.returncode == 0, exported.stderr
    assert json.loads((tmp_path / "encoder" / "semsearch-encoder.json").read_text())["dimension"] == 32
