"""Plain texts tokenised without the normaliser's per-character work, to the same ids.

A BERT tokenizer's normaliser (``BertNormalizer``) removes control characters, reads tabs and line
ends as spaces, spaces out CJK characters, strips accents and lowercases, keeping every character's
alignment to the original as it goes: a quarter to a third of the Rust tokenizer's time on short
English texts (``docs/performance.md``). On a text of printable ASCII alone (``PLAIN``) every step
but the lowercasing leaves the text as it is. ``PlainPath`` hands such texts to a twin of the
tokenizer whose normaliser only lowercases (where the model's does): the twin reads the same
normalised text, so it gives the same ids (only the character offsets, which nothing here reads,
could differ). Every other text goes through the tokenizer as it is. The lowercasing stays in the
normaliser, not in Python: added tokens such as ``[SEP]`` are matched on the text before it
(``tests/test_plain_text.py``).

The twin is made only where that holds: the normaliser is a ``BertNormalizer`` and every added
token matched on normalised text is itself plain (``plain_path``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer

PLAIN = re.compile(r"[\x20-\x7e]*")
"""A plain text: printable ASCII (no control character, tab or line end, nothing past ASCII)."""


def batch_ids(tokenizer: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Each text's ids by one batch call. ``encode_batch_fast`` (tokenizers >= 0.20) gives the
    same ids as ``encode_batch`` without tracking each token's character offsets."""
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    return [e.ids for e in encode(texts)]


FEW = 64
"""Batches of fewer texts go through the tokenizer as it is: its twin (a copy, some 30 ms) pays
off over the batches of a build or an ``encode``, not over one query's text."""


class PlainPath:
    """``tokenizer``'s ids, plain texts read by its twin whose normaliser at most lowercases
    (module docstring); the twin is made at the first batch of ``FEW`` texts or more."""

    def __init__(self, tokenizer: Tokenizer, lowercase: bool):
        self.tokenizer, self.lowercase = tokenizer, lowercase
        self._twin: Tokenizer | None = None

    @property
    def twin(self) -> Tokenizer:
        if self._twin is None:
            from tokenizers import Tokenizer, normalizers

            twin = Tokenizer.from_str(self.tokenizer.to_str())
            twin.normalizer = normalizers.Lowercase() if self.lowercase else None
            self._twin = twin
        return self._twin

    def ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's ids, as ``tokenizer`` gives them: one batch call where every text is
        plain (the common case) or none is, else one for each kind, put back in order."""
        if len(texts) < FEW:
            return batch_ids(self.tokenizer, texts)
        plain = PLAIN.fullmatch
        easy = [i for i, text in enumerate(texts) if plain(text)]
        if len(easy) == len(texts):
            return batch_ids(self.twin, texts)
        if not easy:
            return batch_ids(self.tokenizer, texts)
        found: list[list[int]] = [[] for _ in texts]
        taken = set(easy)
        hard = [i for i in range(len(texts)) if i not in taken]
        for at, ids in zip(easy, batch_ids(self.twin, [texts[i] for i in easy]), strict=True):
            found[at] = ids
        for at, ids in zip(hard, batch_ids(self.tokenizer, [texts[i] for i in hard]), strict=True):
            found[at] = ids
        return found


def plain_path(tokenizer: Tokenizer) -> PlainPath | None:
    """``tokenizer`` with its plain path, or None where its normaliser could change a plain text
    beyond lowercasing it (any but ``BertNormalizer``) or an added token matched on normalised
    text is not itself plain."""
    from tokenizers import normalizers

    normalizer = tokenizer.normalizer
    if not isinstance(normalizer, normalizers.BertNormalizer):
        return None
    for added in tokenizer.get_added_tokens_decoder().values():
        if added.normalized and not PLAIN.fullmatch(added.content):
            return None
    return PlainPath(tokenizer, bool(normalizer.lowercase))
