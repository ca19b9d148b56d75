"""Inference backends: ONNX Runtime gives the torch fp32 vectors; int8 stays close, and an index
remembers its backend so queries use it too."""

from __future__ import annotations

import numpy as np
import pytest

from indexer import Strategy, build_index
from indexer.embedding import Embedder
from search import SearchEngine
from tests.test_peer import real_sentences

pytest.importorskip("onnxruntime")


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path_factory.getbasetemp() / "onnx-cache"))


@pytest.mark.parametrize(
    "strategy", [Strategy(), Strategy(layers=(-4, -3, -2, -1), combine="concat"), Strategy(pooling="pooler")]
)
def test_onnx_matches_torch_fp32(bundled, strategy):
    sentences = real_sentences()[:120]
    reference = Embedder(strategy).embed(sentences)
    onnx = Embedder(Strategy(**{**strategy.to_dict(), "backend": "onnx"})).embed(sentences)
    cosines = (reference * onnx).sum(axis=1)
    assert cosines.mean() >= 0.999 and cosines.min() >= 0.999


def test_int8_is_close_and_stored_with_the_index(tmp_path, bundled):
    sentences = real_sentences()[:120]
    int8 = Embedder(Strategy(backend="onnx-int8")).embed(sentences)
    cosines = (bundled.embed(sentences) * int8).sum(axis=1)
    assert cosines.mean() >= 0.9 and not np.allclose(cosines, 1.0)  # lossy, but close
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(sentences[:40]), encoding="utf-8")
    build_index(corpus, tmp_path / "idx", Strategy(backend="onnx-int8"))
    engine = SearchEngine(tmp_path / "idx")
    assert engine.strategy.backend == "onnx-int8"
    top = engine.search(sentences[5], k=1)[0]
    # int8 activations are quantised per batch, so a text alone differs a little from in a batch
    assert top.text == sentences[5].strip() and top.score > 0.98
