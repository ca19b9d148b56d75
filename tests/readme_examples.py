"""README.md's examples, run as a reader runs them, and the outputs it shows, made by running them.

Every shell, Python and console block runs in order in one temporary directory holding a copy of
``data/`` (a later block may use the index an earlier one built): shell blocks with ``bash -e``
and ``semsearch`` on the PATH as this checkout's CLI, Python blocks as a script. A ``console``
block is a shown output: each ``$ COMMAND`` line (continued by a trailing ``\\``) runs in bash
there, and the lines after it, up to the next ``$``, are what it printed on stdout. Those lines are
never typed: ``make readme`` (``python -m tests.readme_examples``) runs every block and rewrites
each console block whose output changed; ``--check`` rewrites nothing and lists the differences
(exit 1). Durations are compared as ``<time>``, and a block that differs only there is left as it
is, so a second run changes nothing. ``tests/test_readme.py`` runs the same blocks and fails on a
shown output that is not what its command prints today.

A block that cannot run here (``make``, a server, an install) is skipped only by a visible marker
on the line before its fence::

    <!-- readme-test: skip REASON -->
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DATA = ROOT / "data"
RUNNABLE = {"bash": "shell", "sh": "shell", "shell": "shell", "python": "python", "console": "console"}
_FENCE = re.compile(r"^```(\S*)\s*$")
_MARKER = re.compile(r"^<!--\s*readme-test:\s*(\S+)\s*(.*?)\s*-->$")
_DURATION = re.compile(r"\b\d+(?:\.\d+)? ?(?:ms|s|sec|seconds|min|minutes)\b")


@dataclass(frozen=True)
class Block:
    line: int  # the first line of its code, counted from 1
    kind: str  # "shell", "python" or "console"
    code: str
    skip: str | None  # the marker's reason, or None: the block must run

    @property
    def name(self) -> str:
        first = next((x for x in self.code.splitlines() if x.strip() and not x.startswith("#")), "")
        return f"line {self.line}: {first.removeprefix('$ ')[:50]}"

    def commands(self) -> list[str]:
        """A console block's commands, each with its continuation lines."""
        commands: list[str] = []
        lines = iter(self.code.splitlines())
        for line in lines:
            if line.startswith("$ "):
                command = [line[2:]]
                while command[-1].endswith("\\"):
                    command.append(next(lines))
                commands.append("\n".join(command))
        return commands


def readme_blocks(text: str) -> list[Block]:
    """The README's runnable blocks, in order, with their skip markers. A marker that is not
    ``skip REASON`` or that stands before no runnable block is an error, not ignored; a console
    block must begin with a ``$`` line."""
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
                if kind == "console" and not code.startswith("$ "):
                    raise ValueError(f"README line {number + 2}: a console block begins with '$ COMMAND'")
                blocks.append(Block(number + 2, kind, code, marker[1] if marker else None))
            marker, number = None, end
        number += 1
    return blocks


class Workspace:
    """A temporary directory holding a copy of ``data/`` where the blocks run in order; each
    block's result is kept, so asking for block i runs the blocks before it first. A console
    block's result has the block as its commands print it today as ``stdout``."""

    def __init__(self, directory: Path, blocks: list[Block]):
        self.directory, self.blocks = directory, blocks
        shutil.copytree(DATA, directory / "data")
        shim = directory / ".bin" / "semsearch"
        shim.parent.mkdir()
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m search.cli "$@"\n')
        shim.chmod(0o755)
        self.env = {
            **os.environ,
            "PATH": f"{shim.parent}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "COLUMNS": "100",  # what a pipe gets: outputs wrap the same wherever they are made
        }
        self.results: dict[int, subprocess.CompletedProcess] = {}

    def result(self, index: int) -> subprocess.CompletedProcess:
        for earlier in range(index + 1):
            if earlier not in self.results and self.blocks[earlier].skip is None:
                self.results[earlier] = self.run(self.blocks[earlier])
        return self.results[index]

    def run(self, block: Block) -> subprocess.CompletedProcess:
        if block.kind == "console":
            return self.console(block)
        if block.kind == "shell":
            command = ["bash", "-e", "-o", "pipefail", "-c", block.code]
        else:
            script = self.directory / f".block-{block.line}.py"
            script.write_text(block.code, encoding="utf-8")
            command = [sys.executable, str(script)]
        return subprocess.run(
            command, cwd=self.directory, env=self.env, capture_output=True, text=True, timeout=900
        )

    def console(self, block: Block) -> subprocess.CompletedProcess:
        """Run each ``$`` command; stop at the first that fails."""
        shown, errors = [], []
        for command in block.commands():
            done = subprocess.run(
                ["bash", "-e", "-o", "pipefail", "-c", command],
                cwd=self.directory,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=900,
            )
            output = "".join(f"{line.rstrip()}\n" for line in self.relative(done.stdout).splitlines())
            shown.append(f"$ {command}\n{output}")
            errors.append(done.stderr)
            if done.returncode:
                return subprocess.CompletedProcess(command, done.returncode, "".join(shown), "".join(errors))
        return subprocess.CompletedProcess(block.name, 0, "".join(shown), "".join(errors))

    def relative(self, text: str) -> str:
        """Paths inside the workspace as the reader's checkout shows them: relative."""
        return text.replace(f"{self.directory}{os.sep}", "").replace(str(self.directory), ".")


def same(shown: str, printed: str) -> bool:
    """Whether a console block shows what its commands printed, durations aside."""
    return _DURATION.sub("<time>", shown) == _DURATION.sub("<time>", printed)


def regenerate(readme: Path = README, check: bool = False) -> list[str]:
    """Run every block of ``readme`` in order; rewrite each console block whose output changed
    (unless ``check``). Returns the differences, one diff per block; raises on a block that
    fails."""
    text = readme.read_text(encoding="utf-8")
    blocks = readme_blocks(text)
    lines = text.splitlines(keepends=True)
    differences: list[str] = []
    replaced: list[tuple[int, int, str]] = []
    with tempfile.TemporaryDirectory(prefix="readme-") as directory:
        workspace = Workspace(Path(directory), blocks)
        for index, block in enumerate(blocks):
            if block.skip is not None:
                continue
            result = workspace.result(index)
            if result.returncode:
                raise RuntimeError(
                    f"README block at line {block.line} failed (exit {result.returncode}):\n{block.code}\n"
                    f"stdout:\n{result.stdout[-2000:]}\nstderr:\n{result.stderr[-2000:]}"
                )
            print(f"ran {block.name}", file=sys.stderr)
            if block.kind != "console" or same(block.code, result.stdout):
                continue
            diff = difflib.unified_diff(
                block.code.splitlines(keepends=True),
                result.stdout.splitlines(keepends=True),
                f"README.md:{block.line} (shown)",
                "(printed today)",
            )
            differences.append("".join(diff))
            replaced.append((block.line - 1, len(block.code.splitlines()), result.stdout))
    if replaced and not check:
        for first, count, printed in reversed(replaced):  # from the end: earlier lines keep their place
            lines[first : first + count] = printed.splitlines(keepends=True)
        readme.write_text("".join(lines), encoding="utf-8")
    return differences


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="rewrite nothing; exit 1 if an output differs")
    asked = parser.parse_args()
    differences = regenerate(check=asked.check)
    for difference in differences:
        print(difference)
    changed = len(differences)
    print(f"{changed} shown output(s) {'differ' if asked.check else 'rewritten'}", file=sys.stderr)
    return 1 if asked.check and changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
