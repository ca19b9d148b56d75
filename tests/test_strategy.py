"""The strategy dataclass: how 'auto' resolves, what is rejected, and the stored round trip."""

from __future__ import annotations

import pytest

from indexer.errors import SemsearchError
from indexer.strategy import Strategy

MODEL = {"num_layers": 12, "model_limit": 512}


def test_auto_follows_sentence_transformers_config_else_bert_as_service():
    st = Strategy().resolve(**MODEL, st_pooling="cls", st_max_length=128)
    assert (st.layers, st.pooling, st.max_length) == ((-1,), "cls", 128)
    plain = Strategy().resolve(**MODEL, st_pooling=None, st_max_length=None)
    assert (plain.layers, plain.pooling, plain.max_length) == ((-2,), "mean", 512)


def test_explicit_choices_win_over_auto():
    s = Strategy(layers=(-4, -3, -2, -1), combine="concat", pooling="max", max_length=64)
    resolved = s.resolve(**MODEL, st_pooling="mean", st_max_length=256)
    assert resolved == s
    assert resolved.dimension(384) == 4 * 384
    assert Strategy(layers=(-1,), pooling="mean-max").dimension(384) == 768


@pytest.mark.parametrize("layers", [(13,), (-14,)])
def test_layer_out_of_range(layers):
    with pytest.raises(SemsearchError, match="out of range"):
        Strategy(layers=layers).resolve(**MODEL, st_pooling=None, st_max_length=None)


def test_invalid_values():
    for bad in (
        {"combine": "avg"},
        {"pooling": "median"},
        {"layers": ()},
        {"max_length": 2},
        {"chunk_overlap": -1},
        {"pooling": "pooler", "layers": (-2,)},
    ):
        with pytest.raises(SemsearchError):
            Strategy(**bad)
    with pytest.raises(SemsearchError, match="overlap"):
        Strategy(max_length=32, chunk_overlap=30).resolve(**MODEL, st_pooling=None, st_max_length=None)


def test_round_trip_and_conflicts():
    s = Strategy(layers=(-2,), pooling="mean", max_length=128)
    assert Strategy.from_dict(s.to_dict()) == s
    assert s.conflicts({"layers": [-2], "pooling": "mean"}) == []
    assert s.conflicts({"layers": (-1,), "pooling": "cls"}) == ["layers", "pooling"]
    with pytest.raises(SemsearchError, match="unknown fields"):
        Strategy.from_dict({**s.to_dict(), "future": 1})
