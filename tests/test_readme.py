"""Every shell, Python and console example of README.md runs, in order, on the files shipped in
``data/`` (``tests/readme_examples.py`` says how), and every output the README shows is what its
command prints today: ``make readme`` rewrites them, this fails where they went stale.

Any block that fails fails its test. Sections pasted into the README later are run the same way,
with nothing to register.
"""

from __future__ import annotations

import re

import pytest

from tests.readme_examples import README, Workspace, readme_blocks, same

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
            "```console",
            "$ semsearch query idx \\",
            "    'a question'",
            "printed",
            "$ ls",
            "```",
        ]
    )
    blocks = readme_blocks(text)
    assert [(b.kind, b.skip, b.code) for b in blocks] == [
        ("shell", "needs a server", "semsearch serve x\n"),
        ("python", None, "print(1)\n"),
        ("console", None, "$ semsearch query idx \\\n    'a question'\nprinted\n$ ls\n"),
    ]
    assert blocks[2].commands() == ["semsearch query idx \\\n    'a question'", "ls"]
    with pytest.raises(ValueError, match="begins with"):
        readme_blocks("```console\noutput without its command\n```")
    with pytest.raises(ValueError, match="skip REASON"):
        readme_blocks("<!-- readme-test: skip -->\n```bash\nls\n```")
    with pytest.raises(ValueError, match="just above a code block"):
        readme_blocks("<!-- readme-test: skip why -->\ntext\n```bash\nls\n```")
    assert sum(b.skip is None for b in BLOCKS) >= 5, "the README's runnable examples were not found"
    assert any(b.kind == "console" for b in BLOCKS), "the README shows no output made by a command"


def test_a_shown_output_is_compared_durations_aside():
    assert same("$ tune\n86.36 after (0.4 min, 12 s)\n", "$ tune\n86.36 after (1.0 min, 3.5 s)\n")
    assert not same("$ tune\n86.36 after\n", "$ tune\n90.91 after\n")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Workspace:
    return Workspace(tmp_path_factory.mktemp("readme"), BLOCKS)


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
    if block.kind == "console":
        assert same(block.code, result.stdout), (
            f"README line {block.line} shows an output its command no longer prints: run `make readme`\n"
            f"shown:\n{block.code}\nprinted today:\n{result.stdout}"
        )


_OUTPUT = re.compile(r"(?:--csv|--heatmap|-o|--output|>)\s*(\S+)")


def test_examples_write_only_where_they_run():
    """A sweep's --csv, an index's -o, a redirect: relative paths inside the directory the example
    runs in, never over tracked files such as docs/ (nor outside the checkout)."""
    for block in BLOCKS:
        code = "\n".join(block.commands()) if block.kind == "console" else block.code
        for line in code.splitlines():
            for target in _OUTPUT.findall(line.split(" #")[0]):
                target = target.strip("'\"")
                assert not target.startswith(("/", "..", "docs/", "data/", "~")), f"{block.name}: {line}"


@pytest.mark.slow
def test_make_readme_rewrites_a_stale_output_once(tmp_path):
    """``regenerate`` (what ``make readme`` runs) rewrites a console block from what its commands
    print, in place and nothing else; a second run finds nothing to change."""
    from tests.readme_examples import regenerate

    readme = tmp_path / "README.md"
    counted = "```console\n$ wc -l < f.txt\n7\n```\n"
    timed = "```console\n$ echo took 3 s\ntook 1 s\n```\n"  # durations aside, what it prints
    stale = f"# t\n\n```bash\nprintf 'a\\nb\\n' > f.txt\n```\n\n{counted}\n{timed}\ntail\n"
    readme.write_text(stale, encoding="utf-8")
    assert len(regenerate(readme, check=True)) == 1 and readme.read_text(encoding="utf-8") == stale
    assert len(regenerate(readme)) == 1
    assert readme.read_text(encoding="utf-8") == stale.replace("\n7\n", "\n2\n")
    assert regenerate(readme) == []


def test_the_readme_stays_a_users_page_under_300_lines():
    """Benchmarks, profiles and decisions live in docs/: the README says what to run and what to
    expect, and links the rest. Its first block is the two commands that work on a fresh machine."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 300
    first = readme_blocks(text)[0] if readme_blocks(text) else None
    assert first is not None and "make demo" in first.code and "make test" in first.code
