"""The test suite's own rules: shared helpers live in ``tests/helpers.py``, so a test module
never imports another (which would run, skip or break with it) nor ``conftest.py`` (pytest's
own, which holds only fixtures and hooks)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.slow
def test_the_inner_loop_passes_on_a_fresh_install(tmp_path):
    """What a first run on a machine builds (matplotlib's font cache, listed in a subprocess; the
    graph cache) is setup, not slow work the watch in ``conftest.py`` reports: a not-slow test that
    draws a heatmap passes with every cache empty."""
    pytest.importorskip("matplotlib")
    test = "tests/test_evaluate.py::test_sweep_cell_equals_evaluate_with_that_strategy"
    fresh = {"MPLCONFIGDIR": str(tmp_path / "matplotlib"), "SEMSEARCH_CACHE": str(tmp_path / "semsearch")}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider", test],
        cwd=TESTS.parent,
        env={**os.environ, **fresh},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert (tmp_path / "matplotlib").is_dir()  # the cache was built in this run
