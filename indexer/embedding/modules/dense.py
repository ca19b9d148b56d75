"""The Dense module: ``activation(vectors @ weight.T + bias)`` after pooling, read from its folder
(``2_Dense/config.json`` and its weights, a safetensors file or a torch pickle read without torch:
``indexer.embedding.weights``) or from the copy an index holds beside its graph
(``2_Dense.config.json``...: ``base.WithFiles``). Its sizes are checked against its weights'
headers before any tensor is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from indexer.embedding.modules.base import Graph, Listed, Reading, WithFiles, namespace, torch_named
from indexer.embedding.weights import read_tensors, tensor_shapes
from indexer.errors import BadInput

ACTIVATIONS = {
    "Tanh": "tanh",
    "Identity": "identity",
    "ReLU": "relu",
    "Sigmoid": "sigmoid",
    "SiLU": "silu",
}
"""A Dense module's ``activation_function`` (the torch class) -> what ``Dense`` applies."""
NAMED = torch_named(ACTIVATIONS)
"""The activations by the exact names a folder may give them."""
SAVED = {applied: name for name, applied in NAMED.items() if ".modules." in name}
"""What ``Dense`` applies -> the name sentence-transformers saves the torch class by."""


def _activation(config: dict[str, Any]) -> str | None:
    return NAMED.get(str(config.get("activation_function", "")))


def _mismatch(weights: Path, in_features: int, out_features: int) -> str | None:
    """How a Dense module's weights differ from the sizes its config.json gives, or None: read
    from the file's header or tensor records, before any tensor."""
    shapes = tensor_shapes(weights)
    if "linear.weight" not in shapes:
        return f"{weights} holds no linear.weight"
    said = {"linear.weight": (out_features, in_features), "linear.bias": (out_features,)}
    for name, shape in said.items():
        if name in shapes and shapes[name] != shape:
            held = "x".join(map(str, shapes[name]))
            return f"{weights} holds {name} {held}, not the {'x'.join(map(str, shape))} its config.json says"
    return None


@dataclass(frozen=True)
class Dense(WithFiles):
    """One Dense module: ``activation(vectors @ weight.T + bias)``."""

    weight: np.ndarray
    bias: np.ndarray | None
    activation: str
    word: ClassVar[str | None] = None  # stored by its folder's path

    @classmethod
    def read(cls, folder: Reading, listed: Listed) -> str | None:
        """Its ``in_features``, ``out_features`` and ``activation_function``, after pooling; a
        residual or another input than the sentence vector is refused, as are weights that do not
        fit its sizes."""
        if folder.pooling is None:
            return listed.cannot()
        config = listed.config
        activation = _activation(config)
        unusual = config.get("use_residual") or config.get("module_input_name", "sentence_embedding") != (
            "sentence_embedding"
        )
        sized = isinstance(config.get("in_features"), int) and isinstance(config.get("out_features"), int)
        weights = cls.weights(folder.location, listed.path)
        if activation is None or unusual or not sized or weights is None:
            return f"{listed.where} is a Dense module semsearch cannot reproduce"
        mismatch = _mismatch(weights, config["in_features"], config["out_features"])
        if mismatch:
            return f"{listed.where}: {mismatch}"
        folder.width = int(config["out_features"])
        folder.modules.append(listed.path)
        folder.said.append(f"dense {config['in_features']}->{folder.width} {activation}")
        return None

    @classmethod
    def load(cls, location: str, entry: str) -> Dense:
        """The module at folder ``entry`` of ``location`` (a model folder, or an index)."""
        config = cls.config(location, entry)
        weights = cls.weights(location, entry)
        if weights is None:
            raise BadInput(f"the model's Dense module {entry} has no weights here")
        tensors = read_tensors(weights)
        activation = _activation(config)
        if activation is None:
            raise BadInput(f"the model's Dense module {entry} has an activation semsearch does not apply")
        if "linear.weight" not in tensors:
            raise BadInput(f"the model's Dense module {entry} holds no linear.weight")
        return cls(tensors["linear.weight"], tensors.get("linear.bias"), activation)

    def save(self, folder: Path) -> None:
        """Its config (sizes, bias, the activation's torch class) and ``linear.weight`` / ``linear.bias``."""
        out, width = self.weight.shape
        config = {"in_features": width, "out_features": out, "bias": self.bias is not None}
        tensors = {"linear.weight": self.weight, **({} if self.bias is None else {"linear.bias": self.bias})}
        self.write(folder, {**config, "activation_function": SAVED[self.activation]}, tensors)

    def __call__(self, vectors: Any) -> Any:
        xp = namespace(vectors)
        weight, bias = self.weight, self.bias
        if xp is not np:
            weight = xp.from_numpy(weight).to(vectors.device, vectors.dtype)
            bias = None if bias is None else xp.from_numpy(bias).to(vectors.device, vectors.dtype)
        out = vectors @ weight.T
        if bias is not None:
            out = out + bias
        if self.activation == "tanh":
            return xp.tanh(out)
        if self.activation == "relu":
            return out * (out > 0)
        if self.activation in ("sigmoid", "silu"):
            gate = 1 / (1 + xp.exp(-out))
            return gate if self.activation == "sigmoid" else out * gate
        return out

    def export(self, graph: Graph, vectors: str) -> str:
        """``MatMul`` by the weight, ``Add`` of the bias, the activation's operator."""
        vectors = graph.op(
            "MatMul", [vectors, graph.const(np.ascontiguousarray(self.weight.T, dtype=np.float32))]
        )
        if self.bias is not None:
            vectors = graph.op("Add", [vectors, graph.const(self.bias.astype(np.float32))])
        if self.activation in ("tanh", "relu", "sigmoid"):
            return graph.op(self.activation.capitalize(), [vectors])
        if self.activation == "silu":
            return graph.op("Mul", [vectors, graph.op("Sigmoid", [vectors])])
        return vectors
