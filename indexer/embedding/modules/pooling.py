"""The Pooling module: token vectors -> one sentence vector, in NumPy (so the torch-free query
path shares it) or on torch tensors (fine-tuning, ``indexer.encoders.training``, trains through
this very code), and as ONNX operators (``indexer.encoders.standalone``). Padding never takes
part: every mode reads the mask. Modes are data (a name -> function table), as in
sentence-transformers' ``models/Pooling.py``; ``last-token`` is a decoder's. Its config.json is
read in either format sentence-transformers writes (before version 5: ``pooling_mode_*_token``
flags; from 5: ``pooling_mode``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from indexer.embedding.modules.base import Graph, Listed, Reading, namespace
from indexer.errors import BadInput

POOLING_MODES = {
    "cls": "cls",
    "mean": "mean",
    "max": "max",
    "mean_sqrt_len_tokens": "mean-sqrt-len",
    "weightedmean": "weighted-mean",
    "lasttoken": "last-token",
    ("mean", "max"): "mean-max",
}
"""sentence-transformers' pooling modes (one, or the pair it concatenates) -> semsearch's."""
LEGACY_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
"""The flags folders saved before sentence-transformers 5 name their pooling with."""


def as_float(mask: Any, like: Any) -> Any:
    """A boolean mask as numbers of ``like``'s dtype (NumPy ``astype``, torch ``to``)."""
    return mask.to(like.dtype) if namespace(mask) is not np else mask.astype(like.dtype)


def _cls(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return tokens[:, 0]


def _summed(tokens: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``[batch, tokens, width]`` summed over the tokens with ``[batch, tokens]`` weights: one
    batched matrix product (twice einsum's speed on a cheap model's small passes)."""
    return (weights[:, None, :] @ tokens)[:, 0]


def _mean(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    weights = as_float(mask, tokens)
    return _summed(tokens, weights) / weights.sum(1)[:, None].clip(min=1e-9)


def _max(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    xp = namespace(tokens)
    return xp.amax(xp.where(mask[..., None], tokens, -np.inf), axis=1)


def _mean_max(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return namespace(tokens).concatenate([_mean(tokens, mask), _max(tokens, mask)], axis=-1)


def _mean_sqrt_len(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The sum over the tokens divided by the square root of their count (sentence-transformers'
    ``mean_sqrt_len_tokens``)."""
    weights = as_float(mask, tokens)
    total = _summed(tokens, weights)
    return total / (weights.sum(1)[:, None].clip(min=1e-9) ** 0.5)


def _weighted_mean(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Each token weighted by its position (1, 2, ...): later tokens count more
    (sentence-transformers' ``weightedmean``, made for decoders' causal attention)."""
    xp = namespace(tokens)
    weights = as_float(mask, tokens)
    weights = weights * xp.cumsum(xp.ones_like(weights), 1)
    return _summed(tokens, weights) / weights.sum(1)[:, None].clip(min=1e-9)


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


def _mode(config: dict[str, Any]) -> str | None:
    """The semsearch pooling of a Pooling module's config, either format; None if it has none."""
    mode = config.get("pooling_mode")
    if mode is None:
        modes = tuple(LEGACY_FLAGS[k] for k in LEGACY_FLAGS if config.get(k)) or ("mean",)
        mode = modes[0] if len(modes) == 1 else modes
        if set(modes) == {"mean", "max"}:
            mode = ("mean", "max")  # their concatenation's order changes no cosine
    if isinstance(mode, list):
        mode = mode[0] if len(mode) == 1 else tuple(mode)
    return POOLING_MODES.get(mode) if isinstance(mode, (str, tuple)) else None


class Pooling:
    """Pool ``[batch, tokens, hidden]`` to ``[batch, dim]`` over real (and optionally non-special)
    tokens. Built from the strategy's pooling, which a folder's only proposes (``read``)."""

    @classmethod
    def read(cls, folder: Reading, listed: Listed) -> str | None:
        """The folder's pooling (``pooling_mode`` or the flags), and whether it leaves the
        prompt's tokens out (``include_prompt``); one Pooling, after the network, before the
        modules after it."""
        if folder.pooling is not None or not folder.network:
            return listed.cannot()
        folder.pooling = _mode(listed.config)
        if folder.pooling is None:
            return f"{listed.where} pools as {listed.config.get('pooling_mode')}, which semsearch cannot"
        folder.prompt_left_out = listed.config.get("include_prompt", True) is False
        folder.said.append(f"pooling {folder.pooling}")
        return None

    def __init__(
        self, mode: str, *, skip_special: bool = False, special_ids: Iterable[int] = (), width: int = 0
    ):
        if mode not in (*MODES, "pooler"):
            raise BadInput(f"unknown pooling {mode!r}")
        self.mode, self.width = mode, width
        self.skip_special = skip_special
        self.special_ids = np.array(sorted(set(special_ids)), dtype=np.int64)

    def save(self, folder: Path) -> None:
        """Its mode as the flags every sentence-transformers version reads, and the token width
        it pools (``width``; ``pooler`` is the network's output, no module's)."""
        modes = next(st for st, mode in POOLING_MODES.items() if mode == self.mode)
        modes = (modes,) if isinstance(modes, str) else modes
        flags = {flag: name in modes for flag, name in LEGACY_FLAGS.items()}
        said = {"word_embedding_dimension": self.width, **flags}
        (folder / "config.json").write_text(json.dumps(said, indent=2), encoding="utf-8")

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

    def export(self, graph: Graph, tokens: str) -> str:
        """The ONNX form of ``__call__`` (but ``pooler``, which is the network's output):
        ``[batch, sequence, width]`` -> ``[batch, width]``, over the graph's ``input_ids`` and
        ``attention_mask``."""
        return _pooled(graph, self.mode, tokens, self._mask(graph))

    def _mask(self, graph: Graph) -> str:
        """``token_mask``: the real tokens, minus the special ones when asked (never none)."""
        mask = graph.op("Cast", ["attention_mask"], to=graph.BOOL)
        if not (self.skip_special and len(self.special_ids)):
            return mask
        special = None
        for token in self.special_ids:
            equal = graph.op("Equal", ["input_ids", graph.const(np.int64(token))])
            special = equal if special is None else graph.op("Or", [special, equal])
        assert special is not None
        content = graph.op("And", [mask, graph.op("Not", [special])])
        found = graph.op("ReduceMax", [graph.op("Cast", [content], to=graph.FLOAT)], axes=[1], keepdims=1)
        some = graph.op("Greater", [found, graph.const(np.float32(0))])
        # content where a row has some, else the whole mask (content lies inside it; no bool Where in ORT)
        return graph.op("Or", [content, graph.op("And", [mask, graph.op("Not", [some])])])


def _pooled(graph: Graph, mode: str, tokens: str, mask: str) -> str:
    """``MODES`` as ONNX operators."""
    if mode == "cls":
        return graph.op("Gather", [tokens, graph.const(np.int64(0))], axis=1)
    if mode == "mean":
        weights = graph.op("Cast", [mask], to=graph.FLOAT)
        tokens_axis = graph.const(np.array([1], np.int64))
        spread = graph.op("Unsqueeze", [weights, graph.const(np.array([2], np.int64))])
        total = graph.op("ReduceSum", [graph.op("Mul", [tokens, spread]), tokens_axis], keepdims=0)
        count = graph.op("ReduceSum", [weights, tokens_axis], keepdims=1)
        return graph.op("Div", [total, graph.op("Max", [count, graph.const(np.float32(1e-9))])])
    if mode == "max":
        spread = graph.op("Unsqueeze", [mask, graph.const(np.array([2], np.int64))])
        kept = graph.op("Where", [spread, tokens, graph.const(np.float32(-np.inf))])
        return graph.op("ReduceMax", [kept], axes=[1], keepdims=0)
    if mode == "mean-max":
        pair = [_pooled(graph, "mean", tokens, mask), _pooled(graph, "max", tokens, mask)]
        return graph.op("Concat", pair, axis=-1)
    weights = graph.op("Cast", [mask], to=graph.FLOAT)
    if mode == "mean-sqrt-len":
        total = _weighted_sum(graph, tokens, weights)
        count = graph.op("ReduceSum", [weights, graph.const(np.array([1], np.int64))], keepdims=1)
        floor = graph.op("Max", [count, graph.const(np.float32(1e-9))])
        return graph.op("Div", [total, graph.op("Sqrt", [floor])])
    ones = graph.op("ConstantOfShape", [graph.op("Shape", [weights])], value=np.ones(1, np.float32))
    places = graph.op("CumSum", [ones, graph.const(np.int64(1))])
    positions = graph.op("Mul", [weights, places])  # 1, 2, ... where the mask is
    if mode == "last-token":  # the one token at the last position
        last = graph.op("ReduceMax", [positions], axes=[1], keepdims=1)
        at_last = graph.op("Cast", [graph.op("Equal", [positions, last])], to=graph.FLOAT)
        return _weighted_sum(graph, tokens, at_last)
    assert mode == "weighted-mean", mode
    count = graph.op("ReduceSum", [positions, graph.const(np.array([1], np.int64))], keepdims=1)
    total = _weighted_sum(graph, tokens, positions)
    return graph.op("Div", [total, graph.op("Max", [count, graph.const(np.float32(1e-9))])])


def _weighted_sum(graph: Graph, tokens: str, weights: str) -> str:
    """``[batch, sequence, width]`` tokens summed with ``[batch, sequence]`` weights."""
    spread = graph.op("Unsqueeze", [weights, graph.const(np.array([2], np.int64))])
    return graph.op(
        "ReduceSum", [graph.op("Mul", [tokens, spread]), graph.const(np.array([1], np.int64))], keepdims=0
    )
