"""The ``semsearch`` command's entry point: Ctrl-C at any moment, even while the CLI's modules
load, ends as every interrupt does: one line and exit 130, never a traceback."""

from __future__ import annotations

import importlib.abc
import sys

import pytest

from search import launch


class _StopAtImport(importlib.abc.MetaPathFinder):
    """Ctrl-C pressed while ``search.cli`` is being imported."""

    def find_spec(self, name: str, path: object, target: object = None) -> None:
        if name == "search.cli":
            raise KeyboardInterrupt


def test_ctrl_c_while_the_cli_loads_is_one_line_and_exit_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delitem(sys.modules, "search.cli", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_StopAtImport(), *sys.meta_path])
    with pytest.raises(SystemExit) as stopped:
        launch.main()
    assert stopped.value.code == 130
    assert capsys.readouterr().err == "Interrupted: nothing was changed.\n"


def test_ctrl_c_outside_a_command_is_one_line_and_exit_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import search.cli

    def interrupted() -> None:
        raise KeyboardInterrupt  # e.g. while click parses, before a command runs

    monkeypatch.setattr(search.cli, "main", interrupted)
    with pytest.raises(SystemExit) as stopped:
        launch.main()
    assert stopped.value.code == 130
    assert capsys.readouterr().err == "Interrupted: nothing was changed.\n"


def test_the_installed_command_starts_through_the_guard() -> None:
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["scripts"]["semsearch"] == "search.launch:main"
