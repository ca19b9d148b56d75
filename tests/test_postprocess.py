"""Anisotropy correction: what whitening does to vectors, and that an index stores it and applies
it to queries."""

from __future__ import annotations

import numpy as np
import pytest

from indexer import Strategy, build_index
from indexer.embedding.transform import Transform
from indexer.errors import SemsearchError
from indexer.store import open_index
from search import SearchEngine


def test_whitening_makes_covariance_identity_and_reduces_dims(tmp_path):
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(400, 12)) * np.arange(1, 13) + 3.0
    whiten = Transform.fit("whiten", vectors, dims=6)
    projected = (vectors - whiten.mean) @ whiten.matrix
    np.testing.assert_allclose(np.cov(projected, rowvar=False), np.eye(6), atol=1e-3)
    assert whiten.apply(vectors).shape == (400, 6)
    center = Transform.fit("center", vectors)
    np.testing.assert_allclose(np.linalg.norm(center.apply(vectors), axis=1), 1.0, atol=1e-5)
    whiten.save(tmp_path / "t.npz")
    np.testing.assert_allclose(Transform.load(tmp_path / "t.npz").apply(vectors), whiten.apply(vectors))
    with pytest.raises(SemsearchError, match="only have 12"):
        Transform.fit("whiten", vectors, dims=20)


def test_whitened_index_applies_the_stored_transform_to_queries(tmp_path, tiny_model):
    texts = [f"sentence {i} about {w}" for i, w in enumerate(["bikes", "cards", "rain", "dogs"] * 15)]
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(texts), encoding="utf-8")
    strategy = Strategy(model=tiny_model, postprocess="whiten", whiten_dims=16)
    report = build_index(corpus, tmp_path / "idx", strategy)
    assert report.dimension == 16
    index = open_index(tmp_path / "idx")
    assert index.transform is not None and index.strategy.postprocess == "whiten"
    engine = SearchEngine(tmp_path / "idx")
    top = engine.search(texts[7], k=1)[0]
    assert top.text == texts[7] and top.score == pytest.approx(1.0, abs=1e-4)
