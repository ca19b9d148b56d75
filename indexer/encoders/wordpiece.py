"""Token ids of plain-ASCII texts for a BERT tokenizer, from its own WordPiece model, each distinct
word once.

Why: the whole ``tokenizers`` pipeline (normaliser, pre-tokeniser, WordPiece, template, an
``Encoding`` per text) costs about 46 µs a short sentence on one core here, while most words
recur from text to text. Where the model is fast (a GPU, a small model) that pipeline sets the
pace of a build and of a server's one-text requests. For a text of printable ASCII a BERT
normaliser only lowercases it (where it is set to) and a BERT pre-tokeniser splits it into runs of
letters and digits and single punctuation characters, so the ids are the template around each
word's WordPiece ids, cut at the window; each word's ids come from the tokenizer's own WordPiece
model and are remembered. Every other text (any character outside printable ASCII and ``\\t\\n\\r``,
the text of an added token such as ``[MASK]``) and every tokenizer of another kind go to
``tokenizers`` whole. ``tests/test_wordpiece.py`` holds the ids equal to the library's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer

MAX_WORDS = 262_144
"""Distinct words remembered; past this the memo starts again (about 50 MB at most), so a server
that reads new words for ever keeps a bounded memory."""

PLAIN = re.compile(r"[\t\n\r\x20-\x7e]*")
"""A text this matches whole is read word by word here: printable ASCII and the whitespace a BERT
normaliser keeps (it drops control characters, and changes other characters' meaning)."""

WORDS = {
    True: re.compile(r"[a-z0-9]+|[^\sa-z0-9]"),
    False: re.compile(r"[A-Za-z0-9]+|[^\sA-Za-z0-9]"),
}
"""A BERT pre-tokeniser's words in plain ASCII, by whether the text was lowercased: runs of
letters and digits, and each other visible character alone (all are punctuation to it)."""


class WordPieceMemo:
    """``ids(texts, fallback)`` for a tokenizer that ``of`` accepts; ``fallback`` tokenises the
    texts it leaves (a list of texts to a list of id lists, the library's batch call)."""

    def __init__(self, tokenizer: Tokenizer, lowercase: bool, added: Sequence[str], max_length: int):
        self.model = tokenizer.model
        self.lowercase = lowercase
        self.words = WORDS[lowercase]
        self.added = re.compile("|".join(map(re.escape, added)), re.IGNORECASE) if added else None
        whole = tokenizer.encode("a", add_special_tokens=True).ids
        bare = tokenizer.encode("a", add_special_tokens=False).ids
        at = next(i for i in range(len(whole)) if whole[i : i + len(bare)] == bare)
        self.lead, self.trail = whole[:at], whole[at + len(bare) :]
        self.room = max_length - len(self.lead) - len(self.trail)
        self.memo: dict[str, list[int]] = {}

    @classmethod
    def of(cls, tokenizer: Tokenizer, max_length: int) -> WordPieceMemo | None:
        """A memo for ``tokenizer`` where it is a BERT one (``BertNormalizer``,
        ``BertPreTokenizer``, ``WordPiece``, truncating on the right), else None."""
        normalizer = tokenizer.normalizer
        parts = (normalizer, tokenizer.pre_tokenizer, tokenizer.model)
        kinds = tuple(type(part).__name__ for part in parts)
        if kinds != ("BertNormalizer", "BertPreTokenizer", "WordPiece"):
            return None
        if (tokenizer.truncation or {}).get("direction", "right").lower() != "right":
            return None
        added = [token.content for token in tokenizer.get_added_tokens_decoder().values() if token.content]
        return cls(tokenizer, bool(normalizer.lowercase), added, max_length)

    def ids(self, texts: Sequence[str], fallback: Callable[[list[str]], list[list[int]]]) -> list[list[int]]:
        """Each text's ids with the template, cut at ``max_length`` as the tokenizer cuts them."""
        found: list[list[int] | None] = [self._plain(text) for text in texts]
        left = [i for i, ids in enumerate(found) if ids is None]
        if left:
            for i, ids in zip(left, fallback([texts[i] for i in left]), strict=True):
                found[i] = ids
        return found  # type: ignore[return-value] - every None was filled above

    def _plain(self, text: str) -> list[int] | None:
        """``text``'s ids, or None where the library must read it."""
        if PLAIN.fullmatch(text) is None or (self.added is not None and self.added.search(text)):
            return None
        memo, ids = self.memo, list(self.lead)
        for word in self.words.findall(text.lower() if self.lowercase else text):
            pieces = memo.get(word)
            if pieces is None:
                pieces = self._pieces(word)
            ids.extend(pieces)
            if len(ids) > self.room + len(self.lead):
                break
        del ids[self.room + len(self.lead) :]
        ids.extend(self.trail)
        return ids

    def _pieces(self, word: str) -> list[int]:
        """``word``'s WordPiece ids from the tokenizer's model, remembered."""
        if len(self.memo) >= MAX_WORDS:
            self.memo.clear()
        pieces = self.memo[word] = [token.id for token in self.model.tokenize(word)]
        return pieces
