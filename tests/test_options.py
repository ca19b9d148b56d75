"""One ``EmbeddingOptions`` travels from the caller to the factory: no library function takes a
device, precision, batch size or Ray address of its own; no options and the default options mean
the same (``auto``, resolved where it is used); the CLI builds the options once for a command."""

from __future__ import annotations

import inspect

import pytest
from click.testing import CliRunner

from indexer.embedding.strategy import Strategy
from indexer.encoders import devices
from indexer.encoders.devices import Placement, placement
from indexer.encoders.factory import decide
from indexer.encoders.options import EmbeddingOptions, given
from indexer.errors import BadInput

LOOSE = {"device", "precision", "batch_size", "ray", "ray_workers", "provider"}


@pytest.fixture
def one_gpu(monkeypatch):
    """This machine as one with a CUDA GPU torch sees (nothing is run on it)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(devices, "_driver_present", lambda: True)
    monkeypatch.setattr(devices, "_cuda_count", lambda: 1)


def test_no_options_and_the_default_options_both_mean_auto(one_gpu):
    gpu = Placement("cuda:0", "fp16")
    assert placement(None, None) == gpu
    assert given(None) == EmbeddingOptions()
    assert EmbeddingOptions().placement == gpu
    on_gpu = decide(Strategy(), None)  # a GPU decision loads nothing
    assert (on_gpu.runtime, on_gpu.placement) == ("torch", gpu)
    assert decide(Strategy(), EmbeddingOptions()) == on_gpu
    # a server's queries: auto is the CPU, unless a GPU is named
    assert EmbeddingOptions().for_serving().placement == Placement("cpu", "fp32")
    assert EmbeddingOptions(device="cuda").for_serving().placement == gpu


def test_options_say_what_is_wrong_before_anything_loads():
    with pytest.raises(BadInput, match="--batch-size must be at least 1"):
        EmbeddingOptions(batch_size=0)
    with pytest.raises(BadInput, match="Ray workers must be at least 1"):
        EmbeddingOptions(ray="local", ray_workers=0)
    with pytest.raises(BadInput, match="--device: give auto, cpu, cuda or cuda:N"):
        EmbeddingOptions(device="gpu")
    with pytest.raises(BadInput, match="runs on a GPU only"):
        EmbeddingOptions(device="cpu", precision="fp16").checked()


def test_library_functions_take_one_options_object():
    from indexer.writing.build import build_index
    from indexer.writing.update import add_to_index
    from search.read.encoding import Encoding
    from search.read.engine import SearchEngine
    from search.read.loading import load_engine
    from search.studies.evaluate import evaluate_retrieval, evaluate_sts
    from search.studies.sweep import _embed_grid, retrieval_sweep, sweep_sts
    from search.studies.tuning import tune

    functions = [build_index, add_to_index, evaluate_sts, evaluate_retrieval, sweep_sts, retrieval_sweep]
    functions += [_embed_grid, Encoding.load, SearchEngine.__init__, load_engine]
    for function in functions:
        parameters = inspect.signature(function).parameters
        assert not LOOSE & set(parameters), function.__qualname__
        assert "options" in parameters, function.__qualname__
    # tune's batch_size is pairs per training step, not texts per forward pass
    assert not (LOOSE - {"batch_size"}) & set(inspect.signature(tune).parameters)


def test_a_command_builds_the_options_once_from_its_flags(monkeypatch, tmp_path):
    import indexer.writing.build
    from search.cli import cli

    seen = {}

    def build_index(*args, **kwargs):
        seen.update(kwargs)
        raise BadInput("stop here")

    monkeypatch.setattr(indexer.writing.build, "build_index", build_index)
    corpus = tmp_path / "c.txt"
    corpus.write_text("a bike\n")
    flags = ["--device", "cpu", "--precision", "fp32", "--batch-size", "7", "--ray", "--ray-workers", "2"]
    result = CliRunner().invoke(cli, ["index", str(corpus), "-o", str(tmp_path / "i"), *flags])
    assert "stop here" in result.output and result.exit_code == 1
    assert seen["options"] == EmbeddingOptions("cpu", "fp32", batch_size=7, ray="local", ray_workers=2)
    assert not LOOSE & set(seen)
