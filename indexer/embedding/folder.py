"""What a sentence-transformers model folder says about how its authors embed with it, in the
formats sentence-transformers writes (before version 5: ``sentence_transformers.models.Pooling``
and ``pooling_mode_*_token`` flags; from 5: ``...modules.pooling.Pooling`` and ``pooling_mode``):
its pooling, the Dense and Normalize modules after it, its prompts, length and casing. A module
semsearch cannot reproduce is named (``FolderSays.refused``), so such a folder is refused rather
than read as something else. The Dense modules run here too (``Projection``), in NumPy or on
torch tensors, after the ``indexer.embedding.pooling``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from indexer.embedding.model_files import inside, model_file, model_json
from indexer.embedding.pooling import namespace
from indexer.embedding.weights import read_tensors, tensor_shapes
from indexer.errors import BadInput

POOLING_MODES = {
    "cls": "cls",
    "mean": "mean",
    "max": "max",
    "mean_sqrt_len_tokens": "mean-sqrt-len",
    "weightedmean": "weighted-mean",
    "lasttoken": "last-token",
    ("mean", "max"): "mean-max",
}
"""sentence-transformers' pooling modes (one, or the pair it concatenates) -> semsearch's."""
LEGACY_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
"""The flags folders saved before sentence-transformers 5 name their pooling with."""
ACTIVATIONS = {
    "Tanh": "tanh",
    "Identity": "identity",
    "ReLU": "relu",
    "Sigmoid": "sigmoid",
    "SiLU": "silu",
}
"""A Dense module's ``activation_function`` (the torch class) -> what ``Projection`` applies."""
NORMALIZE = "normalize"
PASSAGE_PROMPTS = ("document", "passage", "corpus")
"""The prompt names sentence-transformers' ``encode_document`` reads, in its order."""


@dataclass(frozen=True)
class FolderSays:
    """A folder's settings (all None/empty for a plain transformers folder)."""

    pooling: str | None = None
    max_length: int | None = None
    modules: tuple[str, ...] = ()
    """After pooling, in order: a Dense module's folder, or ``normalize``."""
    width: int | None = None
    lowercase: bool = False
    prompts: tuple[str, str] = ("", "")
    """The query and the passage prompt."""
    said: tuple[str, ...] = ()
    """What the folder said, in words (``info``)."""
    refused: str | None = None
    """Why the folder cannot be reproduced, naming the module; None when it can."""


def _pooling(config: dict[str, Any]) -> str | None:
    """The semsearch pooling of a Pooling module's config, either format; None if it has none."""
    mode = config.get("pooling_mode")
    if mode is None:
        modes = tuple(LEGACY_FLAGS[k] for k in LEGACY_FLAGS if config.get(k)) or ("mean",)
        mode = modes[0] if len(modes) == 1 else modes
        if set(modes) == {"mean", "max"}:
            mode = ("mean", "max")  # their concatenation's order changes no cosine
    if isinstance(mode, list):
        mode = mode[0] if len(mode) == 1 else tuple(mode)
    return POOLING_MODES.get(mode) if isinstance(mode, (str, tuple)) else None


def read_folder(location: str) -> FolderSays:
    """What the sentence-transformers files at ``location`` (a folder, or a cached hub model) say.
    A module said to lie outside the folder is refused: nothing outside it is read."""
    modules = model_json(model_file(location, "modules.json"))
    if not isinstance(modules, list):
        return FolderSays()
    pooling: str | None = None
    prompt_left_out = False
    after: list[str] = []
    said: list[str] = []
    width = None
    for module in modules:
        if not isinstance(module, dict):
            return FolderSays(refused=f"its modules.json lists {str(module)[:40]!r}, not a module")
        kind = str(module.get("type", ""))
        name = kind.rsplit(".", 1)[-1]
        path = str(module.get("path", ""))
        where = f"module {path or module.get('name', '?')} ({kind})"
        if path and not inside(path):
            named = f"module {module.get('name', '?')} ({kind})"
            raise BadInput(f"{location}: its modules.json puts {named} at {path!r}, outside the model folder")
        if not kind.startswith("sentence_transformers."):
            return FolderSays(refused=f"{where} is code of its own, which semsearch does not run")
        config = _object(model_json(model_file(location, f"{path}/config.json"))) if path else {}
        if name == "Transformer" and pooling is None and not after:
            if path:
                return FolderSays(refused=f"{where} lies in {path}/: give --model with that folder")
        elif name == "Pooling" and pooling is None:
            pooling = _pooling(config)
            if pooling is None:
                mode = config.get("pooling_mode")
                return FolderSays(refused=f"{where} pools as {mode}, which semsearch cannot")
            prompt_left_out = config.get("include_prompt", True) is False
            said.append(f"pooling {pooling}")
        elif name == "Dense" and pooling is not None:
            activation = ACTIVATIONS.get(str(config.get("activation_function", "")).rsplit(".", 1)[-1])
            unusual = config.get("use_residual") or config.get("module_input_name", "sentence_embedding") != (
                "sentence_embedding"
            )
            sized = isinstance(config.get("in_features"), int) and isinstance(config.get("out_features"), int)
            weights = _weights(location, path)
            if activation is None or unusual or not sized or weights is None:
                return FolderSays(refused=f"{where} is a Dense module semsearch cannot reproduce")
            mismatch = _dense_mismatch(weights, config["in_features"], config["out_features"])
            if mismatch:
                return FolderSays(refused=f"{where}: {mismatch}")
            width = int(config["out_features"])
            after.append(path)
            said.append(f"dense {config['in_features']}->{width} {activation}")
        elif name == "Normalize" and pooling is not None:
            after.append(NORMALIZE)
            said.append(NORMALIZE)
        elif name != "Dropout":  # dropout does nothing once trained
            return FolderSays(refused=f"{where} is a module semsearch cannot reproduce")
    while after and after[-1] == NORMALIZE:  # every vector is normalised at the end anyway
        after.pop()
    bert = _object(model_json(model_file(location, "sentence_bert_config.json")))
    max_length = bert.get("max_seq_length")
    lowercase = bool(bert.get("do_lower_case"))
    if lowercase:
        said.append("lowercase")
    prompts = _prompts(_object(model_json(model_file(location, "config_sentence_transformers.json"))))
    if any(prompts):
        said.append(f"prompts query {prompts[0]!r} passage {prompts[1]!r}")
    if prompt_left_out and any(prompts):
        return FolderSays(refused="its pooling leaves its prompts out, which semsearch cannot")
    return FolderSays(
        pooling, int(max_length) if max_length else None, tuple(after), width, lowercase, prompts, tuple(said)
    )


def _object(read: Any) -> dict[str, Any]:
    """A settings file's JSON object; an absent file, or one holding no object, says nothing."""
    return read if isinstance(read, dict) else {}


def _dense_mismatch(weights: Path, in_features: int, out_features: int) -> str | None:
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


def _prompts(config: dict[str, Any]) -> tuple[str, str]:
    """The query and passage prompts as sentence-transformers' ``encode_query`` and
    ``encode_document`` read them: by name, else the default prompt, else none."""
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict):
        return "", ""
    default = prompts.get(config.get("default_prompt_name") or "", "")
    query = prompts.get("query", default)
    passage = next((prompts[n] for n in PASSAGE_PROMPTS if n in prompts), default)
    return str(query), str(passage)


MODULE_FILES = ("config.json", "model.safetensors", "pytorch_model.bin")
"""A Dense module's files: its settings and its weights (safetensors, else a torch pickle)."""


def held_name(path: str, name: str) -> str:
    """A module's file as an index holds it, beside its graph: ``2_Dense.config.json`` (an index
    version holds files, no folders)."""
    return f"{path}.{name}"


def module_file(location: str, path: str, name: str) -> Path | None:
    """A module's file in a model folder (``2_Dense/config.json``) or held by an index."""
    return model_file(location, f"{path}/{name}") or model_file(location, held_name(path, name))


def _weights(location: str, path: str) -> Path | None:
    found = module_file(location, path, "model.safetensors")
    return found or module_file(location, path, "pytorch_model.bin")


def module_files(location: str, modules: Sequence[str]) -> list[tuple[Path, str]]:
    """The files the modules after pooling read, found at ``location``, with the name an index
    holds each by (``held_name``)."""
    found = [
        (module_file(location, path, name), held_name(path, name))
        for path in modules
        if path != NORMALIZE
        for name in MODULE_FILES
    ]
    return [(source, held) for source, held in found if source is not None]


@dataclass(frozen=True)
class Dense:
    """One Dense module: ``activation(vectors @ weight.T + bias)``."""

    weight: np.ndarray
    bias: np.ndarray | None
    activation: str

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


class Projection:
    """The modules after pooling, in order, as read from the model folder at ``location``."""

    def __init__(self, location: str, modules: Sequence[str]):
        self.steps: list[Dense | None] = []  # None: normalise
        for path in modules:
            if path == NORMALIZE:
                self.steps.append(None)
                continue
            config = _object(model_json(module_file(location, path, "config.json")))
            weights = _weights(location, path)
            if weights is None:
                raise BadInput(f"the model's Dense module {path} has no weights here")
            tensors = read_tensors(weights)
            activation = ACTIVATIONS[str(config.get("activation_function", "")).rsplit(".", 1)[-1]]
            if "linear.weight" not in tensors:
                raise BadInput(f"the model's Dense module {path} holds no linear.weight")
            self.steps.append(Dense(tensors["linear.weight"], tensors.get("linear.bias"), activation))

    def __call__(self, vectors: Any) -> Any:
        for step in self.steps:
            if step is None:
                vectors = vectors / ((vectors * vectors).sum(1) ** 0.5)[:, None].clip(min=1e-12)
            else:
                vectors = step(vectors)
        return vectors
