"""Every strategy option on a tiny random BERT: shapes, layer choice, combination, and masking
(padding never changes a vector)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from indexer.embedding.strategy import POOLINGS, Strategy
from indexer.encoders.factory import encoder_for
from indexer.encoders.torch_encoder import TorchNetwork
from indexer.errors import SemsearchError
from tests.helpers import torch_reference

SHORT = "A cat sat."
LONG = "The quick brown fox jumps over the lazy dog near the bank of a wide, slow river today."


def full_hidden_states(model_dir: str, text: str):
    """Reference: every hidden state and the pooler output from an untouched model."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()
    encoded = tokenizer([text], return_tensors="pt")
    with torch.inference_mode():
        out = model(**encoded, output_hidden_states=True)
    return out.hidden_states, out.pooler_output, encoded["input_ids"]


LAYER_CHOICES = [
    ((-1,), "mean"),
    ((0,), "mean"),
    ((-4, -3, -2, -1), "sum"),
    ((-4, -3, -2, -1), "concat"),
    ((1, -1), "mean"),
]
GRID = [
    (layers, combine, pooling)
    for layers, combine in LAYER_CHOICES
    for pooling in POOLINGS
    if pooling != "pooler" or layers == (-1,)
]  # pooler reads the last layer only


@pytest.mark.parametrize("layers,combine,pooling", GRID)
def test_padding_never_changes_a_vector(tiny_model, layers, combine, pooling):
    embedder = encoder_for(Strategy(model=tiny_model, layers=layers, combine=combine, pooling=pooling))
    alone = embedder.embed([SHORT])
    padded = embedder.embed([LONG, SHORT, LONG + " " + LONG])[1]
    assert alone.shape == (1, embedder.dimension)
    np.testing.assert_allclose(alone[0], padded, atol=1e-5)


@pytest.mark.parametrize(
    "layers,combine,pooling,width",
    [
        ((-1,), "mean", "mean", 32),
        ((-4, -3, -2, -1), "concat", "mean", 128),
        ((-4, -3, -2, -1), "sum", "mean-max", 64),
        ((-2,), "mean", "cls", 32),
        ((-1,), "mean", "pooler", 32),
    ],
)
def test_dimension_matches_strategy(tiny_model, layers, combine, pooling, width):
    embedder = encoder_for(Strategy(model=tiny_model, layers=layers, combine=combine, pooling=pooling))
    vectors = embedder.embed([SHORT, LONG])
    assert embedder.dimension == width
    assert vectors.shape == (2, width)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_layers_and_pooling_read_the_right_hidden_states(tiny_model):
    hidden, pooler, _ = full_hidden_states(tiny_model, LONG)
    tokens = hidden[1][0]
    base = {"model": tiny_model, "normalize": False}

    def one(**kw):
        return encoder_for(Strategy(**base, **kw)).embed([LONG])[0]

    np.testing.assert_allclose(one(layers=(1,), pooling="mean"), tokens.mean(0), atol=1e-5)
    np.testing.assert_allclose(one(layers=(1,), pooling="max"), tokens.max(0).values, atol=1e-5)
    np.testing.assert_allclose(one(layers=(1,), pooling="cls"), tokens[0], atol=1e-5)
    np.testing.assert_allclose(one(layers=(0,), pooling="mean"), hidden[0][0].mean(0), atol=1e-5)
    np.testing.assert_allclose(one(pooling="pooler"), pooler[0], atol=1e-5)
    last4 = torch.stack([hidden[i][0] for i in (-3, -2, -1)]).sum(0).mean(0)
    np.testing.assert_allclose(one(layers=(-3, -2, -1), combine="sum", pooling="mean"), last4, atol=1e-4)
    first_last = ((hidden[0][0] + hidden[-1][0]) / 2).mean(0)
    np.testing.assert_allclose(one(layers=(0, -1), combine="mean", pooling="mean"), first_last, atol=1e-5)
    concat = torch.cat([hidden[-2][0], hidden[-1][0]], dim=-1).mean(0)
    np.testing.assert_allclose(one(layers=(-2, -1), combine="concat", pooling="mean"), concat, atol=1e-5)
    content = tokens[1:-1].mean(0)  # [CLS] first, [SEP] last
    np.testing.assert_allclose(one(layers=(1,), pooling="mean", skip_special=True), content, atol=1e-5)


def test_forward_stops_at_deepest_layer_needed(tiny_model):
    embedder = torch_reference(Strategy(model=tiny_model, layers=(1,), backend="torch"))
    assert isinstance(embedder.network, TorchNetwork)
    assert len(embedder.network.model.encoder.layer) == 1
    pooler = Strategy(model=tiny_model, pooling="pooler", backend="torch")
    assert len(torch_reference(pooler).network.model.encoder.layer) == 3
    every = torch_reference(Strategy(model=tiny_model, layers=(1,)), all_layers=True)
    assert len(every.network.model.encoder.layer) == 3


def test_auto_strategy_without_sentence_transformers_config(tiny_model):
    strategy = encoder_for(Strategy(model=tiny_model)).strategy
    assert (strategy.layers, strategy.pooling, strategy.max_length) == ((-2,), "mean", 128)


@pytest.mark.slow
def test_auto_strategy_follows_bundled_models_own_config(bundled):
    assert (bundled.strategy.layers, bundled.strategy.pooling, bundled.strategy.max_length) == (
        (-1,),
        "mean",
        256,
    )


def test_truncation_and_chunking(tiny_model):
    embedder = encoder_for(Strategy(model=tiny_model, max_length=16, chunk_overlap=4))
    long_text = " ".join(["word"] * 50)
    vectors, owners = embedder.embed_documents(["short text", long_text])
    assert owners[0] == 0 and (owners == 1).sum() > 1  # the long text became several windows
    assert len(vectors) == len(owners)
    truncated = embedder.embed([long_text])[0]  # queries never chunk
    np.testing.assert_allclose(truncated, vectors[owners == 1][0], atol=1e-5)


def test_bad_strategies_are_clear_errors(tiny_model):
    with pytest.raises(SemsearchError, match="out of range"):
        encoder_for(Strategy(model=tiny_model, layers=(7,)))
    with pytest.raises(SemsearchError, match="exceeds the model's limit"):
        encoder_for(Strategy(model=tiny_model, max_length=4096))
    with pytest.raises(SemsearchError, match="cannot load model"):
        encoder_for(Strategy(model="no-such-org/no-such-model-anywhere"))
    with pytest.raises(SemsearchError, match="pooling"):
        Strategy(pooling="median")
    with pytest.raises(SemsearchError, match="pooler"):
        Strategy(pooling="pooler", layers=(-2,))
