"""A vector does not depend on the texts it shares a batch with (goal 2 of issue 9): a short text
embedded alone and padded inside one batch of long FAQ answers gives the same vector, for every
backend an index can be built with (in the torch process that exports its graph and on ONNX
Runtime alone once it is cached) and for the ONNX encoder that answers queries."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from indexer.embedding.batching import Batching
from indexer.embedding.strategy import BACKENDS, Strategy
from indexer.encoders.factory import encoder_for
from indexer.encoders.onnx_encoder import OnnxEncoder
from tests.helpers import graph_encoder, shared_file

SHORT = ["A man is playing a guitar.", "how do I reset my password", "naïve café — 東京 🚀", "?"]


def long_answers(n: int = 20) -> list[str]:
    with shared_file("stackfaq", "corpus.jsonl").open(encoding="utf-8") as f:
        answers = [json.loads(line)["answer"] for line in f]
    return sorted(answers, key=len)[-n:]


def assert_batch_independent(encoder) -> None:
    texts = SHORT + long_answers()
    # one pass whatever its padding costs (the planner would keep the short texts apart): the
    # short texts are padded to the longest answer
    encoder.decision = replace(encoder.decision, batching=Batching(len(texts), 10**7, call_tokens=10**9))
    lengths = [len(ids) for ids in encoder.tokens.ids(texts)]
    assert len(encoder.decision.batching.plan(lengths)) == 1
    assert max(lengths[: len(SHORT)]) * 4 < min(lengths[len(SHORT) :])  # padded, and by much
    alone = np.vstack([encoder.embed([t]) for t in SHORT])
    together = encoder.embed(texts)[: len(SHORT)]
    np.testing.assert_allclose(together, alone, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_torch_backend_is_batch_independent(bundled):
    assert_batch_independent(bundled)


@pytest.mark.slow
def test_query_encoder_is_batch_independent(bundled, tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path))
    assert bundled.export_for_queries() is None
    encoder = graph_encoder(bundled.strategy)
    assert_batch_independent(encoder)


@pytest.mark.slow
@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "torch"])
def test_every_onnx_backend_is_batch_independent(backend, tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path))
    exporting = encoder_for(Strategy(backend=backend))  # torch process: exports, then runs the graph
    assert_batch_independent(exporting)
    torch_free = encoder_for(Strategy(backend=backend))
    assert isinstance(torch_free, OnnxEncoder) and torch_free.decision.why == "its graph is cached"
    assert_batch_independent(torch_free)


def test_onnx_passes_of_a_token_budget_give_each_text_its_own_vector(tiny_model):
    """On the CPU short texts share passes by a token budget, hundreds a call: each still gets the
    vector it gets alone, and no pass exceeds the budget."""
    encoder = encoder_for(Strategy(model=tiny_model))
    assert isinstance(encoder, OnnxEncoder)
    texts = [f"text number {i} " + "word " * (i % 3) for i in range(700)]
    lengths = np.array([len(ids) for ids in encoder.tokens.ids(texts, "passage")])
    batching = encoder.decision.batching
    plan = batching.plan(lengths)
    assert max(len(rows) for rows in plan) > 4 * 32  # far more than the batch size a call
    for rows in plan:
        assert len(rows) <= batching.rows and len(rows) * lengths[rows].max() <= batching.tokens
    together = encoder.embed(texts)
    alone = np.vstack([encoder.embed([text]) for text in texts[::9]])
    np.testing.assert_allclose(together[::9], alone, atol=1e-6, rtol=0)
