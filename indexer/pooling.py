"""Token vectors -> one sentence vector, in NumPy (so the torch-free query path shares it).
Padding never takes part: every mode reads the mask. Modes are data (a name -> function table), as
in sentence-transformers' ``models/Pooling.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from indexer.errors import BadInput


def _cls(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return tokens[:, 0]


def _mean(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    weights = mask[..., None].astype(tokens.dtype)
    return np.einsum("btd,bt->bd", tokens, weights[..., 0]) / np.maximum(weights.sum(1), 1e-9)


def _max(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.where(mask[..., None], tokens, -np.inf).max(1)


def _mean_max(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.concatenate([_mean(tokens, mask), _max(tokens, mask)], axis=-1)


MODES: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "cls": _cls,
    "mean": _mean,
    "max": _max,
    "mean-max": _mean_max,
}


class Pooling:
    """Pool ``[batch, tokens, hidden]`` to ``[batch, dim]`` over real (and optionally non-special) tokens."""

    def __init__(self, mode: str, *, skip_special: bool = False, special_ids: Iterable[int] = ()):
        if mode not in (*MODES, "pooler"):
            raise BadInput(f"unknown pooling {mode!r}")
        self.mode = mode
        self.skip_special = skip_special
        self.special_ids = np.array(sorted(set(special_ids)), dtype=np.int64)

    def token_mask(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """Which tokens pool: real ones, minus [CLS]/[SEP] when asked (never an empty set)."""
        mask = np.asarray(attention_mask).astype(bool)
        if self.skip_special and len(self.special_ids):
            content = mask & ~np.isin(input_ids, self.special_ids)
            mask = np.where(content.any(axis=1, keepdims=True), content, mask)
        return mask

    def __call__(
        self,
        tokens: np.ndarray | None,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        pooler_output: np.ndarray | None = None,
    ) -> np.ndarray:
        if self.mode == "pooler":
            if pooler_output is None:
                raise BadInput("this model has no pooler output: choose another pooling")
            return pooler_output
        assert tokens is not None, "token vectors are needed for every mode but pooler"
        return MODES[self.mode](tokens, self.token_mask(input_ids, attention_mask))
