"""Each error class carries its exit code and HTTP status, as docs/errors.md's table says, and the
CLI and the server read them from the class."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from indexer import errors
from search.cli import cli
from tests.helpers import ROOT, build_faq


def documented_table() -> dict[str, tuple[int, int | None]]:
    """Class name -> (exit code, HTTP status or None) from the table of docs/errors.md."""
    section = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].isdigit():
            for name in re.findall(r"`(\w+)`", cells[1]):
                rows[name] = (int(cells[0]), int(cells[3]) if cells[3] else None)
    return rows


def test_each_class_has_the_documented_exit_code_and_status():
    table = documented_table()
    assert {"BadInput", "FilterError", "StrategyConflict", "IndexLocked", "IndexDamaged", "DiskFull"} <= set(
        table
    )
    for name, (exit_code, status) in table.items():
        kind = getattr(errors, name)
        assert kind.exit_code == exit_code, name
        if status is not None:
            assert kind.http_status == status, name
    assert (errors.DiskFull.exit_code, errors.WorkerFailed.exit_code) == (1, 1)


def test_the_port_in_use_error_is_bad_input(monkeypatch):
    pytest.importorskip("fastapi")
    import socket

    from search.server import listen

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        with pytest.raises(errors.BadInput) as caught:
            listen("127.0.0.1", taken.getsockname()[1])
    finally:
        taken.close()
    assert caught.value.exit_code == 1 and caught.value.http_status == 400


def test_the_cli_exits_with_the_class_exit_code(monkeypatch, tmp_path):
    monkeypatch.setattr(errors.BadInput, "exit_code", 7)
    result = CliRunner().invoke(cli, ["add", str(tmp_path / "no-index"), str(tmp_path / "missing.csv")])
    assert result.exit_code == 7, result.output
    assert result.output.count("\n") == 1 and result.output.startswith("Error: ")


def test_the_server_answers_with_the_class_status(monkeypatch, tmp_path, tiny_model):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from search.server import create_app

    monkeypatch.setattr(errors.FilterError, "http_status", 418)
    with TestClient(create_app(build_faq(tmp_path, tiny_model))) as client:
        answer = client.post("/search", json={"query": "bike", "where": "nosuchfield = 1"})
    assert answer.status_code == 418 and "error" in answer.json()
