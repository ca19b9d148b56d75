"""What ``unstorable`` says of a row of plain strings, the path every ordinary row takes."""

from __future__ import annotations

import pytest

from indexer.reading.storable import UNDECODABLE, unstorable

CUT = "(half of a character, cut in two?)"


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"id": "1", "text": "plain ascii"}, None),
        ({"id": "1", "text": "caf\u00e9 \u2014 \U0001f600"}, None),
        ({"id": "1", "text": "nul\x00inside"}, "binary data: NUL bytes"),
        ({"id\x00": "1", "text": "a NUL in a name"}, "binary data: NUL bytes"),
        ({"id": "1", "text": "caf\u00e9\x00"}, "binary data: NUL bytes"),
        ({"id": "1", "text": "bad byte \udcff"}, UNDECODABLE),
        ({"id": "1", "text": "half \ud83d"}, f"invalid text: lone surrogate \\ud83d {CUT}"),
    ],
)
def test_a_row_of_strings_is_judged_by_every_name_and_value(row: dict, reason: str | None) -> None:
    assert unstorable(row) == reason


def test_a_nul_below_the_top_level_is_found() -> None:
    assert unstorable({"id": "1", "meta": {"tags": ["ok", "no\x00"]}}) == "binary data: NUL bytes"
