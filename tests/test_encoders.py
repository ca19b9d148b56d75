"""The encoder seam (``indexer.encoders``): torch and onnxruntime are imported by that package
alone, one factory picks the encoder a strategy needs and says why, and ONNX Runtime's execution
provider is the caller's choice."""

from __future__ import annotations

import numpy as np
import pytest

from indexer.embedding.strategy import BACKENDS, RUNTIME, Strategy
from indexer.encoders.devices import Placement
from indexer.encoders.factory import ASKED, EXPORTED, RUNTIMES, encoder_for, runtime
from indexer.encoders.onnx_encoder import OnnxEncoder
from indexer.encoders.onnx_graph import CPU
from indexer.encoders.options import EmbeddingOptions
from indexer.encoders.torch_encoder import TorchEncoder
from indexer.errors import BadInput
from tests.helpers import ROOT, heavy_imports, random_bert

PACKAGE = ROOT / "indexer" / "encoders"
HEAVY = ("torch", "onnxruntime")


def test_torch_and_onnxruntime_are_imported_only_by_the_encoder_package():
    outside = [
        path
        for folder in ("indexer", "search")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if PACKAGE not in path.parents
    ]
    assert outside and [hit for path in outside for hit in heavy_imports(path, HEAVY)] == []
    inside = [hit for path in sorted(PACKAGE.glob("*.py")) for hit in heavy_imports(path, HEAVY)]
    assert any(hit.endswith(" torch") for hit in inside)  # the scan sees what it looks for
    assert any(hit.endswith(" onnxruntime") for hit in inside)


def test_every_backend_a_strategy_names_has_an_encoder():
    assert set(RUNTIMES) == {RUNTIME[backend] for backend in BACKENDS}
    assert all(runtime(RUNTIME[backend]).__name__.endswith("Encoder") for backend in BACKENDS)


@pytest.fixture(autouse=True)
def shared_cache(tmp_path_factory, monkeypatch):
    """The module's cache: a test that only runs a graph takes the one an earlier test exported."""
    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path_factory.getbasetemp() / "encoders-cache"))


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """A cache of this test's own: nothing is exported before it asks."""
    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path / "cache"))


def test_the_factory_picks_by_strategy_and_says_why(tiny_model, private_cache):
    torch = encoder_for(Strategy(model=tiny_model, backend="torch"))
    assert isinstance(torch, TorchEncoder)
    assert (torch.decision.runtime, torch.decision.why) == ("torch", ASKED)
    assert torch.decision.placement == Placement("cpu", "fp32") and torch.decision.ray is None

    first = encoder_for(Strategy(model=tiny_model))  # nothing exported: torch exports, ONNX Runtime runs
    assert isinstance(first, OnnxEncoder)
    assert (first.decision.runtime, first.decision.why) == ("onnx", EXPORTED)
    assert first.decision.provider == CPU
    cached = encoder_for(Strategy(model=tiny_model))
    assert isinstance(cached, OnnxEncoder) and cached.decision.why == "its graph is cached"
    assert first.strategy == cached.strategy and first.strategy.backend == "onnx"

    int8 = encoder_for(Strategy(model=tiny_model, backend="onnx-int8"))
    assert isinstance(int8, OnnxEncoder) and int8.decision.why == EXPORTED
    assert int8.decision.placement == Placement("cpu", "int8")
    assert int8.strategy.backend == "onnx-int8"  # its own int8 graph, a scale per token:
    assert not int8.network.per_text  # batched as fp32 is (the same vector alone or in a batch)

    texts = ["how do I pay?", "where do I park my bike?"]
    np.testing.assert_allclose(first.embed(texts), torch.embed(texts), atol=1e-5)
    assert not np.allclose(int8.embed(texts), torch.embed(texts), atol=1e-5)

    queries = encoder_for(torch.strategy, queries=True)  # a torch index's questions run its fp32 graph
    assert isinstance(queries, OnnxEncoder) and queries.decision.status == "onnx"
    assert queries.decision.why == "its graph is cached"  # the same graph the onnx encoders made


def test_a_build_knows_at_construction_if_its_queries_can_leave_torch(
    tiny_model, tmp_path, monkeypatch, private_cache
):
    """``export_queries``: the graph of a torch index's queries is exported with the encoder, and
    an export that fails is part of the choice (what the build reports), not set afterwards."""
    import indexer.encoders.onnx_export

    built = encoder_for(Strategy(model=tiny_model, backend="torch"), export_queries=True)
    assert isinstance(built, TorchEncoder) and built.decision.export_failure is None
    assert encoder_for(built.strategy, queries=True).decision.why == "its graph is cached"

    def refuse(*args: object) -> None:
        raise RuntimeError("Exporting the operator 'aten::frobnicate' to ONNX is not supported")

    monkeypatch.setattr(indexer.encoders.onnx_export, "_export", refuse)
    odd = random_bert(tmp_path / "odd-model", seed=7)
    fallback = encoder_for(Strategy(model=odd))
    assert isinstance(fallback, TorchEncoder) and fallback.strategy.backend == "torch"  # what embeds
    assert fallback.decision.export_failure.startswith("RuntimeError: Exporting the operator")
    assert fallback.decision.status == f"torch ({fallback.decision.export_failure})"
    with pytest.raises(BadInput, match="onnx-int8: this model cannot be exported"):
        encoder_for(Strategy(model=odd, backend="onnx-int8"))


def test_the_execution_provider_is_the_callers_choice(tiny_model):
    strategy = encoder_for(Strategy(model=tiny_model)).strategy
    default = encoder_for(strategy, queries=True)
    assert default.decision.provider == CPU and default.network.session.get_providers() == [CPU]
    with pytest.raises(BadInput, match="no execution provider 'NoSuchExecutionProvider'"):
        encoder_for(strategy, EmbeddingOptions(provider="NoSuchExecutionProvider"), queries=True)


def test_ray_is_one_more_runtime_the_decision_returns(tiny_model):
    from indexer.encoders.on_ray import RayEncoder

    here = encoder_for(Strategy(model=tiny_model))
    on_ray = encoder_for(here.strategy, EmbeddingOptions(ray="local", ray_workers=2))  # nothing starts yet
    assert isinstance(on_ray, RayEncoder) and callable(on_ray.embed_documents)
    assert (on_ray.decision.ray, on_ray.decision.workers) == ("local", 2)
    assert on_ray.decision.same_work(encoder_for(here.strategy).decision)  # what each worker runs
    assert on_ray.strategy == here.strategy


def test_a_text_that_tokenises_to_nothing_is_refused_by_every_encoder(tiny_model):
    """Only special tokens ([CLS] [SEP]) is no text: every such text would get the same vector."""
    for backend in ("torch", "onnx"):
        encoder = encoder_for(Strategy(model=tiny_model, backend=backend))
        for texts in (["a bike", "\u0301"], ["\u200b"]):
            with pytest.raises(BadInput, match="no tokens"):
                encoder.embed(texts)
            with pytest.raises(BadInput, match="no tokens"):
                encoder.embed_documents(texts)
        assert encoder.embed(["a\u200bb"]).shape == (1, 32)


def test_a_long_text_is_cut_before_tokenising_with_the_same_tokens(tiny_model):
    """Only the first max_length tokens are read, so a long line is cut (at a space) before the
    tokenizer sees it: the ids are those of the whole text truncated, as before."""
    encoder = encoder_for(Strategy(model=tiny_model, backend="torch", max_length=64))
    whole = encoder.tokens.truncating
    words = " ".join(f"word{i % 97} and-some punctuation!" for i in range(4000))  # 120,000 characters
    spaced = "start " + " " * 5000 + words  # mostly whitespace where a cut would fall: read further
    for text in (words, spaced, "x" * 50000, words.replace(" ", "\u200b ")):
        assert encoder.tokens.ids([text]) == [whole.encode(text).ids]
    np.testing.assert_allclose(encoder.embed([words]), encoder.embed([words[:20000]]), atol=1e-6)


@pytest.mark.slow
def test_memory_stays_flat_whatever_a_line_s_length(tmp_path, tiny_model):
    """Tokenising 4 MB lines costs little more than a short one (the tokenizer's memory is
    native, so it is the process's peak resident size that is measured)."""
    import subprocess
    import sys

    for chunked in ("None", "16"):  # truncated, and cut into windows (every window is kept)
        script = f"""
import resource, sys
from indexer.encoders.tokens import TextTokenizer
from indexer.embedding.strategy import Strategy
strategy = Strategy(model={tiny_model!r}, max_length=128, chunk_overlap={chunked})
tokens = TextTokenizer.from_files({tiny_model!r}, strategy)
line = " ".join(f"word{{i}}" for i in range(500000))
tokens.documents(["warm up"])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for _ in range(5):
    tokens.documents([line, line])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        assert int(done.stdout) < 100_000, f"{int(done.stdout) // 1024} MB more for 4 MB lines ({chunked})"


def test_a_long_document_is_windowed_as_the_tokenizer_windows_it_whole():
    """Past its character bound a document is tokenised in pieces and windowed by semsearch: the
    windows equal those ``tokenizers`` makes of the whole text, for any length and overlap."""
    import random

    from indexer.embedding.models import model_location
    from indexer.encoders.tokens import CHARS_PER_TOKEN, TextTokenizer

    random.seed(0)
    words = ["naïve", "café", "東京", "bike", "E3453C,", "docking-station", "(the)", "won't", "🚀", "x" * 50]
    location = model_location(Strategy().model)
    for max_length, overlap in [(16, 4), (32, 0), (64, 31)]:
        tokens = TextTokenizer.from_files(location, Strategy(max_length=max_length, chunk_overlap=overlap))
        for count in (max_length * CHARS_PER_TOKEN // 5, 3000):
            text = " ".join(random.choice(words) for _ in range(count))
            assert len(text) > max_length * CHARS_PER_TOKEN  # the piecewise path
            whole = tokens.windows.encode(text)
            got = tokens.documents(["a short one", text])
            assert got.ids[1:] == [e.ids for e in (whole, *whole.overflowing)]
            assert got.owners.tolist() == [0] + [1] * (len(got.ids) - 1)
