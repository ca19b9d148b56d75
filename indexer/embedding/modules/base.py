"""The protocol a module kind implements and the registry of kinds, by the class name
sentence-transformers gives the module in ``modules.json`` (``sentence_transformers.models.Dense``
-> ``Dense``). A kind is a class: ``read`` takes its entry's config into what the folder says; a
kind that runs after pooling (a ``Step``) also loads, runs on NumPy arrays or torch tensors,
appends its ONNX operators to a graph and names the files an index holds for it. A new kind is
one file and one line in ``KINDS``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, cast

import numpy as np

KINDS: dict[str, str] = {
    "Transformer": "indexer.embedding.modules.transformer:Transformer",
    "Pooling": "indexer.embedding.modules.pooling:Pooling",
    "Dense": "indexer.embedding.modules.dense:Dense",
    "Normalize": "indexer.embedding.modules.normalize:Normalize",
    "Dropout": "indexer.embedding.modules.dropout:Dropout",
}
"""sentence-transformers' class name -> the class that reads it (``module:Class``), imported
when a folder or a strategy names it."""
STORED_BY_PATH = "Dense"
"""The kind a folder's path in ``Strategy.modules`` names: the stored format names a kind without
files by its ``word`` (``normalize``) and a module with files by its folder alone, which has only
ever been a Dense module's."""
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


def stored(entry: str) -> type[Step]:
    """The kind of an entry of ``Strategy.modules``: the one whose ``word`` it is, else a
    folder's (``STORED_BY_PATH``)."""
    kinds = [kind(name) for name in KINDS]
    named = next((k for k in kinds if getattr(k, "word", None) == entry), None)
    return cast(type[Step], named or kind(STORED_BY_PATH))


def after_pooling(location: str | None, modules: Sequence[str]) -> list[Step]:
    """The modules a strategy runs after pooling, in order, loaded from ``location`` (the model
    folder, or the index holding their files)."""
    if modules:
        assert location is not None, "a strategy with modules after pooling reads them from its model"
    return [stored(entry).load(str(location), entry) for entry in modules]


def held_files(location: str, modules: Sequence[str]) -> list[tuple[Path, str]]:
    """The files the modules after pooling read, found at ``location``, with the name an index
    holds each by."""
    return [found for entry in modules for found in stored(entry).held(location, entry)]
