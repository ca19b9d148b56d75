"""A model's tokenizer as every encoder uses it: texts -> token ids truncated at the strategy's
``max_length``, or (documents with ``chunk_overlap``) split into overlapping windows, in the order
the transformers tokenizer gives them; and the ids of its special tokens (which ``skip_special``
pooling leaves out).

It is also the one place a strategy's prefixes are applied: a query is read as ``query_prefix +
text``, an indexed text as ``passage_prefix + text`` (each window of a chunked one starts with it),
so every encoder, and so every command, embeds a text by its role.

It runs on ``tokenizers`` alone: the torch encoder hands it the loaded transformers tokenizer's
own backend, the ONNX encoder reads the model's ``tokenizer.json``, so indexing and queries
tokenise with one piece of code (``tests/test_backends.py`` holds it to transformers' own output).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from indexer.embedding.head import Tokenized
from indexer.embedding.models import model_file, read_json
from indexer.embedding.strategy import ROLES, Strategy
from indexer.encoders.plain_text import batch_ids, plain_path
from indexer.errors import BadInput

if TYPE_CHECKING:
    from tokenizers import Tokenizer

CHARS_PER_TOKEN = 32
"""More characters than any token of running text covers: a text is cut at ``max_length`` times
this (at a space) before it is tokenised, so a line of any length costs the tokenizer the same."""

PREFIX_SHARE = 0.5
"""The most of the model's window (``max_length`` tokens) a prefix may take: the rest is the
text's. A prefix that took nearly all of it would leave each text a token or two, and give every
text nearly the same vector."""

PROBES = ("international", "understanding")
"""Two one-word texts, as long as most words: after a prefix, they must tokenise apart. A prefix
whose last word is long runs into the text's first word (WordPiece reads a word of more than 100
characters as one unknown token), so a one-word text would read as the prefix alone."""

SPECIAL = ("cls_token", "sep_token", "bos_token", "eos_token")
"""The special tokens a text is wrapped in, by the names tokenizer configs give them."""


def token_text(value: object) -> str | None:
    """A special token as ``special_tokens_map.json`` or ``tokenizer_config.json`` writes it."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class TextTokenizer:
    """``tokenizer`` (this object's own from now on: it is set up for ``strategy``); ``named`` maps
    special-token names (``cls_token``, ``pad_token``...) to their text, as the model's tokenizer
    config does."""

    def __init__(self, tokenizer: Tokenizer, named: Mapping[str, object], strategy: Strategy):
        max_length = int(strategy.max_length or 512)
        self.max_length = max_length
        self.truncating = tokenizer
        self.truncating.no_padding()
        self.truncating.enable_truncation(max_length=max_length)
        self.plain_path = plain_path(self.truncating)
        self.windows: Tokenizer | None = None
        if strategy.chunk_overlap is not None:
            self.windows = tokenizer.__class__.from_str(self.truncating.to_str())
            self.windows.enable_truncation(max_length=max_length, stride=strategy.chunk_overlap)
            self.plain = tokenizer.__class__.from_str(self.truncating.to_str())
            self.plain.no_truncation()
            self.overlap = strategy.chunk_overlap
        found = (
            self.truncating.token_to_id(t) for t in map(token_text, (named.get(k) for k in SPECIAL)) if t
        )
        self.special_ids = [i for i in found if i is not None]
        pad = token_text(named.get("pad_token"))
        self.pad = (self.truncating.token_to_id(pad) if pad else None) or 0
        self.lowercase = strategy.lowercase
        self.prefixes = {role: self._cased(strategy.prefix(role)) for role in ROLES}
        self.alone = {role: self._alone(role, prefix) for role, prefix in self.prefixes.items()}
        """Each role's prefix tokenised alone: what a text the model reads nothing of becomes."""
        self.window_prefix: list[int] = []
        self.lead = 0
        if self.windows is not None:
            self._window_prefix(int(strategy.chunk_overlap or 0))

    def _cased(self, text: str) -> str:
        """``text`` lowercased where the model's folder says its texts are (``do_lower_case``)."""
        return text.lower() if self.lowercase else text

    def _alone(self, role: str, prefix: str) -> list[int]:
        """``prefix``'s ids with the special tokens, refused when it takes more than
        ``PREFIX_SHARE`` of the window or swallows the word written after it."""
        ids = self.truncating.encode(prefix).ids
        if not prefix:
            return ids
        own = len(self.truncating.encode(prefix, add_special_tokens=False).ids)  # cut at max_length
        most = int(self.max_length * PREFIX_SHARE)
        if own > most:
            taken = f"{own} or more" if own >= self.max_length else str(own)
            raise BadInput(
                f"the {role} prefix {prefix[:40]!r} takes {taken} of the model's {self.max_length}-token "
                f"window; a prefix may take at most half ({most}) so the text keeps room: shorten it "
                "(or raise --max-length)"
            )
        first, second = (self.truncating.encode(prefix + word).ids for word in PROBES)
        if first == second and len(first) < self.max_length:
            raise BadInput(
                f"the {role} prefix ending {prefix[-40:]!r} swallows the word after it (the tokenizer "
                "reads its last word and that word as one unknown word): end it with a space"
            )
        return ids

    def _window_prefix(self, overlap: int) -> None:
        """Windows of a chunked passage leave room for its prefix, put after their leading special
        tokens (``documents``)."""
        assert self.windows is not None
        prefix = self.prefixes["passage"]
        if prefix:
            self.window_prefix = self.windows.encode(prefix, add_special_tokens=False).ids
        sample = self.windows.encode("x").ids
        special = set(self.special_ids)
        self.lead = next((i for i, token in enumerate(sample) if token not in special), 0)
        room = self.max_length - len(self.window_prefix)
        if overlap >= room - 2:
            raise BadInput(
                f"chunk overlap {overlap} must be smaller than max_length - 2 less the passage prefix's "
                f"{len(self.window_prefix)} tokens ({room - 2})"
            )
        self.windows.enable_truncation(max_length=room, stride=overlap)
        self.window_length = room

    @classmethod
    def from_files(cls, location: str, strategy: Strategy) -> TextTokenizer:
        """The model's ``tokenizer.json`` and the special tokens its configs name (no transformers)."""
        from tokenizers import Tokenizer

        tokenizer_file = model_file(location, "tokenizer.json")
        if tokenizer_file is None:
            raise BadInput(f"model {strategy.model!r} has no tokenizer.json")
        named = {
            **(read_json(model_file(location, "tokenizer_config.json")) or {}),
            **(read_json(model_file(location, "special_tokens_map.json")) or {}),
        }
        return cls(Tokenizer.from_file(str(tokenizer_file)), named, strategy)

    def ids(self, texts: Sequence[str], role: str = "query") -> list[list[int]]:
        """Each text's token ids as a ``role`` (its prefix before it), truncated at max_length. A
        long text is cut before tokenising (``CHARS_PER_TOKEN``); where its cut reads fewer than
        max_length tokens (long runs of spaces or of characters the tokenizer drops), the rest
        might count, so it is read whole."""
        given = [self._cased(text) for text in texts]
        prefix = self.prefixes[role]
        texts = [prefix + text for text in given] if prefix else given
        bound = self.max_length * CHARS_PER_TOKEN
        cut = [cut_text(text, bound) for text in texts]
        found = self.plain_path.ids(cut) if self.plain_path else batch_ids(self.truncating, cut)
        for i, text in enumerate(texts):
            if len(text) > bound and len(found[i]) < self.max_length:
                found[i] = self.truncating.encode(text).ids
        self._check(given, found, self.alone[role])
        return found

    def _check(self, texts: Sequence[str], ids: Sequence[Sequence[int]], alone: Sequence[int] = ()) -> None:
        """A text that tokenises to the special tokens alone (or to its prefix ``alone``) is empty:
        each such text would get the one vector of ``[CLS] [SEP]``, and tie with every other."""
        special = set(self.special_ids)
        for text, piece in zip(texts, ids, strict=True):
            if all(i in special for i in piece) or list(piece) == list(alone):
                raise BadInput(f"a text has no tokens the model reads: {text[:40]!r} (give some text)")

    def documents(self, texts: Sequence[str]) -> Tokenized:
        """Indexed texts (passages). With ``chunk_overlap``, a long text becomes its first window
        and then its overflowing ones, as the transformers tokenizer orders them, each with the
        passage prefix; else each text truncated. A text past ``max_length * CHARS_PER_TOKEN``
        characters is tokenised a piece at a time and windowed here (``_windows``): memory stays
        flat whatever its length, and the windows are the same."""
        if self.windows is None:
            return Tokenized(self.ids(texts, "passage"), np.arange(len(texts), dtype=np.int64))
        texts = [self._cased(text) for text in texts]
        bound = self.max_length * CHARS_PER_TOKEN
        short = [i for i, text in enumerate(texts) if len(text) <= bound]
        encodings = dict(zip(short, self.windows.encode_batch([texts[i] for i in short]), strict=True))
        per_text = [
            [e.ids for e in (encodings[i], *encodings[i].overflowing)]
            if i in encodings
            else self._windows(text)
            for i, text in enumerate(texts)
        ]
        self._check(texts, [pieces[0] for pieces in per_text])
        ids = [self._prefixed(piece) for pieces in per_text for piece in pieces]
        owners = np.repeat(np.arange(len(texts), dtype=np.int64), [len(pieces) for pieces in per_text])
        return Tokenized(ids, owners)

    def _prefixed(self, window: list[int]) -> list[int]:
        """A chunked passage's window with the passage prefix after its leading special tokens."""
        if not self.window_prefix:
            return window
        return window[: self.lead] + self.window_prefix + window[self.lead :]

    def _windows(self, text: str) -> list[list[int]]:
        """The windows ``tokenizers`` makes of a long text (content of the window length less the
        special tokens, each starting ``chunk_overlap`` before the last one's end, the last the
        first to reach the end), from its content tokenised in pieces cut at whitespace."""
        prefix, suffix = self._template()
        content: list[int] = []
        bound = self.max_length * CHARS_PER_TOKEN
        while text:
            piece = cut_text(text, bound, whole_words=True)
            content.extend(self.plain.encode(piece, add_special_tokens=False).ids)
            text = text[len(piece) :]
        width = self.window_length - len(prefix) - len(suffix)
        step = max(1, width - int(self.overlap))
        out = []
        for start in range(0, max(len(content), 1), step):
            stop = min(start + width, len(content))
            out.append([*prefix, *content[start:stop], *suffix])
            if stop == len(content):
                break
        return out

    def _template(self) -> tuple[list[int], list[int]]:
        """The special tokens the model puts before and after a text's content."""
        whole = self.plain.encode("a").ids
        bare = self.plain.encode("a", add_special_tokens=False).ids
        at = next(i for i in range(len(whole)) if whole[i : i + len(bare)] == bare)
        return whole[:at], whole[at + len(bare) :]


def cut_text(text: str, bound: int, *, whole_words: bool = False) -> str:
    """``text`` up to the last whitespace within ``bound`` characters (a word is never split, so
    the words kept tokenise as in the whole text); one word longer than that is cut at ``bound``,
    or, with ``whole_words`` (pieces of a text read to its end), kept whole to its next space."""
    if len(text) <= bound:
        return text
    for end in range(bound, bound // 2, -1):
        if text[end].isspace():
            return text[:end]
    if not whole_words:
        return text[:bound]
    space = next((i for i in range(bound, len(text)) if text[i].isspace()), len(text))
    return text[:space]
