"""The product's modules import each other one way: no import circle in ``indexer`` or ``search``,
not even through an import deferred into a function or kept for type checking (a circle makes
import order matter and hides which part depends on which), the floors run one way, and SQLite is
spoken by the catalog alone."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

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
    """Every SQL statement, SQLite error and SQLite fact lives in ``indexer/catalog/``; the width
    the corpus reader checks a file against is the index format's (``indexer/columns.py``)."""
    allowed = set((ROOT / "indexer" / "catalog").glob("*.py"))  # the catalog's package
    packages = ("indexer", "search", "semsearch")
    paths = [p for package in packages for p in sorted((ROOT / package).rglob("*.py"))]
    assert [hit for p in paths if p not in allowed for hit in heavy_imports(p, ("sqlite3",))] == []
    assert heavy_imports(ROOT / "indexer" / "catalog" / "__init__.py", ("sqlite3",))  # the scan sees it


STORE_WRITERS = (
    "indexer.store.changes",
    "indexer.store.writer",
    *(
        f"indexer.store.{name}"
        for name in (
            "Change",
            "VersionWriter",
            "append_change",
            "apply_change",
            "commit_change",
            "new_version",
            "write_index",
            "writer_lock",
        )
    ),
    *(f"indexer.store.versions.{name}" for name in ("building", "committing", "writer_lock")),
)
"""What writes a version of an index: the store's writing modules and the names of its API that
write (the writer lock with them: only a writer takes it)."""


def test_the_read_path_writes_nothing():
    """``search/read`` opens and reads versions, never writes one, so a search never changes an
    index nor waits on its writer lock: a setting stored for it (a rule, the hybrid weight) is
    written above it (``search.studies.calibrate``). The writers themselves are a floor it
    never reaches (``FLOORS``)."""
    paths = sorted((ROOT / "search" / "read").rglob("*.py"))
    assert len(paths) > 5
    assert [hit for p in paths for hit in heavy_imports(p, STORE_WRITERS)] == []
    assert heavy_imports(ROOT / "search" / "studies" / "calibrate.py", STORE_WRITERS)  # the scan sees them


FLOORS: list[dict[str, tuple[str, ...]]] = [
    {"base": ("indexer.errors", "indexer.progress", "indexer.lazy", "indexer.columns", "indexer.stages")},
    {"reading": ("indexer.reading",)},
    {"catalog": ("indexer.catalog",), "vectors": ("indexer.vectors",)},
    {"embedding": ("indexer.embedding",), "files": ("indexer.files",)},
    {"store": ("indexer.store",)},
    {"encoders": ("indexer.encoders",)},
    {"writing": ("indexer.writing",), "read": ("search.read",)},
    {"studies": ("search.studies",), "server": ("search.server",)},
    {"cli": ("search.cli",), "facade": ("indexer", "search")},
    {"launch": ("search.launch",)},
]
"""The house's floors, lowest first: a module imports its own part and the floors below it, never
one above nor a neighbour on its floor. The store sits under the encoders and the writers, the
corpus reader under the catalog, the read path (``search/read``) beside the writers (never
importing them), the studies (``search/studies``, which build indexes to measure them) and the
server above both, the CLI, and on top the command's entry point that imports it. A dotted name covers its
submodules; a top package's name (``indexer``, ``search``) its ``__init__`` alone, so a new module
is on no floor until it is placed."""

INTERNALS = (
    "indexer.catalog",
    "indexer.store.",
    "indexer.encoders.factory",
    "indexer.encoders.torch_encoder",
    "indexer.encoders.onnx_encoder",
    "indexer.encoders.onnx_graph",
    "indexer.encoders.onnx_export",
    "indexer.encoders.pipeline",
    "indexer.encoders.training",
    "indexer.encoders.on_ray",
    "indexer.encoders.standalone",
    "indexer.vectors.faiss_index",
    "indexer.vectors.segments",
)
"""What the CLI never imports: it parses, calls the library's functions and prints."""


def floor_of(module: str) -> tuple[int, str]:
    """The floor and the part of ``module``: its longest prefix in ``FLOORS`` (a top package's
    name: itself alone)."""
    found = (-1, "", "")
    for number, parts in enumerate(FLOORS):
        for part, prefixes in parts.items():
            for prefix in prefixes:
                covers = "." in prefix and module.startswith(prefix + ".")
                if (module == prefix or covers) and len(prefix) > len(found[2]):
                    found = (number, part, prefix)
    assert found[0] >= 0, f"{module} is on no floor: add it to FLOORS"
    return found[0], found[1]


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import that runs to a floor above, or to a neighbour on the same floor."""
    found = []
    for module, targets in sorted(graph.items()):
        floor, part = floor_of(module)
        for target in sorted(targets):
            other, other_part = floor_of(target)
            if other > floor or (other == floor and other_part != part):
                found.append(f"{module} ({part}) -> {target} ({other_part})")
    return found


def test_the_floors_run_one_way():
    known = module_names()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert upward(graph) == []


def test_the_cli_goes_through_the_library():
    known = module_names()
    cli = {name: imports(name, path, known) for name, path in known.items() if name.startswith("search.cli")}
    assert len(cli) > 3
    reached = sorted(f"{m} -> {t}" for m, targets in cli.items() for t in targets if t.startswith(INTERNALS))
    assert reached == []


def test_the_floor_check_finds_an_import_that_runs_up():
    graph = {"indexer.store.opening": {"indexer.encoders.factory"}, "indexer.writing.x": {"indexer.store"}}
    assert upward(graph) == ["indexer.store.opening (store) -> indexer.encoders.factory (encoders)"]
    assert upward({"search.read.engine": {"indexer.writing.build"}}) == [
        "search.read.engine (read) -> indexer.writing.build (writing)"
    ]


@pytest.mark.parametrize("module", ["search.brand_new", "indexer.brand_new", "semsearch.brand_new"])
def test_a_new_module_must_be_placed_on_a_floor(module):
    """A top package's name stands for its ``__init__`` alone: a new module in it is on no floor
    until it is placed, never on one by a catch-all."""
    with pytest.raises(AssertionError, match="on no floor"):
        floor_of(module)


PRODUCT = ("indexer", "search", "semsearch")


def private_imports(source: str) -> list[str]:
    """Each import of a product module's name in ``source`` that is private or made private (``_x``,
    wherever the import stands): a private name is its own module's, and a shared one goes by its
    public name, so that a reader sees where it comes from."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            product = node.level or (node.module or "").split(".")[0] in PRODUCT
            names = node.names if product else []
        elif isinstance(node, ast.Import):
            names = [alias for alias in node.names if alias.name.split(".")[0] in PRODUCT]
        else:
            continue
        for alias in names:
            said = [alias.name.rpartition(".")[2], alias.asname or ""]
            if any(name.startswith("_") and not name.startswith("__") for name in said):
                found.append(ast.unparse(node))
    return found


def test_no_private_name_is_imported_across_modules():
    known = module_names()
    found = {name: private_imports(path.read_text(encoding="utf-8")) for name, path in known.items()}
    assert {name: said for name, said in found.items() if said} == {}


def test_the_private_import_check_sees_every_form():
    forms = [
        "from indexer.encoders.tokens import _cut",
        "from .tokens import cut, _cut",
        "from search.studies.labels import as_number as _float",
        "import indexer.encoders.tokens as _tokens",
        "def f():\n    from indexer.x import _y",
    ]
    assert [bool(private_imports(form)) for form in forms] == [True] * len(forms)
    fine = "from __future__ import annotations\nfrom os import _exit\nfrom indexer.x import y as z"
    assert private_imports(fine) == []
