"""The ranked table a person reads: a hit's text whole, then its notes."""

from __future__ import annotations

import pytest

from search.cli.printing import print_hits
from search.read.requests import Hit

LONG = " ".join(f"word{i}" for i in range(40))


@pytest.mark.parametrize("answered", [True, False])
def test_a_wrapped_text_is_whole_before_its_notes(capsys, monkeypatch, answered):
    monkeypatch.setenv("COLUMNS", "80")
    hit = Hit(
        rank=1,
        id="faq001",
        score=0.5,
        text=LONG,
        fields={"category": "x"},
        answered=answered,
        confidence=0.42,
    )
    print_hits("q", [hit])
    lines = capsys.readouterr().out.splitlines()
    note = next(i for i, line in enumerate(lines) if "answered:" in line)
    text_lines = [i for i, line in enumerate(lines) if "word" in line]
    assert len(text_lines) > 1, "the text should wrap at 80 columns"
    assert text_lines == list(range(text_lines[0], text_lines[-1] + 1)), "the text is one block"
    assert note == text_lines[-1] + 1
    assert "word39" in lines[text_lines[-1]]


def test_a_nested_field_prints_as_json(capsys):
    hit = Hit(rank=1, id="a", score=0.5, text="t", fields={"metadata": {"k": [1, None]}, "tags": ["x"]})
    print_hits("q", [hit])
    out = capsys.readouterr().out
    assert 'metadata: {"k": [1, null]}' in out and 'tags: ["x"]' in out
