"""The protocol a module kind implements and the registry of kinds, by the class name
sentence-transformers gives the module in ``modules.json`` (``sentence_transformers.models.Dense``
-> ``Dense``). A kind is a class: ``read`` takes its entry's config into what the folder says, and
``save`` writes its folder back (``save_modules``: what ``tune`` writes); a kind that runs after
pooling (a ``Step``) also loads, runs on NumPy arrays or torch tensors, appends its ONNX operators
to a graph and names its files (``held``: what an index holds beside its graph and a model's
fingerprint covers). A stored module's kind is the type ``modules.json`` names beside its path, as
sentence-transformers reads it. A new kind, with files or not, is one file and one line in ``KINDS``.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, cast

import numpy as np

from indexer.embedding.model_files import inside, model_file, model_json
from indexer.errors import BadInput

KINDS: dict[str, str] = {
    "Transformer": "indexer.embedding.modules.transformer:Transformer",
    "Pooling": "indexer.embedding.modules.pooling:Pooling",
    "Dense": "indexer.embedding.modules.dense:Dense",
    "Normalize": "indexer.embedding.modules.normalize:Normalize",
    "Dropout": "indexer.embedding.modules.dropout:Dropout",
    "LayerNorm": "indexer.embedding.modules.layer_norm:LayerNorm",
}
"""sentence-transformers' class name -> the class that reads it (``module:Class``), imported
when a folder or a strategy names it."""
UNLISTED = "Dense"
"""The kind of a path in ``Strategy.modules`` where no ``modules.json`` lists it: an index version
written before versions held theirs held Dense modules alone."""
SAVED_AS = "sentence_transformers.models."
"""What ``save_modules`` writes before a kind's name (``type`` in ``modules.json``): the name every
sentence-transformers version reads."""
MODULE_FILES = ("config.json", "model.safetensors", "pytorch_model.bin")
"""A module with files: its settings and its weights (safetensors, else a torch pickle)."""
CANNOT = "is a module semsearch cannot reproduce"


def namespace(array: Any) -> Any:
    """``numpy`` for a NumPy array, ``torch`` for a torch tensor: the calls the modules use
    (``where``, ``einsum``, ``concatenate``, ``amax``, ``isin``, ``tanh``, ``exp``) mean the same in
    both. torch is never imported here; a tensor means it is loaded already."""
    return sys.modules["torch"] if type(array).__module__.startswith("torch") else np


@dataclass(frozen=True)
class Listed:
    """One entry of ``modules.json``: its class (``type``), name, folder and ``config.json``."""

    kind: str
    name: str
    path: str
    config: dict[str, Any]

    @property
    def where(self) -> str:
        """The module as a refusal names it."""
        return f"module {self.path or self.name} ({self.kind})"

    def cannot(self) -> str:
        """The refusal of a module semsearch cannot reproduce (or not where it stands)."""
        return f"{self.where} {CANNOT}"


@dataclass
class Reading:
    """What the walk of a folder's ``modules.json`` has found so far; each kind's ``read`` adds
    its part, in the folder's order."""

    location: str
    network: bool = False
    """The Transformer module has been read: a folder holds one network, first."""
    pooling: str | None = None
    prompt_left_out: bool = False
    """The Pooling module leaves the prompt's tokens out (``include_prompt``)."""
    modules: list[str] = field(default_factory=list)
    """After pooling, in order: ``Strategy.modules``' entries."""
    width: int | None = None
    max_length: int | None = None
    lowercase: bool = False
    said: list[str] = field(default_factory=list)
    """What the modules said, in words (``info``)."""
    said_last: list[str] = field(default_factory=list)
    """Words said after every module's: the network's settings, where ``info`` has them."""


class Graph(Protocol):
    """ONNX operators appended to a graph under names of their own (``indexer.encoders.standalone``
    builds it). Passed in, so this package never imports onnx: the torch-free query path imports
    the head. An ``ndarray`` attribute is a tensor attribute."""

    FLOAT: int
    BOOL: int
    """ONNX's element types (``Cast``'s ``to``)."""

    def op(self, kind: str, inputs: Sequence[str], *, first: bool = False, **attributes: object) -> str: ...

    def const(self, value: np.ndarray) -> str: ...


class Module(Protocol):
    """A module kind of a sentence-transformers folder."""

    @classmethod
    def read(cls, folder: Reading, listed: Listed) -> str | None:
        """Add what ``listed`` says to ``folder``; a refusal (one line naming the module) where
        semsearch cannot reproduce it, or not where it stands."""
        ...


class Step(Module, Protocol):
    """A kind that runs after pooling, stored in ``Strategy.modules`` (by ``word``, else by its
    folder's path): read from the model folder, or from an index holding its files beside its
    graph."""

    word: ClassVar[str | None]
    """The entry a kind without files is stored by; None: stored by its folder's path."""

    @classmethod
    def load(cls, location: str, entry: str) -> Step: ...

    @classmethod
    def held(cls, location: str, entry: str) -> list[tuple[Path, str]]:
        """Its files found at ``location``, each with the name an index holds it by."""
        ...

    def __call__(self, vectors: Any) -> Any:
        """``[batch, width]`` vectors (NumPy, or torch tensors that keep their gradient) -> the next ones."""
        ...

    def export(self, graph: Graph, vectors: str) -> str:
        """The ONNX form of ``__call__``: appends its operators, returns the output's name."""
        ...

    def save(self, folder: Path) -> None:
        """Write its files into ``folder`` (made already), as sentence-transformers saves the kind."""
        ...


class Fileless:
    """The reading, loading and holding of a kind after pooling that has no config and no files
    (``Normalize``): stored by its ``word``; a kind subclasses it and adds ``__call__`` and
    ``export``."""

    word: ClassVar[str | None] = None

    @classmethod
    def read(cls, folder: Reading, listed: Listed) -> str | None:
        """It stands after pooling; anywhere else it is refused."""
        if folder.pooling is None or cls.word is None:
            return listed.cannot()
        folder.modules.append(cls.word)
        folder.said.append(cls.word)
        return None

    @classmethod
    def load(cls, location: str, entry: str) -> Fileless:
        return cls()

    @classmethod
    def held(cls, location: str, entry: str) -> list[tuple[Path, str]]:
        return []

    def save(self, folder: Path) -> None:
        """Nothing: its folder alone, as sentence-transformers leaves it."""


def held_name(path: str, name: str) -> str:
    """A module's file as an index holds it, beside its graph: ``2_Dense.config.json`` (an index
    version holds files, no folders)."""
    return f"{path}.{name}"


def module_file(location: str, path: str, name: str) -> Path | None:
    """A module's file in a model folder (``2_Dense/config.json``) or held by an index."""
    return model_file(location, f"{path}/{name}") or model_file(location, held_name(path, name))


class WithFiles:
    """The files of a kind after pooling stored by its folder's path (``MODULE_FILES``): found in
    a model folder or held by an index, read, and written as sentence-transformers writes them.
    A kind with files subclasses it and adds ``read``, ``load``, ``__call__``, ``export``, ``save``."""

    word: ClassVar[str | None] = None

    @classmethod
    def held(cls, location: str, entry: str) -> list[tuple[Path, str]]:
        """Its ``MODULE_FILES`` found at ``location``, each with its ``held_name``."""
        found = [(module_file(location, entry, name), held_name(entry, name)) for name in MODULE_FILES]
        return [(source, held) for source, held in found if source is not None]

    @staticmethod
    def config(location: str, entry: str) -> dict[str, Any]:
        """Its ``config.json`` (empty where it says no object: ``read`` refuses what it lacks)."""
        said = model_json(module_file(location, entry, "config.json"))
        return said if isinstance(said, dict) else {}

    @staticmethod
    def weights(location: str, entry: str) -> Path | None:
        """Its weights file: safetensors, else a torch pickle (read without torch)."""
        found = module_file(location, entry, "model.safetensors")
        return found or module_file(location, entry, "pytorch_model.bin")

    @staticmethod
    def write(folder: Path, config: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
        """``config.json`` and ``model.safetensors`` (float32) in ``folder``."""
        from safetensors.numpy import save_file

        (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
        kept = {name: np.ascontiguousarray(value, dtype=np.float32) for name, value in tensors.items()}
        save_file(kept, str(folder / "model.safetensors"))


def torch_named(activations: dict[str, str]) -> dict[str, str]:
    """Each torch activation class (``Tanh``) by the names sentence-transformers writes it (its
    module and name: ``torch.nn.modules.activation.Tanh``) and torch's shorter public one
    (``torch.nn.Tanh``) -> what it is applied as: no other dotted path ending in the class's name is
    the class."""
    return {
        name: applied
        for torch_class, applied in activations.items()
        for module in ("linear" if torch_class == "Identity" else "activation",)
        for name in (f"torch.nn.{torch_class}", f"torch.nn.modules.{module}.{torch_class}")
    }


def kind(name: str) -> type[Module] | None:
    """The class registered for a sentence-transformers class name; None where there is none."""
    where = KINDS.get(name)
    if where is None:
        return None
    module, _, attribute = where.partition(":")
    return cast(type[Module], getattr(importlib.import_module(module), attribute))


def listed(location: str) -> dict[str, str]:
    """Each module folder ``modules.json`` at ``location`` lists (a model folder, or the copy an
    index holds) -> the kind its ``type`` names (its class name)."""
    said = model_json(model_file(location, "modules.json"))
    modules = [m for m in said if isinstance(m, dict)] if isinstance(said, list) else []
    return {str(m.get("path", "")): str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules}


def stored(entry: str, location: str) -> type[Step]:
    """The kind of an entry of ``Strategy.modules``: the one whose ``word`` it is, else the kind
    ``modules.json`` at ``location`` names for that folder (``UNLISTED`` where none lists it)."""
    kinds = [kind(name) for name in KINDS]
    named = next((k for k in kinds if getattr(k, "word", None) == entry), None)
    found = named or kind(listed(location).get(entry, UNLISTED))
    if found is None:
        raise BadInput(f"{location}: its modules.json lists module {entry} of a kind semsearch does not run")
    return cast(type[Step], found)


def after_pooling(location: str | None, modules: Sequence[str]) -> list[Step]:
    """The modules a strategy runs after pooling, in order, loaded from ``location`` (the model
    folder, or the index holding their files)."""
    if modules:
        assert location is not None, "a strategy with modules after pooling reads them from its model"
    return [stored(entry, str(location)).load(str(location), entry) for entry in modules]


def held_files(location: str, modules: Sequence[str]) -> list[tuple[Path, str]]:
    """The files the modules after pooling read, found at ``location``, with the name an index
    holds each by; with ``modules.json`` where a module is stored by its folder (its kind)."""
    found = [found for entry in modules for found in stored(entry, location).held(location, entry)]
    listing = model_file(location, "modules.json")
    return [*found, (listing, "modules.json")] if found and listing is not None else found


def module_files(location: str) -> list[Path]:
    """The files of every module ``modules.json`` at ``location`` lists whose kind has files of its
    own (``held``), whatever its folder is named: what a model's fingerprint covers beside its
    network."""
    found: list[Path] = []
    for path, name in listed(location).items():
        held = getattr(kind(name), "held", None)  # Transformer, Pooling: no files of their own
        if path and inside(path) and held is not None:
            found += [file for file, _ in held(location, path)]
    return found


def save_modules(directory: Path, modules: Sequence[Any]) -> None:
    """Each module saved by its own ``save`` into its folder (the first, a ``Transformer``, into
    ``directory`` itself; then ``1_Pooling``...: sentence-transformers' names) and ``modules.json``
    listing them by their registered kind, as sentence-transformers saves a model."""
    names = {where: name for name, where in KINDS.items()}
    entries = []
    for idx, module in enumerate(modules):
        name = names[f"{type(module).__module__}:{type(module).__name__}"]
        path = "" if idx == 0 and name == "Transformer" else f"{idx}_{name}"
        (directory / path).mkdir(parents=True, exist_ok=True)
        module.save(directory / path)
        entries.append({"idx": idx, "name": str(idx), "path": path, "type": SAVED_AS + name})
    (directory / "modules.json").write_text(json.dumps(entries, indent=2), encoding="utf-8")
