"""Token vectors -> one sentence vector, in NumPy (so the torch-free query path shares it) or on
torch tensors (fine-tuning, ``indexer.encoders.training``, trains through this very code). Padding
never takes part: every mode reads the mask. Modes are data (a name -> function table), as in
sentence-transformers' ``models/Pooling.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from indexer.errors import BadInput


def namespace(array: Any) -> Any:
    """``numpy`` for a NumPy array, ``torch`` for a torch tensor: the calls used here (``where``,
    ``einsum``, ``concatenate``, ``amax``, ``isin``) mean the same in both. torch is never imported
    here; a tensor means it is loaded already."""
    return sys.modules["torch"] if type(array).__module__.startswith("torch") else np


def as_float(mask: Any, like: Any) -> Any:
    """A boolean mask as numbers of ``like``'s dtype (NumPy ``astype``, torch ``to``)."""
    return mask.to(like.dtype) if namespace(mask) is not np else mask.astype(like.dtype)


def _cls(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return tokens[:, 0]


def _mean(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    weights = as_float(mask, tokens)
    return namespace(tokens).einsum("btd,bt->bd", tokens, weights) / weights.sum(1)[:, None].clip(min=1e-9)


def _max(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    xp = namespace(tokens)
    return xp.amax(xp.where(mask[..., None], tokens, -np.inf), axis=1)


def _mean_max(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return namespace(tokens).concatenate([_mean(tokens, mask), _max(tokens, mask)], axis=-1)


def _mean_sqrt_len(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The sum over the tokens divided by the square root of their count (sentence-transformers'
    ``mean_sqrt_len_tokens``)."""
    weights = as_float(mask, tokens)
    total = namespace(tokens).einsum("btd,bt->bd", tokens, weights)
    return total / (weights.sum(1)[:, None].clip(min=1e-9) ** 0.5)


def _weighted_mean(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Each token weighted by its position (1, 2, ...): later tokens count more
    (sentence-transformers' ``weightedmean``, made for decoders' causal attention)."""
    xp = namespace(tokens)
    weights = as_float(mask, tokens)
    weights = weights * xp.cumsum(xp.ones_like(weights), 1)
    return xp.einsum("btd,bt->bd", tokens, weights) / weights.sum(1)[:, None].clip(min=1e-9)


def _last_token(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The last pooled token of each text (sentence-transformers' ``lasttoken``)."""
    xp = namespace(tokens)
    positions = as_float(mask, tokens)
    last = (positions * xp.cumsum(xp.ones_like(positions), 1)).argmax(1)
    rows = np.arange(len(last)) if xp is np else xp.arange(len(last), device=tokens.device)
    return tokens[rows, last]


MODES: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "cls": _cls,
    "mean": _mean,
    "max": _max,
    "mean-max": _mean_max,
    "mean-sqrt-len": _mean_sqrt_len,
    "weighted-mean": _weighted_mean,
    "last-token": _last_token,
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
        xp = namespace(attention_mask)
        mask = (attention_mask if xp is not np else np.asarray(attention_mask)) != 0
        if self.skip_special and len(self.special_ids):
            special = self.special_ids if xp is np else xp.from_numpy(self.special_ids).to(input_ids.device)
            content = mask & ~xp.isin(input_ids, special)
            mask = xp.where(content.any(1)[:, None], content, mask)
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
