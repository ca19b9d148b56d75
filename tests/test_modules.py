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
