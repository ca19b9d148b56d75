"""Every shell and Python example of README.md runs, in order, on the files shipped in ``data/``.

The blocks run one after another in one temporary directory (a later block may use the index an
earlier one built), the shell ones with ``bash -e`` and ``semsearch`` on the PATH as this
checkout's CLI, the Python ones as a script. A block that cannot run in a test (``make``, a
server, an install) is skipped only by a visible marker on the line before its fence:

    <!-- readme-test: skip REASON -->

Any other block that fails fails its test. Sections pasted into the README later are run the same
way, with nothing to register.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import DATA, ROOT

README = ROOT / "README.md"
RUNNABLE = {"bash": "shell", "sh": "shell", "shell": "shell", "console": "shell", "python": "python"}
_FENCE = re.compile(r"^```(\S*)\s*$")
_MARKER = re.compile(r"^<!--\s*readme-test:\s*(\S+)\s*(.*?)\s*-->$")


@dataclass(frozen=True)
class Block:
    line: int
    kind: str  # "shell" or "python"
    code: str
    skip: str | None  # the marker's reason, or None: the block must run

    @property
    def name(self) -> str:
        first = next((x for x in self.code.splitlines() if x.strip() and not x.startswith("#")), "")
        return f"line {self.line}: {first[:50]}"


def readme_blocks(text: str) -> list[Block]:
    """The README's shell and Python blocks, in order, with their skip markers. A marker that is
    not ``skip REASON`` or that stands before no runnable block is an error, not ignored."""
    blocks, lines = [], text.splitlines()
    marker, number = None, 0
    while number < len(lines):
        line = lines[number].strip()
        found = _MARKER.match(line)
        if found:
            if found.group(1) != "skip" or not found.group(2):
                raise ValueError(f"README line {number + 1}: write <!-- readme-test: skip REASON -->")
            marker = (number + 1, found.group(2))
        fence = _FENCE.match(line)
        if fence:
            end = next(i for i in range(number + 1, len(lines)) if lines[i].strip() == "```")
            kind = RUNNABLE.get(fence.group(1).lower())
            if marker and (kind is None or marker[0] != number):
                raise ValueError(f"README line {marker[0]}: a skip marker must stand just above a code block")
            if kind:
                code = "\n".join(lines[number + 1 : end]) + "\n"
                blocks.append(Block(number + 2, kind, code, marker[1] if marker else None))
            marker, number = None, end
        number += 1
    return blocks


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))


def test_blocks_are_found_and_markers_are_strict():
    text = "\n".join(
        [
            "<!-- readme-test: skip needs a server -->",
            "```bash",
            "semsearch serve x",
            "```",
            "```python",
            "print(1)",
            "```",
            "```text",
            "output, not run",
            "```",
        ]
    )
    assert [(b.kind, b.skip, b.code) for b in readme_blocks(text)] == [
        ("shell", "needs a server", "semsearch serve x\n"),
        ("python", None, "print(1)\n"),
    ]
    with pytest.raises(ValueError, match="skip REASON"):
        readme_blocks("<!-- readme-test: skip -->\n```bash\nls\n```")
    with pytest.raises(ValueError, match="just above a code block"):
        readme_blocks("<!-- readme-test: skip why -->\ntext\n```bash\nls\n```")
    assert sum(b.skip is None for b in BLOCKS) >= 5, "the README's runnable examples were not found"


class Workspace:
    """A temporary directory holding a copy of ``data/`` where the blocks run in order; each
    block's result is kept, so a test asking for block i runs the blocks before it first."""

    def __init__(self, directory: Path):
        self.directory = directory
        shutil.copytree(DATA, directory / "data")
        shim = directory / ".bin" / "semsearch"
        shim.parent.mkdir()
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m search.cli "$@"\n')
        shim.chmod(0o755)
        self.env = {
            **os.environ,
            "PATH": f"{shim.parent}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        self.results: dict[int, subprocess.CompletedProcess] = {}

    def result(self, index: int) -> subprocess.CompletedProcess:
        for earlier in range(index + 1):
            if earlier not in self.results and BLOCKS[earlier].skip is None:
                self.results[earlier] = self.run(BLOCKS[earlier])
        return self.results[index]

    def run(self, block: Block) -> subprocess.CompletedProcess:
        if block.kind == "shell":
            command = ["bash", "-e", "-o", "pipefail", "-c", block.code]
        else:
            script = self.directory / f".block-{block.line}.py"
            script.write_text(block.code, encoding="utf-8")
            command = [sys.executable, str(script)]
        return subprocess.run(
            command, cwd=self.directory, env=self.env, capture_output=True, text=True, timeout=900
        )


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Workspace:
    return Workspace(tmp_path_factory.mktemp("readme"))


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[b.name for b in BLOCKS])
def test_readme_example_runs(workspace, index):
    block = BLOCKS[index]
    if block.skip:
        pytest.skip(f"README line {block.line}: {block.skip}")
    result = workspace.result(index)
    assert result.returncode == 0, (
        f"README block at line {block.line} failed (exit {result.returncode}):\n{block.code}\n"
        f"stdout:\n{result.stdout[-2000:]}\nstderr:\n{result.stderr[-2000:]}"
    )
    assert "Traceback" not in result.stderr, result.stderr


_OUTPUT = re.compile(r"(?:--csv|--heatmap|-o|--output|>)\s*(\S+)")


def test_examples_write_only_where_they_run():
    """A sweep's --csv, an index's -o, a redirect: relative paths inside the directory the example
    runs in, never over tracked files such as docs/ (nor outside the checkout)."""
    for block in BLOCKS:
        for line in block.code.splitlines():
            for target in _OUTPUT.findall(line.split(" #")[0]):
                target = target.strip("'\"")
                assert not target.startswith(("/", "..", "docs/", "data/", "~")), f"{block.name}: {line}"
