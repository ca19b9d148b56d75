"""The test suite's own rules: shared helpers live in ``tests/helpers.py``, so a test module
never imports another (which would run, skip or break with it) nor ``conftest.py`` (pytest's
own, which holds only fixtures and hooks)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_test_modules(directory: Path = TESTS) -> dict[str, list[str]]:
    """Test module -> the test modules (and ``conftest``) it imports (``tests.test_x``, ``test_x``,
    ``.test_x``, ``from tests import test_x``), wherever the import stands."""
    found: dict[str, list[str]] = {}
    for path in sorted(directory.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                names = [module] + [f"{module}.{alias.name}" for alias in node.names]
            else:
                continue
            imported = [n for n in names if n.rpartition(".")[2].startswith(("test_", "conftest"))]
            if imported:
                found.setdefault(path.name, []).extend(imported)
    return found


def test_no_test_module_imports_another():
    assert imported_test_modules() == {}


def test_the_check_sees_every_form_of_import(tmp_path):
    forms = [
        "from tests.test_a import x",
        "import tests.test_a",
        "from tests import test_a",
        "from .test_a import x",
        "from tests.conftest import run",
        "from tests import conftest",
    ]
    for i, form in enumerate(forms):
        (tmp_path / f"test_{i}.py").write_text(f"def f():\n    {form}\n")
    (tmp_path / "test_fine.py").write_text("from tests.helpers import run\nimport testing_tools\n")
    assert sorted(imported_test_modules(tmp_path)) == [f"test_{i}.py" for i in range(len(forms))]
