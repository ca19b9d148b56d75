"""Contextual word vectors: the tutorial's "bank" example. Word pieces are merged back into the
words they came from (by the fast tokenizer's word ids), from the layers the strategy chooses
(default: sum of the last four, which suits token features better than any single layer)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from indexer.embedding import Embedder
from indexer.errors import BadInput
from indexer.strategy import Strategy

WORD_STRATEGY = Strategy(layers=(-4, -3, -2, -1), combine="sum", pooling="mean")

MERGES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "mean": lambda pieces: pieces.mean(0),
    "sum": lambda pieces: pieces.sum(0),
    "first": lambda pieces: pieces[0],
    "last": lambda pieces: pieces[-1],
}


def word_vectors(embedder: Embedder, text: str, merge: str = "mean") -> list[tuple[str, np.ndarray]]:
    """(word, vector) for each word of ``text``, in order; special tokens are left out."""
    if merge not in MERGES:
        raise BadInput(f"merge must be one of {', '.join(MERGES)}, not {merge!r}")
    if not text.strip():
        raise BadInput("empty text: give a sentence")
    encoded = embedder.tokenizer(
        text,
        truncation=True,
        max_length=embedder.strategy.max_length,
        return_offsets_mapping=True,
        return_tensors="pt",
    )
    with torch.inference_mode():
        output = embedder.network(encoded["input_ids"], encoded["attention_mask"])
        tokens = embedder.head.tokens(output)[0]
    words: dict[int, list[int]] = {}
    for position, word in enumerate(encoded.word_ids(0)):
        if word is not None:
            words.setdefault(word, []).append(position)
    offsets = encoded["offset_mapping"][0].tolist()
    result = []
    for positions in words.values():
        start, end = offsets[positions[0]][0], offsets[positions[-1]][1]
        result.append((text[start:end], MERGES[merge](tokens[positions]).float().numpy()))
    return result


def cosine_matrix(vectors: list[np.ndarray]) -> np.ndarray:
    stacked = np.stack(vectors)
    stacked = stacked / np.linalg.norm(stacked, axis=1, keepdims=True).clip(min=1e-12)
    return stacked @ stacked.T
