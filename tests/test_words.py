"""Word vectors: the tutorial's 'bank' example, and word pieces merged back into words."""

from __future__ import annotations

import numpy as np
import pytest

from indexer.embedding import Embedder
from indexer.errors import SemsearchError
from indexer.words import WORD_STRATEGY, cosine_matrix, word_vectors

SENTENCE = (
    "After stealing money from the bank vault, the bank robber was seen fishing on the "
    "Mississippi river bank."
)


@pytest.fixture(scope="module")
def words_embedder():
    return Embedder(WORD_STRATEGY)


def test_money_banks_are_closer_to_each_other_than_to_the_river_bank(words_embedder):
    words = word_vectors(words_embedder, SENTENCE)
    banks = [v for w, v in words if w == "bank"]
    assert len(banks) == 3
    cos = cosine_matrix(banks)
    assert cos[0, 1] > cos[0, 2] and cos[0, 1] > cos[1, 2]


def test_word_pieces_merge_into_words(words_embedder):
    text = "river embeddings"
    pieces = words_embedder.tokenizer.tokenize(text)
    assert len(pieces) == 5  # river + em ##bed ##ding ##s
    merged = {m: word_vectors(words_embedder, text, m) for m in ("mean", "sum", "first", "last")}
    assert [w for w, _ in merged["mean"]] == ["river", "embeddings"]
    n = len(words_embedder.tokenizer.tokenize("embeddings"))
    np.testing.assert_allclose(merged["sum"][1][1], merged["mean"][1][1] * n, rtol=1e-4, atol=1e-3)
    assert not np.allclose(merged["first"][1][1], merged["last"][1][1])
    np.testing.assert_allclose(merged["first"][0][1], merged["last"][0][1])  # one piece: all agree
    with pytest.raises(SemsearchError, match="merge"):
        word_vectors(words_embedder, text, "median")
