"""The Normalize module: each vector divided by its length (at least 1e-12). The strategy's own
normalising at the end (``Strategy.normalize``, ``indexer.embedding.head.Head``) and the exported
graph's (``indexer.encoders.standalone``) are this module too."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from indexer.embedding.modules.base import Fileless, Graph

NORMALIZE = "normalize"
"""Its entry in ``Strategy.modules`` (it has no files)."""


class Normalize(Fileless):
    """Rows divided by their length, NumPy or torch."""

    word: ClassVar[str | None] = NORMALIZE

    def __call__(self, vectors: Any) -> Any:
        return vectors / ((vectors * vectors).sum(1) ** 0.5)[:, None].clip(min=1e-12)

    def export(self, graph: Graph, vectors: str) -> str:
        """``ReduceL2`` and ``Div`` by it, at least 1e-12."""
        length = graph.op("ReduceL2", [vectors], axes=[1], keepdims=1)
        return graph.op("Div", [vectors, graph.op("Max", [length, graph.const(np.float32(1e-12))])])
