"""Word vectors: the tutorial's 'bank' example, and word pieces merged back into words."""

from __future__ import annotations

import numpy as np
import pytest

from indexer.encoders.torch_encoder import TorchEncoder
from indexer.errors import SemsearchError
from indexer.words import WORD_STRATEGY, context, cosine_matrix, occurrences, word_vectors

SENTENCE = (
    "After stealing money from the bank vault, the bank robber was seen fishing on the "
    "Mississippi river bank."
)


@pytest.fixture(scope="module")
def words_embedder():
    return TorchEncoder(WORD_STRATEGY)


@pytest.mark.slow
def test_money_banks_are_closer_to_each_other_than_to_the_river_bank(words_embedder):
    words = word_vectors(words_embedder, SENTENCE)
    banks = [w.vector for w in occurrences(words, "bank")]
    assert len(banks) == 3
    cos = cosine_matrix(banks)
    assert cos[0, 1] > cos[0, 2] and cos[0, 1] > cos[1, 2]


@pytest.mark.slow
def test_word_pieces_merge_into_words(words_embedder):
    text = "river embeddings"
    pieces = words_embedder.tokenizer.tokenize(text)
    assert len(pieces) == 5  # river + em ##bed ##ding ##s
    merged = {m: word_vectors(words_embedder, text, m) for m in ("mean", "sum", "first", "last")}
    assert [w.text for w in merged["mean"]] == ["river", "embeddings"]
    n = len(words_embedder.tokenizer.tokenize("embeddings"))
    vectors = {m: [w.vector for w in words] for m, words in merged.items()}
    np.testing.assert_allclose(vectors["sum"][1], vectors["mean"][1] * n, rtol=1e-4, atol=1e-3)
    assert not np.allclose(vectors["first"][1], vectors["last"][1])
    np.testing.assert_allclose(vectors["first"][0], vectors["last"][0])  # one piece: all agree
    with pytest.raises(SemsearchError, match="merge"):
        word_vectors(words_embedder, text, "median")


@pytest.mark.slow
def test_occurrences_are_labelled_by_their_offsets(words_embedder):
    """ "bank's" is the word "bank" (the tokenizer splits off 's): the first occurrence is the
    money bank, whatever whitespace splitting would say."""
    text = "The bank's vault was robbed. Later we sat on the river bank, fishing."
    banks = occurrences(word_vectors(words_embedder, text), "Bank")
    assert [(w.text, w.start, w.end) for w in banks] == [("bank", 4, 8), ("bank", 55, 59)]
    assert [text[w.start : w.end] for w in banks] == ["bank", "bank"]
    assert context(text, banks[0], width=12) == "The [bank]'s vault was…"
    assert context(text, banks[1], width=12) == "…the river [bank], fishing."
    assert occurrences(word_vectors(words_embedder, text), "money") == []
