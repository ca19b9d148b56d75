"""``onnx-int8``: an activation scale per token (vectors independent of the batch, texts run in
batches), in the int8 format of the CPU the graph is made on, the graph cached per format."""

from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest

from indexer import Strategy
from indexer.embedding import graphs
from indexer.embedding.graphs import INT8_FORMATS, format_for, graph_spec
from indexer.encoders.factory import encoder_for
from tests.helpers import long_sentences

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("int8-cache")


@pytest.fixture(autouse=True)
def private_cache(cache, monkeypatch):
    """One cache for the module's tests (each graph exported once), none of the user's."""
    monkeypatch.setenv("SEMSEARCH_CACHE", str(cache))


def on_cpu(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Make this machine's CPU one of the ``name`` family, as far as int8 graphs go."""
    monkeypatch.setattr(graphs, "int8_format", lambda: INT8_FORMATS[name])


def test_the_int8_format_follows_the_cpus_int8_instructions():
    vnni = format_for(frozenset({"avx2", "avx512f", "avx512_vnni"}), "x86_64")
    avx_vnni = format_for(frozenset({"avx2", "avx_vnni"}), "x86_64")
    avx2 = format_for(frozenset({"avx2", "fma"}), "x86_64")
    arm = format_for(frozenset({"asimd", "asimddp"}), "aarch64")
    assert vnni == avx_vnni == INT8_FORMATS["vnni"] and vnni.weight_max == 127  # 32-bit sums
    assert avx2 == INT8_FORMATS["avx2"] and avx2.weight_max == 63  # 16-bit pair sums saturate
    assert arm == INT8_FORMATS["other"]


def test_an_int8_graph_is_keyed_by_the_cpu_format_and_fp32_by_none(tiny_model, monkeypatch):
    strategy = encoder_for(Strategy(model=tiny_model, backend="onnx-int8")).strategy
    keys = {}
    for name in INT8_FORMATS:
        on_cpu(monkeypatch, name)
        keys[name] = graph_spec(strategy).key()
        assert graph_spec(replace(strategy, backend="onnx")).int8 is None  # fp32: one graph for all
    assert len(set(keys.values())) == len(INT8_FORMATS)


def test_a_graph_made_for_another_cpu_is_not_reused(tiny_model, monkeypatch):
    on_cpu(monkeypatch, "vnni")
    made = encoder_for(Strategy(model=tiny_model, backend="onnx-int8"))
    vnni = graph_spec(made.strategy)
    assert vnni.exported
    on_cpu(monkeypatch, "avx2")
    encoder = encoder_for(Strategy(model=tiny_model, backend="onnx-int8"))
    avx2 = graph_spec(encoder.strategy)
    assert avx2.path != vnni.path and avx2.exported  # exported again, for this CPU
    assert encoder.network.session._model_path == str(avx2.path)  # noqa: SLF001 - what the session runs


def test_int8_vectors_are_within_tolerance_of_fp32_and_do_not_depend_on_the_batch(tiny_model, monkeypatch):
    texts = ["a short one", "naïve café — 東京 🚀", "?", *long_sentences(6, 120)]
    fp32 = encoder_for(Strategy(model=tiny_model, backend="onnx")).embed(texts)
    for name in ("vnni", "avx2"):
        on_cpu(monkeypatch, name)
        encoder = encoder_for(Strategy(model=tiny_model, backend="onnx-int8"))
        assert not encoder.network.per_text  # batches, not one call a text
        together = encoder.embed(texts)
        alone = np.vstack([encoder.embed([t]) for t in texts])
        assert np.abs(together - alone).max() <= 1e-6, name
        cosines = (together * fp32).sum(axis=1)
        assert cosines.min() >= 0.99, (name, cosines)
        assert np.abs(together - fp32).max() > 1e-4  # quantised: more than float error apart


def test_an_int8_graph_exported_before_per_token_scales_runs_one_text_a_call(tiny_model, tmp_path):
    """An older index holds an int8 graph with one scale per input tensor: it must run each text
    alone, as its vectors were made (no per-token metadata on the graph says which it is)."""
    from indexer.encoders.onnx_graph import OnnxGraph

    new = graph_spec(encoder_for(Strategy(model=tiny_model, backend="onnx-int8")).strategy)
    old = graph_spec(encoder_for(Strategy(model=tiny_model, backend="onnx")).strategy)  # no metadata
    held = tmp_path / "held"
    held.mkdir()
    shutil.copy(old.path, held / "old.onnx")
    shutil.copy(old.weights, held / old.weights.name)
    assert not OnnxGraph(new).per_text
    assert OnnxGraph(replace(new, home=held, held_key="old")).per_text
