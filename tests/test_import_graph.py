"""The product's modules import each other one way: no import circle in ``indexer`` or ``search``,
not even through an import deferred into a function or kept for type checking (a circle makes
import order matter and hides which part depends on which), and SQLite is spoken by the catalog
alone."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import ROOT, heavy_imports


def module_names() -> dict[str, Path]:
    names = {}
    for package in ("indexer", "search"):
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The product modules ``name`` imports anywhere: at module level, in functions and under
    ``if TYPE_CHECKING``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, done, path = [], set(), []

    def visit(module: str) -> None:
        path.append(module)
        for other in sorted(graph[module]):
            if other in path:
                found.append(path[path.index(other) :] + [other])
            elif other not in done:
                visit(other)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module)
    return found


def test_no_import_circle():
    known = module_names()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert sum(map(len, graph.values())) > 20  # the scan sees the imports it looks for
    assert circles(graph) == []


def test_the_circle_finder_finds_one():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]


def test_sqlite3_is_imported_only_by_the_catalog():
    """Every SQL statement, SQLite error and SQLite fact (its column limit, which the corpus reader
    checks a file's width against) lives in ``indexer/catalog.py``."""
    allowed = {ROOT / "indexer" / "catalog.py"}
    packages = ("indexer", "search", "semsearch")
    paths = [p for package in packages for p in sorted((ROOT / package).rglob("*.py"))]
    assert [hit for p in paths if p not in allowed for hit in heavy_imports(p, ("sqlite3",))] == []
    assert heavy_imports(ROOT / "indexer" / "catalog.py", ("sqlite3",))  # the scan sees it
