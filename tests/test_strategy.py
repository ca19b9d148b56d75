"""The strategy dataclass: how 'auto' resolves, what is rejected, and the stored round trip."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from indexer.embedding.models import model_fingerprint
from indexer.embedding.strategy import DEFAULT_CHUNK_OVERLAP, DEFAULT_MODEL, FolderSays, Strategy
from indexer.encoders.factory import encoder_for
from indexer.errors import SemsearchError, StrategyConflict
from search.read.engine import check_strategy
from tests.helpers import random_bert

MODEL = {"num_layers": 12, "model_limit": 512}


def test_auto_follows_sentence_transformers_config_else_bert_as_service():
    st = Strategy().resolve(**MODEL, folder=FolderSays("cls", 128))
    assert (st.layers, st.pooling, st.max_length) == ((-1,), "cls", 128)
    plain = Strategy().resolve(**MODEL, folder=FolderSays())
    assert (plain.layers, plain.pooling, plain.max_length) == ((-2,), "mean", 512)


def test_a_folders_own_pooling_of_the_last_layer_takes_its_modules_prompts_and_casing():
    folder = FolderSays("cls", 128, ("2_Dense", "normalize"), 64, True, ("query: ", "passage: "))
    own = Strategy().resolve(**MODEL, folder=folder)
    said = (own.layers, own.pooling, own.max_length, own.modules, own.width, own.lowercase)
    assert said == ((-1,), "cls", 128, ("2_Dense", "normalize"), 64, True)
    assert (own.query_prefix, own.passage_prefix) == ("query: ", "passage: ")
    assert Strategy(layers=(12,)).resolve(**MODEL, folder=folder).modules == ("2_Dense", "normalize")
    other = Strategy(pooling="mean", query_prefix="").resolve(**MODEL, folder=folder)
    said = (
        other.layers,
        other.modules,
        other.width,
        other.lowercase,
        other.query_prefix,
        other.passage_prefix,
    )
    assert said == ((-1,), (), None, True, "", "passage: ")  # the network alone, the folder's casing
    assert Strategy(layers=(-2,)).resolve(**MODEL, folder=folder).modules == ()
    assert Strategy(max_length=600).resolve(num_layers=12, model_limit=1024, folder=folder).max_length == 600


def test_explicit_choices_win_over_auto():
    s = Strategy(layers=(-4, -3, -2, -1), combine="concat", pooling="max", max_length=64)
    resolved = s.resolve(**MODEL, folder=FolderSays("mean", 256))
    assert resolved == replace(s, query_prefix="", passage_prefix="")  # the model has no prompts
    assert resolved.dimension(384) == 4 * 384
    assert Strategy(layers=(-1,), pooling="mean-max").dimension(384) == 768


@pytest.mark.parametrize("layers", [(13,), (-14,)])
def test_layer_out_of_range(layers):
    with pytest.raises(SemsearchError, match="out of range"):
        Strategy(layers=layers).resolve(**MODEL, folder=FolderSays())


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
        Strategy(max_length=32, chunk_overlap=30).resolve(**MODEL, folder=FolderSays())


def test_round_trip_and_conflicts():
    s = Strategy(layers=(-2,), pooling="mean", max_length=128)
    assert Strategy.from_dict(s.to_dict()) == s
    assert s.differences(Strategy(layers=[-2], pooling="mean", max_length=128)) == []
    assert s.differences(Strategy(layers=(-1,), pooling="cls", max_length=128)) == ["layers", "pooling"]
    moved = Strategy(model="/a/model", model_fingerprint="sha256:1")
    assert moved.differences(Strategy(model="/b/copy", model_fingerprint="sha256:1")) == []
    assert moved.differences(Strategy(model="/a/model", model_fingerprint="sha256:2")) == ["model"]
    with pytest.raises(SemsearchError, match="unknown fields"):
        Strategy.from_dict({**s.to_dict(), "future": 1})


def test_requests_that_resolve_to_the_stored_strategy_are_accepted(tiny_model, tmp_path, monkeypatch):
    stored = encoder_for(Strategy(model=tiny_model)).strategy  # auto: layers (-2,), pooling mean
    check_strategy(stored, {"pooling": "auto"})
    check_strategy(stored, {"layers": (-2,), "pooling": "mean", "max_length": 128})
    check_strategy(stored, {"layers": [-2]})
    monkeypatch.chdir(Path(tiny_model).parent)  # the same directory, given relatively
    check_strategy(stored, {"model": Path(tiny_model).name, "pooling": "auto"})
    copy = shutil.copytree(tiny_model, tmp_path / "elsewhere" / "copy")  # the same model moved
    check_strategy(stored, {"model": str(copy)})
    with pytest.raises(StrategyConflict, match="pooling"):
        check_strategy(stored, {"pooling": "cls"})
    with pytest.raises(StrategyConflict, match="layers"):
        check_strategy(stored, {"layers": (-1,)})


def test_different_local_models_conflict_whatever_their_path(tiny_model, tmp_path):
    stored = encoder_for(Strategy(model=tiny_model)).strategy
    assert stored.model_fingerprint and stored.model == str(Path(tiny_model).resolve())
    other = random_bert(tmp_path / "other", seed=1)
    with pytest.raises(StrategyConflict, match="model"):
        check_strategy(stored, {"model": other})
    assert model_fingerprint(other) != stored.model_fingerprint
    assert model_fingerprint(tiny_model) == stored.model_fingerprint  # cached: same answer


@pytest.mark.slow
def test_bundled_model_is_identified_by_name(bundled):
    assert bundled.strategy.model == DEFAULT_MODEL and bundled.strategy.model_fingerprint is None
    check_strategy(bundled.strategy, {"pooling": "auto", "layers": (-1,), "model": DEFAULT_MODEL})


def test_old_stored_strategies_without_a_fingerprint_still_load(tiny_model):
    stored = encoder_for(Strategy(model=tiny_model)).strategy.to_dict()
    del stored["model_fingerprint"]
    old = Strategy.from_dict(stored)
    check_strategy(old, {"model": tiny_model, "pooling": "auto"})
    assert encoder_for(old).strategy.model_fingerprint == model_fingerprint(tiny_model)  # identified again


def test_chunking_default_lives_in_the_strategy():
    assert Strategy().chunked().chunk_overlap == DEFAULT_CHUNK_OVERLAP == 32
    assert Strategy(layers=(-1,)).chunked(8) == Strategy(layers=(-1,), chunk_overlap=8)
    with pytest.raises(SemsearchError, match="overlap"):
        Strategy().chunked(-1)


def test_a_model_changed_on_disk_since_the_index_is_refused(tiny_model, tmp_path):
    """Vectors of another model would be silently wrong: the stored fingerprint must still hold."""
    moved = shutil.copytree(tiny_model, tmp_path / "model")
    stored = encoder_for(Strategy(model=str(moved))).strategy
    random_bert(tmp_path / "retrained", seed=2)
    shutil.copy(tmp_path / "retrained" / "model.safetensors", moved / "model.safetensors")
    with pytest.raises(StrategyConflict, match="changed"):
        encoder_for(stored)
