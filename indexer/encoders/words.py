"""Contextual word vectors: the tutorial's "bank" example. Word pieces are merged back into the
words they came from (by the fast tokenizer's word ids), from the layers the strategy chooses
(default: sum of the last four, which suits token features better than any single layer).

Each word keeps its character offsets in the text, so an occurrence is found and shown by where the
tokenizer put it ("bank's" holds the word "bank"), never by splitting the text again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from indexer.embedding.strategy import Strategy
from indexer.errors import BadInput

if TYPE_CHECKING:
    from indexer.encoders.options import EmbeddingOptions
    from indexer.encoders.torch_encoder import TorchEncoder

WORD_STRATEGY = Strategy(layers=(-4, -3, -2, -1), combine="sum", pooling="mean", backend="torch")
"""On torch: ``words`` loads the model anyway (its tokenizer's word ids) for one text, where exporting
a graph of four layers first would only add time (the vectors are the same)."""

MERGES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "mean": lambda pieces: pieces.mean(0),
    "sum": lambda pieces: pieces.sum(0),
    "first": lambda pieces: pieces[0],
    "last": lambda pieces: pieces[-1],
}


@dataclass(frozen=True)
class Word:
    """One word of a text: ``text`` (its characters, the text's ``[start:end]``), ``start`` and
    ``end`` (character offsets in the text) and ``vector`` (its contextual vector, float32, the
    model's hidden size)."""

    text: str
    start: int
    end: int
    vector: np.ndarray

    def __repr__(self) -> str:
        """The word, where it is and its width; not the hundreds of floats of its vector."""
        return f"Word(text={self.text!r}, start={self.start}, end={self.end}, dims={self.vector.shape[-1]})"


def word_encoder(strategy: Strategy | None = None, options: EmbeddingOptions | None = None) -> TorchEncoder:
    """The torch encoder word vectors read (``strategy`` None: ``WORD_STRATEGY``), from the factory,
    where ``options`` place it (default: the CPU)."""
    from indexer.encoders.factory import torch_encoder
    from indexer.encoders.options import EmbeddingOptions

    options = options or EmbeddingOptions(device="cpu")
    return torch_encoder(replace(strategy or WORD_STRATEGY, backend="torch"), options.checked())


def word_vectors(
    text: str,
    word: str | None = None,
    strategy: Strategy | None = None,
    *,
    merge: str = "mean",
    embedder: TorchEncoder | None = None,
) -> list[Word]:
    """Each word of ``text`` in order, or only the occurrences of ``word``, as a list of ``Word``:
    ``.text`` (the word as the text writes it), ``.start`` / ``.end`` (its character offsets:
    ``text[start:end]``) and ``.vector`` (its contextual vector, a float32 array of the model's
    hidden size: 384 for the bundled model); special tokens are left out. ``strategy`` None reads
    ``WORD_STRATEGY`` (the bundled model); a loaded ``embedder`` serves many calls."""
    if merge not in MERGES:
        raise BadInput(f"merge must be one of {', '.join(MERGES)}, not {merge!r}")
    if not text.strip():
        raise BadInput("empty text: give a sentence")
    if embedder is None:
        embedder = word_encoder(strategy)
    words = _words(embedder, text, merge)
    if word is None:
        return words
    found = occurrences(words, word)
    if not found:
        raise BadInput(f"the word {word!r} does not occur in the text")
    return found


def _words(embedder: TorchEncoder, text: str, merge: str) -> list[Word]:
    """Every word of ``text`` with its word pieces' token vectors merged by ``merge``."""
    encoded = embedder.tokenizer(
        text,
        truncation=True,
        max_length=embedder.strategy.max_length,
        return_offsets_mapping=True,
        return_tensors="np",
    )
    ids, attention = (encoded[k].astype(np.int64) for k in ("input_ids", "attention_mask"))
    tokens = embedder.token_vectors(ids, attention)[0]
    words: dict[int, list[int]] = {}
    for position, word in enumerate(encoded.word_ids(0)):
        if word is not None:
            words.setdefault(word, []).append(position)
    offsets = encoded["offset_mapping"][0].tolist()
    result = []
    for positions in words.values():
        start, end = offsets[positions[0]][0], offsets[positions[-1]][1]
        result.append(Word(text[start:end], start, end, MERGES[merge](tokens[positions]).astype(np.float32)))
    return result


def occurrences(words: Sequence[Word], word: str) -> list[Word]:
    """The words equal to ``word`` (ignoring case), in text order."""
    wanted = word.strip().lower()
    return [w for w in words if w.text.lower() == wanted]


def context(text: str, word: Word, width: int = 30) -> str:
    """The occurrence in brackets with about ``width`` characters each side, cut at whitespace
    ("…" where cut), to tell occurrences of one word apart."""
    start, end = max(0, word.start - width), min(len(text), word.end + width)
    left, right = text[start : word.start], text[word.end : end]
    if start > 0:
        cut = left.split(None, 1)  # drop a word cut in half, unless it is all there is
        left = "…" + (cut[1] if len(cut) == 2 and not text[start - 1].isspace() else left)
    if end < len(text):
        cut = right.rsplit(None, 1)
        right = (cut[0] if len(cut) == 2 and not text[end].isspace() else right) + "…"
    return " ".join(f"{left}[{text[word.start : word.end]}]{right}".split())


def cosine_matrix(vectors: list[np.ndarray]) -> np.ndarray:
    stacked = np.stack(vectors)
    stacked = stacked / np.linalg.norm(stacked, axis=1, keepdims=True).clip(min=1e-12)
    return stacked @ stacked.T
