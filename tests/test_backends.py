"""Inference backends: ONNX Runtime gives the torch fp32 vectors; int8 stays close, and an index
remembers its backend so queries use it too."""

from __future__ import annotations

import numpy as np
import pytest

from indexer import Strategy, build_index
from indexer.encoders.factory import encoder_for
from indexer.encoders.onnx_encoder import OnnxEncoder
from search import SearchEngine
from tests.helpers import graph_encoder, real_sentences, torch_reference

pytest.importorskip("onnxruntime")


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path_factory.getbasetemp() / "onnx-cache"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy", [Strategy(), Strategy(layers=(-4, -3, -2, -1), combine="concat"), Strategy(pooling="pooler")]
)
def test_onnx_matches_torch_fp32(bundled, strategy):
    sentences = real_sentences()[:120]
    reference = encoder_for(Strategy(**{**strategy.to_dict(), "backend": "torch"})).embed(sentences)
    onnx = encoder_for(Strategy(**{**strategy.to_dict(), "backend": "onnx"})).embed(sentences)
    cosines = (reference * onnx).sum(axis=1)
    assert cosines.mean() >= 0.999 and cosines.min() >= 0.999


@pytest.mark.slow
def test_int8_is_close_and_stored_with_the_index(tmp_path, bundled):
    sentences = real_sentences()[:120]
    int8 = encoder_for(Strategy(backend="onnx-int8")).embed(sentences)
    cosines = (bundled.embed(sentences) * int8).sum(axis=1)
    # the documented tolerance (docs/performance.md): cosine to torch >= 0.95, mean >= 0.99
    assert cosines.min() >= 0.95 and cosines.mean() >= 0.99, (cosines.min(), cosines.mean())
    assert not np.allclose(cosines, 1.0)  # lossy, but close
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(sentences[:40]), encoding="utf-8")
    build_index(corpus, tmp_path / "idx", Strategy(backend="onnx-int8"))
    engine = SearchEngine(tmp_path / "idx")
    assert engine.strategy.backend == "onnx-int8"
    top = engine.search(sentences[5], k=1, mode="dense")[0]
    # int8 vectors do not depend on the batch: the query is its own indexed vector (cosine 1)
    assert top.text == sentences[5].strip() and top.score > 0.9999


@pytest.mark.slow
def test_documents_are_chunked_as_the_transformers_tokenizer_does(bundled):
    """Both encoders' windows (tokenizers' overflow, from the loaded tokenizer or from
    tokenizer.json) equal the transformers tokenizer's own, in order."""
    strategy = Strategy(backend="onnx", max_length=16).chunked(4)
    embedder = torch_reference(strategy)
    assert embedder.export_for_queries() is None
    encoder = graph_encoder(embedder.strategy)
    texts = real_sentences()[:30] + ["?", "naïve café — 東京 🚀 " * 9, "word " * 300, "x" * 3000]
    expected = embedder.tokenizer(
        texts,
        truncation=True,
        max_length=16,
        return_overflowing_tokens=True,
        stride=4,
        return_attention_mask=False,
        return_token_type_ids=False,
    )
    for got in (embedder.tokens.documents(texts), encoder.tokens.documents(texts)):
        assert got.ids == expected["input_ids"]
        assert got.owners.tolist() == list(expected["overflow_to_sample_mapping"])
        assert max(got.owners) == len(texts) - 1 and len(got.ids) > len(texts)


@pytest.mark.slow
def test_an_exported_onnx_backend_indexes_without_torch(tmp_path, monkeypatch):
    """Once its graph is cached, ``index`` on an ONNX backend runs on ONNX Runtime + tokenizers: a
    fresh process imports no torch, and its vectors are the torch ones."""
    import json
    import os
    import subprocess
    import sys

    from indexer.store import open_index
    from tests.helpers import ROOT

    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path / "cache"))
    sentences = real_sentences()[:60]
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(sentences), encoding="utf-8")
    strategy = Strategy(backend="onnx")
    first = encoder_for(strategy)  # nothing exported yet: torch exports it, ONNX Runtime runs it
    assert isinstance(first, OnnxEncoder) and first.decision.why.startswith("its graph was exported now")
    build_index(corpus, tmp_path / "first", strategy)
    cached = encoder_for(strategy)
    assert isinstance(cached, OnnxEncoder) and cached.decision.why == "its graph is cached"
    code = (
        "import sys, json\nfrom indexer.writing.build import build_index\n"
        "from indexer.embedding.strategy import Strategy\n"
        f"build_index({str(corpus)!r}, {str(tmp_path / 'second')!r}, Strategy(backend='onnx'))\n"
        "print(json.dumps([m for m in ('torch', 'transformers') if m in sys.modules]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=os.environ, check=True
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
    second = open_index(tmp_path / "second")
    assert second.strategy == open_index(tmp_path / "first").strategy
    vectors, ids = second.vectors.stored()
    reference = torch_reference(Strategy(backend="torch")).embed([line.strip() for line in sentences])
    assert np.abs(vectors[np.argsort(ids)] - reference).max() < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["onnx", "onnx-int8"])
def test_layer_norms_run_on_the_layer_norm_kernel_not_the_skip_one(backend, monkeypatch, tmp_path):
    """The residual adds and layer norms run as ``Add`` + ``LayerNormalization``: ONNX Runtime's CPU
    ``SkipLayerNormalization`` kernel (a scalar loop) took 3x their time, 13% of a pass
    (docs/profile-embed.md). What the session runs is read from ONNX Runtime's own profile, so a
    graph exported with the fusion, or a session that fuses them again, both fail."""
    import json
    from pathlib import Path

    import onnxruntime

    plain = onnxruntime.InferenceSession

    def profiling(path, options, *args, **kwargs):
        options.enable_profiling = True
        options.profile_file_prefix = str(tmp_path / "ort")
        return plain(path, options, *args, **kwargs)

    monkeypatch.setattr(onnxruntime, "InferenceSession", profiling)
    encoder = encoder_for(Strategy(backend=backend))
    encoder.embed(real_sentences()[:4])
    events = json.loads(Path(encoder.network.session.end_profiling()).read_text(encoding="utf-8"))
    ran = {e["args"]["op_name"] for e in events if e.get("cat") == "Node" and "op_name" in e.get("args", {})}
    assert "LayerNormalization" in ran and "SkipLayerNormalization" not in ran, sorted(ran)
