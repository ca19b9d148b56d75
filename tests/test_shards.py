"""Shards embedded apart and merged equal one build: the path for embedding on many machines."""

from __future__ import annotations

import numpy as np
import pytest

from indexer import Strategy, build_index
from indexer.corpus import read_corpus
from indexer.errors import SemsearchError
from indexer.shards import embed_shard, merge_shards
from indexer.store import open_index
from search import SearchEngine
from tests.conftest import DATA


def test_merged_shards_answer_like_a_single_build(tmp_path, tiny_model):
    corpus = read_corpus(DATA / "demo_faq.csv", text_fields=["question", "answer"])
    strategy = Strategy(model=tiny_model)
    shards = [embed_shard(corpus.entries[i::3], tmp_path / f"shard-{i}", strategy) for i in range(3)]
    assert merge_shards(shards, tmp_path / "merged") == len(corpus.entries)
    build_index(DATA / "demo_faq.csv", tmp_path / "single", strategy, text_fields=["question", "answer"])
    merged, single = SearchEngine(tmp_path / "merged"), SearchEngine(tmp_path / "single")
    for question in ("can I pay with apple pay", "lost my phone on a bike", "helmet rules"):
        a, b = merged.search(question, k=5), single.search(question, k=5)
        assert [h.id for h in a] == [h.id for h in b]
        np.testing.assert_allclose([h.score for h in a], [h.score for h in b], atol=1e-5)
    assert open_index(tmp_path / "merged").meta["count"] == len(corpus.entries)
    other = embed_shard(corpus.entries[:5], tmp_path / "other", Strategy(model=tiny_model, layers=(-1,)))
    with pytest.raises(SemsearchError, match="another strategy"):
        merge_shards([shards[0], other], tmp_path / "bad")
    with pytest.raises(SemsearchError, match="share entry ids"):
        merge_shards([shards[0], shards[0]], tmp_path / "bad")
