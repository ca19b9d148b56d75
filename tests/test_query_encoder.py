"""The torch-free read path: a query vector from ONNX Runtime + tokenizers equals the torch vector
of the same strategy, and answering a question imports neither torch nor transformers."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from indexer import Strategy, build_index
from indexer.embedding.graphs import graph_spec
from indexer.encoders.factory import encoder_for, encoder_status
from indexer.encoders.onnx_encoder import OnnxEncoder
from indexer.encoders.torch_encoder import TorchEncoder
from search.read.info import index_info
from tests.helpers import ROOT, graph_encoder, random_bert, shared_file, torch_reference

pytest.importorskip("onnxruntime")

ODD = ["naïve café — 東京 🚀", "x" * 5000, "\u200ba\u0301", "word " * 600, "?"]
"""Odd texts the product embeds (a text with nothing a model reads is refused: tests/test_encoders.py)."""


def stsb_sample(n: int = 200) -> list[str]:
    with shared_file("stsb", "stsb-dev.tsv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    sentences = [r["sentence1"] for r in rows] + [r["sentence2"] for r in rows]
    return sentences[:: max(1, len(sentences) // n)][:n]


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path_factory.getbasetemp() / "onnx-cache"))


def torch_free(strategy: Strategy) -> tuple[TorchEncoder, OnnxEncoder]:
    """The strategy on torch (the reference) and on the torch-free encoder of the same index."""
    embedder = torch_reference(replace(strategy, backend="torch"))
    assert embedder.export_for_queries() is None
    return embedder, graph_encoder(embedder.strategy)


def assert_same(reference: np.ndarray, vectors: np.ndarray) -> None:
    assert reference.shape == vectors.shape
    cosines = (reference * vectors).sum(1) / (
        np.linalg.norm(reference, axis=1) * np.linalg.norm(vectors, axis=1)
    )
    assert cosines.min() >= 0.9999, cosines.min()


GRID = (
    [
        {"pooling": pooling, "layers": layers}
        for pooling in ("cls", "mean", "max", "mean-max")
        for layers in ((-1,), (-2,), (0,))
    ]
    + [
        {"pooling": "mean", "layers": (-4, -3, -2, -1), "combine": combine}
        for combine in ("sum", "mean", "concat")
    ]
    + [
        {"pooling": "max", "layers": (-4, -3, -2, -1), "combine": "concat"},
        {"pooling": "mean", "layers": (-2,), "skip_special": True},
        {"pooling": "cls", "layers": (-1,), "skip_special": True},
        {"pooling": "mean-max", "layers": (-1,), "skip_special": True, "normalize": False},
        {"pooling": "pooler"},
    ]
)


@pytest.mark.parametrize("fields", GRID, ids=lambda f: json.dumps(f, sort_keys=True))
def test_every_strategy_matches_torch_on_the_tiny_model(tiny_model, fields):
    embedder, encoder = torch_free(Strategy(model=tiny_model, **fields))
    sentences = stsb_sample() + ODD
    assert_same(embedder.embed(sentences), encoder.embed(sentences))


@pytest.mark.slow
def test_default_strategy_matches_torch_on_the_bundled_model(bundled):
    _, encoder = torch_free(Strategy())
    sentences = stsb_sample() + ODD
    assert_same(bundled.embed(sentences), encoder.embed(sentences))


@pytest.mark.slow
def test_token_ids_match_the_transformers_tokenizer(bundled):
    assert bundled.export_for_queries() is None
    encoder = graph_encoder(bundled.strategy, graph_spec(bundled.strategy))
    texts = stsb_sample(50) + ODD
    expected = bundled.tokenizer(
        texts,
        truncation=True,
        max_length=bundled.strategy.max_length,
        return_attention_mask=False,
        return_token_type_ids=False,
    )["input_ids"]
    assert encoder.tokens.ids(texts) == bundled.tokens.ids(texts) == expected
    assert encoder.tokens.special_ids == bundled.tokens.special_ids == [101, 102]


@pytest.mark.slow
def test_no_texts_give_no_vectors(bundled):
    _, encoder = torch_free(Strategy())
    assert encoder.embed([]).shape == (0, bundled.dimension)


def test_unexported_graph_is_reported_and_exported_on_first_use(tiny_model):
    strategy = encoder_for(Strategy(model=tiny_model, layers=(1,), pooling="mean", backend="torch")).strategy
    assert encoder_status(strategy).startswith("onnx (graph not exported")
    encoder = encoder_for(strategy, queries=True)
    assert isinstance(encoder, OnnxEncoder) and encoder.decision.why.startswith("its graph was exported now")
    assert encoder_status(strategy) == "onnx"


def test_exported_weights_lie_beside_the_graph_for_onnx_runtime_to_map(tiny_model):
    """The graph file holds no weights (ONNX Runtime maps them from ``<graph>.data`` rather than
    parse and copy them out of the protobuf: most of a session's start-up); a graph whose weights
    are missing counts as not exported, so it is exported again rather than failing a query."""
    embedder, encoder = torch_free(Strategy(model=tiny_model, layers=(2,), pooling="mean"))
    spec = graph_spec(encoder.strategy)
    assert spec.weights.stat().st_size > 20 * spec.path.stat().st_size
    sentences = stsb_sample(20)
    assert_same(embedder.embed(sentences), encoder.embed(sentences))
    spec.weights.unlink()
    assert encoder_status(encoder.strategy).startswith("onnx (graph not exported")
    assert embedder.export_for_queries() is None and spec.exported
    assert_same(embedder.embed(sentences), graph_encoder(encoder.strategy).embed(sentences))


def test_a_failed_export_falls_back_to_torch_and_says_why(tiny_model):
    strategy = encoder_for(Strategy(model=tiny_model, layers=(1, 3), pooling="cls", backend="torch")).strategy
    spec = graph_spec(strategy)
    spec.failure.parent.mkdir(parents=True, exist_ok=True)
    spec.failure.write_text("ExportError: unsupported operator\n", encoding="utf-8")
    encoder = encoder_for(strategy, queries=True)
    assert isinstance(encoder, TorchEncoder)
    assert encoder.decision.status == encoder_status(strategy) == "torch (ExportError: unsupported operator)"


HEAVY = ("torch", "transformers", "sentence_transformers")


def imported_after(code: str, cache: str) -> set[str]:
    """The heavy modules a fresh interpreter holds after running ``code``."""
    probe = f"{code}\nimport sys, json; print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "SEMSEARCH_CACHE": cache},
        check=True,
    )
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def small_index(tmp_path_factory):
    cache = str(tmp_path_factory.getbasetemp() / "onnx-cache")
    root = tmp_path_factory.mktemp("read-path")
    corpus = root / "c.txt"
    corpus.write_text("\n".join(stsb_sample(60)), encoding="utf-8")
    os.environ["SEMSEARCH_CACHE"] = cache
    try:
        build_index(corpus, root / "idx")
    finally:
        del os.environ["SEMSEARCH_CACHE"]
    return root / "idx", cache


@pytest.mark.slow
def test_search_engine_imports_no_torch(small_index):
    index, cache = small_index
    code = (
        "from search.read.engine import SearchEngine\n"
        f"hits = SearchEngine({str(index)!r}).search('a man is playing a guitar', k=3)\n"
        "assert len(hits) == 3"
    )
    assert imported_after(code, cache) == set()


@pytest.mark.slow
def test_query_info_and_help_import_no_torch(small_index):
    index, cache = small_index
    for argv in (["query", str(index), "a child rides a horse", "-k", "2"], ["info", str(index)], ["--help"]):
        code = (
            "import sys\nfrom search.cli import main\n"
            f"sys.argv = ['semsearch', *{argv!r}]\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code"
        )
        assert imported_after(code, cache) == set(), argv


@pytest.mark.slow
def test_info_names_the_encoder(small_index):
    from search.read.engine import SearchEngine

    index, _ = small_index  # the autouse fixture points at the same cache
    assert index_info(index)["encoder"] == "onnx"
    assert SearchEngine(index).snapshot.info()["encoder"] == "onnx"


@pytest.mark.slow
def test_serve_imports_no_torch_up_to_its_first_answer(small_index):
    """`semsearch serve` as run from the shell (the engine loading in its thread while the web stack
    imports), its uvicorn swapped for a client that asks one question."""
    pytest.importorskip("fastapi")
    index, cache = small_index
    code = (
        "import sys, uvicorn\nfrom fastapi.testclient import TestClient\n"
        "def answer_once(server, sockets):\n"
        "    assert [s.getsockname()[0] for s in sockets] == ['127.0.0.1']\n"
        "    with TestClient(server.config.app, base_url='http://127.0.0.1') as client:\n"
        "        found = client.post('/search', json={'query': 'a man plays guitar', 'k': 2})\n"
        "        assert found.status_code == 200 and len(found.json()['hits']) == 2, found.text\n"
        "uvicorn.Server.run = answer_once\nfrom search.cli import main\n"
        "import socket\nfree = socket.socket()\nfree.bind(('127.0.0.1', 0))\n"  # `serve` binds for real
        f"sys.argv = ['semsearch', 'serve', {str(index)!r}, '--port', str(free.getsockname()[1])]\n"
        "free.close()\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code"
    )
    assert imported_after(code, cache) == set()


def test_graph_cache_follows_the_model_fingerprint_not_its_path(tiny_model, tmp_path):
    """A model copied elsewhere reuses its exported graph; a model changed in place gets a new one."""
    import shutil

    strategy = encoder_for(Strategy(model=tiny_model, layers=(2,), pooling="mean")).strategy
    copy = tmp_path / "copied-model"
    shutil.copytree(tiny_model, copy)
    moved = Strategy(**{**strategy.to_dict(), "model": str(copy)})
    assert graph_spec(moved).path == graph_spec(strategy).path
    random_bert(copy, seed=1)  # same files, other weights: in place
    assert graph_spec(moved).path != graph_spec(strategy).path
