"""The registry of a model folder's module kinds (``indexer.embedding.modules.base.KINDS``): a kind
is one class and one registry line, read by the folder's walk and run by the head."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from indexer.embedding.folder import read_folder
from indexer.embedding.head import Head, NetworkOutput
from indexer.embedding.modules.base import KINDS, Fileless, Graph
from indexer.embedding.strategy import Strategy


class Negate(Fileless):
    """A kind of the test's own: after pooling, each vector turned round."""

    word: ClassVar[str | None] = "negate"

    def __call__(self, vectors: Any) -> Any:
        return -vectors

    def export(self, graph: Graph, vectors: str) -> str:
        return graph.op("Neg", [vectors])


def _folder(root: Path) -> str:
    """A folder whose modules.json puts a Negate module after its mean pooling."""
    listed = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Negate", "type": "sentence_transformers.models.Negate"},
    ]
    (root / "1_Pooling").mkdir(parents=True)
    (root / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "mean"}))
    (root / "modules.json").write_text(json.dumps(listed))
    return str(root)


def test_a_kind_registered_in_one_line_is_read_from_the_folder_and_run_by_the_head(tmp_path, monkeypatch):
    folder = _folder(tmp_path / "model")
    unknown = read_folder(folder).refused
    assert (
        unknown
        == "module 2_Negate (sentence_transformers.models.Negate) is a module semsearch cannot reproduce"
    )
    monkeypatch.setitem(KINDS, "Negate", f"{__name__}:Negate")
    says = read_folder(folder)
    assert (says.refused, says.pooling, says.modules, says.said) == (
        None,
        "mean",
        ("negate",),
        ("pooling mean", "negate"),
    )
    strategy = Strategy(model=folder).resolve(num_layers=2, model_limit=64, folder=says)
    assert Strategy.from_dict(strategy.to_dict()).modules == ("negate",)  # stored by its word
    rng = np.random.default_rng(0)
    output = NetworkOutput([rng.standard_normal((2, 5, 8)).astype(np.float32) for _ in range(3)])
    ids, attention = np.ones((2, 5), np.int64), np.array([[1] * 5, [1, 1, 1, 0, 0]], np.int64)
    turned = Head(strategy, 2, [], folder)(output, ids, attention)
    plain = Head(replace(strategy, modules=()), 2, [])(output, ids, attention)
    assert np.abs(plain).max() > 0.1
    np.testing.assert_allclose(turned, -plain, rtol=1e-6)


def test_a_normalize_module_listed_again_is_read_as_sentence_transformers_runs_it(tmp_path):
    """sentence-transformers runs each Normalize listed; a unit vector normalised again is the
    same vector, so three read as the one the strategy applies at the end."""
    folder = Path(_folder(tmp_path / "model"))
    listed = json.loads((folder / "modules.json").read_text())[:2]
    normalize = {"name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
    (folder / "modules.json").write_text(json.dumps([*listed, normalize, normalize, normalize]))
    says = read_folder(str(folder))
    assert (says.refused, says.pooling, says.modules) == (None, "mean", ())


def _dense_files(folder: Path, weight: np.ndarray) -> None:
    """A Dense module's files as sentence-transformers saves them: its config and its weights."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True)
    out, width = weight.shape
    said = {"in_features": width, "out_features": out, "bias": False, "activation_function": "torch.nn.Tanh"}
    (folder / "config.json").write_text(json.dumps(said))
    save_file({"linear.weight": weight}, str(folder / "model.safetensors"))


def test_a_module_folder_of_any_name_is_fingerprinted_with_its_files(tmp_path, monkeypatch):
    """sentence-transformers names a module's folder as it likes (``2_Dense_1024``): what decides
    the vectors is fingerprinted by the kind modules.json names, not by a folder's name."""
    from indexer.embedding.fingerprints import file_hashes, model_fingerprint

    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path / "cache"))
    folder = Path(_folder(tmp_path / "model"))
    (folder / "config.json").write_text("{}")
    listed = json.loads((folder / "modules.json").read_text())[:2]
    dense = {"idx": 2, "name": "2", "path": "2_Dense_1024", "type": "sentence_transformers.models.Dense"}
    (folder / "modules.json").write_text(json.dumps([*listed, dense]))
    _dense_files(folder / "2_Dense_1024", np.ones((4, 8), np.float32))
    assert {"2_Dense_1024/config.json", "2_Dense_1024/model.safetensors"} <= set(file_hashes(folder))
    before = model_fingerprint(folder)
    (folder / "2_Dense_1024" / "model.safetensors").unlink()
    _dense_files(folder / "other", np.full((4, 8), 2, np.float32))
    (folder / "other" / "model.safetensors").rename(folder / "2_Dense_1024" / "model.safetensors")
    assert model_fingerprint(folder) != before


def _layer_norm_model(network: str, target: Path) -> str:
    """``network`` saved by sentence-transformers with mean pooling, a trained-looking LayerNorm
    (random scale and shift) and Normalize."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.normalize import Normalize
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sentence_transformer.modules.layer_norm import LayerNorm
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling

    torch.manual_seed(2)
    first = Transformer(network, max_seq_length=64)
    norm = LayerNorm(32)
    with torch.no_grad():
        norm.norm.weight.uniform_(0.5, 2.0)
        norm.norm.bias.normal_()
    modules = [first, Pooling(32, pooling_mode="mean"), norm, Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(target))
    return str(target)


TEXTS = ["the bike station near the river", "a broken lock", "billing questions about the app"]


def test_a_layer_norm_module_is_read_by_its_type_as_sentence_transformers_runs_it(tmp_path, monkeypatch):
    """A kind with files of its own (LayerNorm's scale and shift) is one file and one registry
    line: read by the type modules.json names, run on both runtimes and from the files an index
    holds, as sentence-transformers runs the folder."""
    from sentence_transformers import SentenceTransformer

    from indexer.embedding.modules.base import after_pooling, held_files
    from indexer.encoders.factory import encoder_for
    from tests.helpers import random_bert

    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path / "cache"))
    folder = _layer_norm_model(random_bert(tmp_path / "network", layers=2), tmp_path / "model")
    assert "LayerNorm" in json.loads((Path(folder) / "modules.json").read_text())[2]["type"]
    expected = SentenceTransformer(folder, device="cpu").encode(TEXTS, normalize_embeddings=True)
    for backend in ("torch", "onnx"):
        encoder = encoder_for(Strategy(model=folder, backend=backend))
        assert encoder.strategy.modules == ("2_LayerNorm",), encoder.strategy.modules
        np.testing.assert_allclose(encoder.embed(TEXTS), expected, atol=1e-5)
    held = tmp_path / "held"  # an index version holds the module's files under names of its own
    held.mkdir()
    for source, name in held_files(folder, ("2_LayerNorm",)):
        (held / name).write_bytes(source.read_bytes())
    vectors = np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)
    (own,), (kept,) = after_pooling(folder, ("2_LayerNorm",)), after_pooling(str(held), ("2_LayerNorm",))
    assert type(own).__name__ == type(kept).__name__ == "LayerNorm"
    np.testing.assert_allclose(kept(vectors), own(vectors), rtol=1e-6)


def test_modules_saved_by_their_own_save_are_read_by_sentence_transformers(tmp_path):
    """A folder written by each module's ``save`` (what ``tune`` writes) is the folder
    sentence-transformers reads: its modules.json, each module's config and weights."""
    from sentence_transformers import SentenceTransformer

    from indexer.embedding.modules.base import save_modules
    from indexer.embedding.modules.dense import Dense
    from indexer.embedding.modules.layer_norm import LayerNorm
    from indexer.embedding.modules.normalize import Normalize
    from indexer.embedding.modules.pooling import Pooling
    from indexer.embedding.modules.transformer import Transformer
    from indexer.encoders.factory import encoder_for
    from tests.helpers import random_bert

    folder = Path(random_bert(tmp_path / "model", layers=2))
    rng = np.random.default_rng(1)
    dense = Dense(
        rng.standard_normal((16, 32)).astype(np.float32), rng.standard_normal(16).astype(np.float32), "tanh"
    )
    norm = LayerNorm(rng.uniform(0.5, 2, 16).astype(np.float32), rng.standard_normal(16).astype(np.float32))
    pooling = Pooling("weighted-mean", width=32)
    save_modules(folder, [Transformer(64, False), pooling, dense, norm, Normalize()])
    expected = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, normalize_embeddings=True)
    encoder = encoder_for(Strategy(model=str(folder), backend="torch"))
    assert (encoder.strategy.pooling, encoder.strategy.modules) == (
        "weighted-mean",
        ("2_Dense", "3_LayerNorm"),
    )
    np.testing.assert_allclose(encoder.embed(TEXTS), expected, atol=1e-5)
