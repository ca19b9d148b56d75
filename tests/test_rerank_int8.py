"""A reranker on ``onnx-int8``: its fp32 classifier graph rewritten by the int8 rewrite sentence
encoders' graphs get (an activation scale per token), cached per CPU int8 format; a pair's score
does not depend on the pairs batched with it, and stays near the fp32 score."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pytest

from indexer.embedding import graphs
from indexer.embedding.cross_folder import cross_graph, read_cross_folder
from indexer.embedding.graphs import INT8_FORMATS, PER_TOKEN
from indexer.encoders.options import EmbeddingOptions
from indexer.encoders.rerankers import reranker_for
from tests.helpers import random_cross_encoder

pytest.importorskip("onnxruntime")

QUESTION = "how do I reset my password"
TEXTS = [
    "open the settings page and choose reset password",
    "x",
    "the bike station near the river has a broken lock and a map of the town, open all night",
    "passwords are reset from the account page",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny random reranker whose score is its logit (no sigmoid to flatten differences)."""
    return random_cross_encoder(tmp_path_factory.mktemp("int8-reranker"), "bert", "identity")


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """One cache for the module (each graph made once), none of the user's."""
    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path_factory.getbasetemp() / "int8-reranker-cache"))


def int8(path: str, **options: object) -> Callable[..., np.ndarray]:
    found = reranker_for(path, EmbeddingOptions(device="cpu", **options), runtime="onnx-int8")  # type: ignore[arg-type]
    assert found.runtime == "onnx-int8"
    return found.score


def test_an_int8_pair_scores_the_same_alone_and_in_a_padded_batch(folder):
    together = int8(folder, batch_size=32)(QUESTION, TEXTS)  # one padded batch of every length
    alone = np.concatenate([int8(folder, batch_size=1)(QUESTION, [text]) for text in TEXTS])
    np.testing.assert_allclose(together, alone, rtol=0, atol=1e-6)


def test_int8_scores_are_near_fp32_and_quantised(folder):
    fp32 = reranker_for(folder, EmbeddingOptions(device="cpu"), runtime="onnx").score(QUESTION, TEXTS)
    scores = int8(folder)(QUESTION, TEXTS)
    spread = fp32.max() - fp32.min()
    # This random network's weights are 0.5 wide, int8's worst case: over seeds 0-3 the largest
    # error is 2-11% of the scores' spread (a trained reranker's is far less); the order is kept.
    assert np.abs(scores - fp32).max() <= 0.15 * spread, (scores, fp32)
    assert np.abs(scores - fp32).max() > 1e-5  # int8, not the fp32 graph again
    assert np.array_equal(np.argsort(scores), np.argsort(fp32))


def test_the_int8_graph_is_the_encoders_rewrite_of_the_fp32_graph(folder, monkeypatch, tmp_path):
    """Made from the cached fp32 export (the exporter is not run again) by the per-token rewrite,
    cached under a key of its own, then loaded as cached."""
    import onnx

    from indexer.encoders import cross_export

    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path / "cache"))
    reranker_for(folder, EmbeddingOptions(device="cpu"), runtime="onnx")  # the fp32 graph only

    def refuse(*_: object) -> None:
        raise AssertionError("the classifier was exported again")

    monkeypatch.setattr(cross_export, "export_classifier", refuse)
    made = reranker_for(folder, EmbeddingOptions(device="cpu"), runtime="onnx-int8")
    assert made.why == "its graph was exported now (cached for the next time)"
    spec = cross_graph(read_cross_folder(folder), int8=True)
    assert spec.exported and spec.key() != cross_graph(read_cross_folder(folder)).key()
    graph = onnx.load(str(spec.path), load_external_data=False)
    assert {p.key: p.value for p in graph.metadata_props}.items() >= PER_TOKEN.items()
    assert "MatMulInteger" in {node.op_type for node in graph.graph.node}
    again = reranker_for(folder, EmbeddingOptions(device="cpu"), runtime="onnx-int8")
    assert (again.runtime, again.why) == ("onnx-int8", "its graph is cached")


def test_an_int8_graph_is_keyed_by_the_cpus_int8_format(folder, monkeypatch):
    cross = read_cross_folder(folder)
    keys = set()
    for name in INT8_FORMATS:
        monkeypatch.setattr(graphs, "int8_format", lambda name=name: INT8_FORMATS[name])
        spec = cross_graph(cross, int8=True)
        assert spec.int8 == name
        keys.add(spec.key())
    assert len(keys) == len(INT8_FORMATS) and cross_graph(cross).key() not in keys


def test_where_no_graph_can_be_had_int8_runs_on_torch_saying_why(folder, monkeypatch, tmp_path):
    from indexer.encoders import cross_export

    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path / "cache"))

    def refuse(*_: object) -> None:
        raise RuntimeError("an operator ONNX has not")

    monkeypatch.setattr(cross_export, "export_classifier", refuse)
    reranker = reranker_for(folder, EmbeddingOptions(device="cpu"), runtime="onnx-int8")
    assert reranker.runtime == "torch" and "an operator ONNX has not" in reranker.why


@pytest.mark.slow
def test_a_cached_int8_graph_runs_without_torch(folder):
    first = reranker_for(folder, EmbeddingOptions(device="cpu"), runtime="onnx-int8")
    script = (
        "import sys, json\n"
        "from indexer.encoders.rerankers import reranker_for\n"
        f"r = reranker_for({folder!r}, runtime='onnx-int8')\n"
        "print(json.dumps([r.runtime, 'torch' in sys.modules, r.score('q', ['a', 'b c']).tolist()]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    runtime, imported, scores = json.loads(done.stdout.strip().splitlines()[-1])
    assert (runtime, imported) == ("onnx-int8", False)
    np.testing.assert_allclose(scores, first.score("q", ["a", "b c"]), atol=1e-6)


def test_rerank_on_onnx_int8_from_the_cli_scores_as_the_library_does(folder, tmp_path):
    """``semsearch rerank --backend onnx-int8``: the int8 reranker's scores, best first."""
    from click.testing import CliRunner

    from search.cli import cli

    lines = tmp_path / "texts.txt"
    lines.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    args = ["rerank", QUESTION, str(lines), "--model", folder, "--backend", "onnx-int8", "--json"]
    result = CliRunner().invoke(cli, [*args, "--device", "cpu"])
    assert result.exit_code == 0, result.output
    expected = int8(folder)(QUESTION, TEXTS)
    hits = json.loads(result.stdout)["hits"]
    assert [int(h["id"]) - 1 for h in hits] == np.argsort(-expected, kind="stable").tolist()
    np.testing.assert_allclose([h["score"] for h in hits], np.sort(expected)[::-1], atol=1e-6)
