"""ONNX Runtime is the default indexing backend (goal 2 of issue 9), and nothing built before it
breaks: torch and onnx are one strategy (the same fp32 vectors), so an index built on torch takes
a default add and a default query and ranks as an onnx index does; a model the exporter fails on
is indexed on torch, and the build says so."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from indexer import Strategy, build_index
from indexer.encoders.factory import encoder_for
from indexer.errors import SemsearchError, StrategyConflict
from indexer.reading.corpus import read_corpus
from indexer.store import open_index
from indexer.writing.shards import embed_shard, merge_shards
from search import SearchEngine
from search.cli import cli
from search.read.engine import check_strategy
from search.read.info import index_info
from tests.helpers import DATA, random_bert, real_sentences, torch_reference, write_csv

pytest.importorskip("onnxruntime")


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path_factory.getbasetemp() / "onnx-cache"))


def semsearch(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "search.cli", *map(str, args)], capture_output=True, text=True, timeout=300
    )


def test_torch_and_onnx_are_one_strategy_and_int8_another():
    onnx, torch = Strategy(), Strategy(backend="torch")
    assert onnx.backend == "onnx"
    assert onnx.differences(torch) == [] and torch.differences(onnx) == []
    assert Strategy(backend="onnx-int8").differences(torch) == ["backend"]
    assert Strategy(backend="onnx-int8").differences(onnx) == ["backend"]
    assert "backend" not in onnx.describe() and "backend=torch" in torch.describe()


@pytest.mark.slow
def test_an_old_torch_index_takes_a_default_add_and_query_and_ranks_as_a_new_one(tmp_path):
    sentences = list(dict.fromkeys(s.strip() for s in real_sentences()[:80] if s.strip()))
    rows = [(f"s{i}", text) for i, text in enumerate(sentences)]
    first = write_csv(tmp_path / "first.csv", rows[:50], ("id", "text"))
    more = write_csv(tmp_path / "more.csv", rows[50:], ("id", "text"))
    old, new = tmp_path / "old", tmp_path / "new"
    build_index(first, old, Strategy(backend="torch"))  # what every index was before
    build_index(first, new)
    assert open_index(old).strategy.backend == "torch"
    assert open_index(new).strategy.backend == "onnx"

    added = semsearch("add", old, more)  # a default add: the index's own strategy
    assert added.returncode == 0, added.stderr
    SearchEngine(old, strategy={"backend": "onnx"})  # the default backend of a torch index: no conflict
    answered = semsearch("query", old, sentences[60], "-k", "5", "--json")
    assert answered.returncode == 0, answered.stderr
    assert json.loads(answered.stdout)["hits"][0]["id"] == "s60"
    assert open_index(old).strategy.backend == "torch"
    from indexer.writing.update import add_to_index

    add_to_index(new, more)

    old_vectors, old_ids = open_index(old).vectors.stored()
    new_vectors, new_ids = open_index(new).vectors.stored()
    assert sorted(old_ids.tolist()) == sorted(new_ids.tolist())
    difference = old_vectors[np.argsort(old_ids)] - new_vectors[np.argsort(new_ids)]
    assert np.abs(difference).max() < 1e-5
    old_engine, new_engine = SearchEngine(old), SearchEngine(new)
    for question in [*sentences[::9], "how do I pay for a bike?"]:
        old_hits, new_hits = old_engine.search(question, k=5), new_engine.search(question, k=5)
        assert [h.id for h in old_hits] == [h.id for h in new_hits]
        np.testing.assert_allclose([h.score for h in old_hits], [h.score for h in new_hits], atol=1e-5)


@pytest.mark.slow
def test_asking_either_fp32_backend_of_either_index_is_accepted_int8_is_not(bundled):
    torch = bundled.strategy
    onnx = encoder_for(Strategy()).strategy
    assert torch.backend == "torch" and onnx.backend == "onnx"
    for stored in (torch, onnx):
        check_strategy(stored, {"backend": "torch"})
        check_strategy(stored, {"backend": "onnx", "pooling": "auto"})
        with pytest.raises(StrategyConflict, match="backend"):
            check_strategy(stored, {"backend": "onnx-int8"})


def test_sweeps_run_the_default_backend_on_one_torch_pass(tiny_model):
    embedder = torch_reference(Strategy(model=tiny_model), all_layers=True)
    assert embedder.strategy.backend == "onnx"
    assert len(embedder.network.model.encoder.layer) == 3  # every layer: one pass feeds the grid
    with pytest.raises(SemsearchError, match="sweeps"):
        torch_reference(Strategy(model=tiny_model, backend="onnx-int8"), all_layers=True)


@pytest.fixture
def unexportable(tmp_path, monkeypatch) -> str:
    """A model the ONNX exporter fails on (a model of its own: no graph of it is cached)."""
    import indexer.encoders.onnx_export

    def refuse(*args: object) -> None:
        raise RuntimeError("Exporting the operator 'aten::frobnicate' to ONNX is not supported")

    monkeypatch.setattr(indexer.encoders.onnx_export, "_export", refuse)
    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path / "cache"))
    return random_bert(tmp_path / "odd-model", seed=5)


@pytest.mark.parametrize("asked", [[], ["--backend", "onnx"]], ids=["default", "explicit-onnx"])
def test_an_unexportable_model_is_indexed_on_torch_and_the_build_says_so(unexportable, tmp_path, asked):
    texts = ["how do I pay?", "where do I park?", "the lock is broken"]
    corpus = write_csv(tmp_path / "c.csv", [(f"q{i}", t) for i, t in enumerate(texts)], ("id", "text"))
    result = CliRunner().invoke(
        cli, ["index", str(corpus), "-o", str(tmp_path / "idx"), "--model", unexportable, *asked]
    )
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if "exported to ONNX" in line]
    assert len(notes) == 1 and "aten::frobnicate" in notes[0], result.stderr
    index = open_index(tmp_path / "idx")
    assert index.strategy.backend == "torch"  # what embedded it
    assert index_info(index.path)["encoder"].startswith("torch (RuntimeError: Exporting the operator")
    vectors, ids = index.vectors.stored()
    reference = torch_reference(Strategy(model=unexportable, backend="torch")).embed(texts)
    assert np.abs(vectors[np.argsort(ids)] - reference).max() < 1e-6
    hits = SearchEngine(tmp_path / "idx").search("where do I park?", k=1)
    assert hits[0].id == "q1"


def test_an_unexportable_model_fails_clearly_on_int8(unexportable, tmp_path):
    corpus = write_csv(tmp_path / "c.csv", [("q1", "how do I pay?")], ("id", "text"))
    args = [
        "index",
        str(corpus),
        "-o",
        str(tmp_path / "idx"),
        "--model",
        unexportable,
        "--backend",
        "onnx-int8",
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "aten::frobnicate" in lines[0], lines
    assert "unexpected" not in lines[0]
    assert not (tmp_path / "idx").exists()


def test_shards_embedded_on_torch_and_on_onnx_merge_and_int8_ones_do_not(tmp_path, tiny_model):
    corpus = read_corpus(DATA / "demo_faq.csv", text_fields=["question"]).entries[:40]
    torch = embed_shard(corpus[::2], tmp_path / "torch", Strategy(model=tiny_model, backend="torch"))
    onnx = embed_shard(corpus[1::2], tmp_path / "onnx", Strategy(model=tiny_model))
    assert merge_shards([torch, onnx], tmp_path / "merged") == len(corpus)
    int8 = embed_shard(corpus[:3], tmp_path / "int8", Strategy(model=tiny_model, backend="onnx-int8"))
    with pytest.raises(SemsearchError, match="backend"):
        merge_shards([torch, int8], tmp_path / "refused")


def test_a_missing_model_path_is_a_clear_error_on_the_default_backend():
    """The onnx path reads the model's files before loading it: a path that is no model (nor a
    valid hub name) must still say so plainly, not fail inside huggingface_hub."""
    with pytest.raises(SemsearchError, match="cannot load model"):
        encoder_for(Strategy(model="/no/such/model"))
