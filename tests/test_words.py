"""Word vectors: the tutorial's 'bank' example, and word pieces merged back into words."""

from __future__ import annotations

import numpy as np
import pytest

from indexer.encoders.words import WORD_STRATEGY, Word, context, cosine_matrix, occurrences, word_vectors
from indexer.errors import SemsearchError
from tests.helpers import torch_reference

SENTENCE = (
    "After stealing money from the bank vault, the bank robber was seen fishing on the "
    "Mississippi river bank."
)


@pytest.fixture(scope="module")
def words_embedder():
    return torch_reference(WORD_STRATEGY)


@pytest.mark.slow
def test_money_banks_are_closer_to_each_other_than_to_the_river_bank(words_embedder):
    words = word_vectors(SENTENCE, embedder=words_embedder)
    banks = [w.vector for w in occurrences(words, "bank")]
    assert len(banks) == 3
    cos = cosine_matrix(banks)
    assert cos[0, 1] > cos[0, 2] and cos[0, 1] > cos[1, 2]


@pytest.mark.slow
def test_word_pieces_merge_into_words(words_embedder):
    text = "river embeddings"
    pieces = words_embedder.tokenizer.tokenize(text)
    assert len(pieces) == 5  # river + em ##bed ##ding ##s
    merged = {
        m: word_vectors(text, merge=m, embedder=words_embedder) for m in ("mean", "sum", "first", "last")
    }
    assert [w.text for w in merged["mean"]] == ["river", "embeddings"]
    n = len(words_embedder.tokenizer.tokenize("embeddings"))
    vectors = {m: [w.vector for w in words] for m, words in merged.items()}
    np.testing.assert_allclose(vectors["sum"][1], vectors["mean"][1] * n, rtol=1e-4, atol=1e-3)
    assert not np.allclose(vectors["first"][1], vectors["last"][1])
    np.testing.assert_allclose(vectors["first"][0], vectors["last"][0])  # one piece: all agree
    with pytest.raises(SemsearchError, match="merge"):
        word_vectors(text, merge="median", embedder=words_embedder)


@pytest.mark.slow
def test_occurrences_are_labelled_by_their_offsets(words_embedder):
    """ "bank's" is the word "bank" (the tokenizer splits off 's): the first occurrence is the
    money bank, whatever whitespace splitting would say."""
    text = "The bank's vault was robbed. Later we sat on the river bank, fishing."
    banks = occurrences(word_vectors(text, embedder=words_embedder), "Bank")
    assert [(w.text, w.start, w.end) for w in banks] == [("bank", 4, 8), ("bank", 55, 59)]
    assert [text[w.start : w.end] for w in banks] == ["bank", "bank"]
    assert context(text, banks[0], width=12) == "The [bank]'s vault was…"
    assert context(text, banks[1], width=12) == "…the river [bank], fishing."
    assert occurrences(word_vectors(text, embedder=words_embedder), "money") == []


@pytest.mark.slow
def test_the_facade_takes_a_text_a_word_and_a_strategy(words_embedder, tiny_model):
    """``semsearch.word_vectors(text, word)``: the word's occurrences, read as ``semsearch words``
    reads them (the bundled model, the last four layers summed) unless a strategy says otherwise."""
    import semsearch
    from indexer.embedding.strategy import Strategy

    text = "the river bank and the bank vault"
    banks = semsearch.word_vectors(text, "bank")
    assert [(w.text, w.start) for w in banks] == [("bank", 10), ("bank", 23)]
    reference = occurrences(word_vectors(text, embedder=words_embedder), "bank")
    np.testing.assert_allclose(np.stack([w.vector for w in banks]), np.stack([w.vector for w in reference]))
    assert [w.text for w in semsearch.word_vectors("the river bank")] == ["the", "river", "bank"]
    tiny = semsearch.word_vectors(text, "bank", Strategy(model=tiny_model, layers=(-1,)))
    assert len(tiny) == 2 and tiny[0].vector.shape == (32,)
    with pytest.raises(SemsearchError, match="does not occur"):
        semsearch.word_vectors(text, "money")


def test_a_word_shows_where_it_is_and_its_width_not_its_floats():
    """``repr`` of what ``semsearch.word_vectors`` returns is one short line (it printed 384
    floats), and its docstring names the fields a caller reads."""
    import semsearch

    word = Word("bank", 4, 8, np.full(384, 0.123456, dtype=np.float32))
    assert repr(word) == "Word(text='bank', start=4, end=8, dims=384)"
    assert repr([word]) == "[Word(text='bank', start=4, end=8, dims=384)]"
    documented = semsearch.word_vectors.__doc__
    assert all(f"``.{name}``" in documented for name in ("text", "start", "end", "vector"))
