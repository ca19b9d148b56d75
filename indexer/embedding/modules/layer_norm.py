"""The LayerNorm module: each vector less its mean, divided by its standard deviation (plus
``EPSILON``), then scaled and shifted by its trained ``norm.weight`` and ``norm.bias``, after
pooling, as sentence-transformers' ``LayerNorm`` (torch's ``nn.LayerNorm``) runs it. Its files are
its ``config.json`` (``dimension``) and its weights, found and held as every kind with files
(``base.WithFiles``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from indexer.embedding.modules.base import Graph, Listed, Reading, WithFiles, namespace
from indexer.embedding.weights import read_tensors, tensor_shapes
from indexer.errors import BadInput

EPSILON = 1e-5
"""torch's ``nn.LayerNorm`` default, which sentence-transformers' module keeps."""
TENSORS = ("norm.weight", "norm.bias")


@dataclass(frozen=True)
class LayerNorm(WithFiles):
    """``(vectors - mean) / sqrt(variance + EPSILON) * weight + bias`` over each vector."""

    weight: np.ndarray
    bias: np.ndarray

    @classmethod
    def read(cls, folder: Reading, listed: Listed) -> str | None:
        """Its ``dimension``, after pooling, and weights of that size."""
        if folder.pooling is None:
            return listed.cannot()
        dimension = listed.config.get("dimension")
        weights = cls.weights(folder.location, listed.path)
        if not isinstance(dimension, int) or weights is None:
            return f"{listed.where} is a LayerNorm module semsearch cannot reproduce"
        shapes = tensor_shapes(weights)
        if any(shapes.get(name) != (dimension,) for name in TENSORS):
            return f"{listed.where}: {weights} holds no norm.weight and norm.bias of {dimension}"
        folder.modules.append(listed.path)
        folder.said.append(f"layer-norm {dimension}")
        return None

    @classmethod
    def load(cls, location: str, entry: str) -> LayerNorm:
        weights = cls.weights(location, entry)
        tensors = read_tensors(weights) if weights is not None else {}
        if any(name not in tensors for name in TENSORS):
            raise BadInput(f"the model's LayerNorm module {entry} has no norm.weight and norm.bias here")
        return cls(tensors["norm.weight"], tensors["norm.bias"])

    def __call__(self, vectors: Any) -> Any:
        xp = namespace(vectors)
        weight, bias = self.weight, self.bias
        if xp is not np:
            weight, bias = (xp.from_numpy(t).to(vectors.device, vectors.dtype) for t in (weight, bias))
        centred = vectors - vectors.mean(-1)[:, None]
        variance = (centred * centred).mean(-1)[:, None]
        return centred / (variance + EPSILON) ** 0.5 * weight + bias

    def export(self, graph: Graph, vectors: str) -> str:
        """ONNX's ``LayerNormalization`` over the last axis."""
        scale, shift = (graph.const(t.astype(np.float32)) for t in (self.weight, self.bias))
        return graph.op("LayerNormalization", [vectors, scale, shift], axis=-1, epsilon=EPSILON)

    def save(self, folder: Path) -> None:
        self.write(
            folder, {"dimension": len(self.weight)}, dict(zip(TENSORS, (self.weight, self.bias), strict=True))
        )
