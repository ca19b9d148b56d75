"""Names a package hands on from its modules, imported on first use (PEP 562), so importing the
package costs nothing until a name is used: ``semsearch --help`` and ``import semsearch`` load no
NumPy, FAISS or torch. ``indexer``, ``search`` and ``semsearch`` all export this way."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(
    package: str, sources: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, whose public names map to
    ``"module:attribute"`` (or just ``"module"`` when the attribute has the name's name)."""

    def __getattr__(name: str) -> Any:
        if name not in sources:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = sources[name].partition(":")
        return getattr(import_module(module), attribute or name)

    def __dir__() -> list[str]:
        return sorted([*sources, "__doc__", "__name__"])

    return __getattr__, __dir__
