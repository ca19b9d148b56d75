"""The house's size rule, held: no product file over 450 lines, no function over 80. A file or a
function past them has grown a second job; this test names it, so it is split when it grows, not
found by a review later."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("indexer", "search", "semsearch")
MAX_FILE_LINES, MAX_FUNCTION_LINES = 450, 80


def product_files(root: Path = ROOT) -> list[Path]:
    return sorted(path for package in PRODUCT for path in (root / package).rglob("*.py"))


def oversized(files: list[Path], root: Path = ROOT) -> list[str]:
    """Each file past ``MAX_FILE_LINES`` and each function past ``MAX_FUNCTION_LINES`` (from its
    ``def`` to its end, docstring counted; a command's click options above it are not), as
    ``path: what (lines)``."""
    found = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        name = path.relative_to(root).as_posix()
        if (lines := len(text.splitlines())) > MAX_FILE_LINES:
            found.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if (length := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                found.append(f"{name}: {node.name} ({length} lines)")
    return found


def test_no_product_file_or_function_outgrows_its_room():
    assert oversized(product_files()) == []


def test_the_check_sees_a_long_file_and_a_long_method(tmp_path):
    package = tmp_path / "search"
    package.mkdir()
    (package / "long.py").write_text("x = 1\n" * (MAX_FILE_LINES + 1))
    body = "".join(f"        y{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (package / "method.py").write_text(f"class A:\n    @staticmethod\n    def grown():\n{body}")
    (package / "fine.py").write_text("def f():\n    return 1\n")
    files = sorted(package.glob("*.py"))
    assert oversized(files, tmp_path) == [
        f"search/long.py: {MAX_FILE_LINES + 1} lines",
        f"search/method.py: grown ({MAX_FUNCTION_LINES + 1} lines)",
    ]
