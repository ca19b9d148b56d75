"""A model that yields NaN or infinite vectors (broken weights, a corrupted graph) is an error
where the vectors are made, on every surface: nothing is indexed or written, and a server does
not start on it (or answers a clear 5xx if it starts doing so later)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from indexer.embedding.strategy import Strategy
from indexer.encoders.factory import encoder_for
from indexer.errors import SemsearchError
from search.cli import cli
from tests.helpers import build_faq, random_bert, write_csv


@pytest.fixture(scope="module")
def nan_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny random BERT with every weight NaN, saved as a model directory."""
    import torch
    from transformers import BertModel

    target = Path(random_bert(tmp_path_factory.mktemp("nan-bert")))
    model = BertModel.from_pretrained(target)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(float("nan"))
    model.save_pretrained(target)
    return str(target)


def test_the_encoder_refuses_non_finite_vectors(nan_model):
    for backend in ("torch", "onnx"):
        encoder = encoder_for(Strategy(model=nan_model, backend=backend))
        with pytest.raises(SemsearchError, match="non-finite"):
            encoder.embed(["a bike"])
        with pytest.raises(SemsearchError, match="non-finite"):
            encoder.embed_documents(["a bike"])


def test_index_and_encode_fail_in_one_line_and_write_nothing(nan_model, tmp_path):
    corpus = write_csv(tmp_path / "faq.csv", [("a1", "How do I pay?", "x"), ("a2", "Where to park?", "x")])
    runner = CliRunner()
    result = runner.invoke(cli, ["index", str(corpus), "-o", str(tmp_path / "idx"), "--model", nan_model])
    assert result.exit_code != 0 and "non-finite" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "idx").exists()
    for out in ("out.jsonl", "out.npy"):
        result = runner.invoke(cli, ["encode", str(corpus), "--model", nan_model, "-o", str(tmp_path / out)])
        assert result.exit_code != 0 and "non-finite" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["faq.csv"]


def test_a_server_does_not_start_on_such_a_model_and_answers_5xx_if_it_turns(nan_model, tiny_model):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from search.read.loading import load_encoding
    from search.server import create_app

    with pytest.raises(SemsearchError, match="non-finite"):
        create_app(None, encoding=load_encoding(Strategy(model=nan_model)))
    loading = load_encoding(Strategy(model=tiny_model))
    with TestClient(create_app(None, encoding=loading), raise_server_exceptions=False) as client:
        network = loading.result().embedder.network

        def broken(input_ids: np.ndarray, attention: np.ndarray):
            output = network(input_ids, attention)
            states = output.hidden_states
            keys = states.keys() if isinstance(states, dict) else range(len(states))
            return type(output)({k: states[k] * np.nan for k in keys}, output.pooler_output)

        loading.result().embedder.network = broken
        requests = (("/v1/embeddings", {"input": ["a bike"]}), ("/encode", {"texts": ["a"]}))
        for path, body in requests:
            answer = client.post(path, json=body)
            assert answer.status_code >= 500 and "non-finite" in answer.text, answer.text


def test_a_server_does_not_start_on_an_index_whose_graph_yields_nan(tmp_path, tiny_model, monkeypatch):
    """A held graph damaged after the build: the probe text at start fails before serving."""
    pytest.importorskip("fastapi")
    from indexer.encoders import onnx_graph
    from search.server import create_app

    index = build_faq(tmp_path, tiny_model)
    run = onnx_graph.OnnxGraph.__call__

    def broken(self, input_ids: np.ndarray, attention: np.ndarray):
        output = run(self, input_ids, attention)
        return type(output)({k: v * np.nan for k, v in dict(output.hidden_states).items()})

    monkeypatch.setattr(onnx_graph.OnnxGraph, "__call__", broken)
    with pytest.raises(SemsearchError, match="non-finite"):
        create_app(index)
