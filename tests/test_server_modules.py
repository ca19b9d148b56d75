"""The server package's imports run one way: ``app`` puts the modules together and none of them
imports it back (no import circle), so each job can be read and tested on its own."""

from __future__ import annotations

import ast

from tests.helpers import ROOT

PACKAGE = ROOT / "search" / "server"


def server_imports() -> dict[str, set[str]]:
    """Module of the package -> the ``search.server`` modules it imports."""
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.glob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("search.server."):
                names.add(node.module.rpartition(".")[2])
        found[path.stem] = names
    return found


def test_no_server_module_imports_the_app_or_the_package():
    imports = server_imports()
    assert {"app", "batching", "connections", "page", "serving"} <= set(imports)
    assert [name for name, used in imports.items() if "app" in used and name != "__init__"] == []
    for path in PACKAGE.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert not any(
            isinstance(node, ast.ImportFrom) and node.module == "search.server" for node in ast.walk(tree)
        ), path.name
