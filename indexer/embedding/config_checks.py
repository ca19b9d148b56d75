"""The settings of a ``config.json`` that transformers would run into a division by zero, a mask
that sees nothing, or a multi-line validation error of its own: checked when the folder is read
(``indexer.embedding.models.check_model``), so such a model is refused in one line naming the
setting, before anything is built, rather than run into an error or vectors the exported graph does
not reproduce. The sizes its weights decide are ``check_sizes``'."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from indexer.errors import BadInput

HEADS = ("num_attention_heads", "n_heads")
"""Where a config says its attention heads (DistilBERT: ``n_heads``)."""
WIDTHS = ("hidden_size", "dim")
HEAD_WIDTHS = ("head_dim", "attention_head_size")
"""Where a config says the width of one head; where none is said it is the width split in heads."""
COUNTS = (*HEADS, "num_key_value_heads", *HEAD_WIDTHS, "sliding_window")
"""Settings that, where said (not null), must be counts: a decoder's window of 0 tokens or fewer
is a mask transformers and the exported graph build differently, and no vector of either is the
model's."""
SOFTCAPS = ("attn_logit_softcapping", "final_logit_softcapping")
"""Gemma's soft caps (``tanh(x / cap) * cap``): null for none, else a positive decimal number, the
type transformers takes."""


SHAPE_KEYS = {"num_hidden_layers": ("num_hidden_layers", "n_layers"), "hidden_size": ("hidden_size", "dim")}
"""Where a ``config.json`` says its block count and width: DistilBERT writes ``n_layers`` and
``dim`` (transformers maps them onto the usual names; the JSON file does not)."""


def is_count(value: object) -> bool:
    """A positive int, not a bool: what a size in a ``config.json`` must be."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def config_shape(config: Mapping[str, Any]) -> tuple[int, int] | None:
    """A ``config.json``'s transformer block count and hidden width, or None where it does not
    say both as counts (``indexer.embedding.models.check_model`` refuses a model whose config says
    another thing)."""
    found = [next((config[k] for k in keys if k in config), None) for keys in SHAPE_KEYS.values()]
    return (found[0], found[1]) if all(is_count(value) for value in found) else None


def _said(config: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[str, Any] | None:
    return next(((key, config[key]) for key in keys if config.get(key) is not None), None)


def check_settings(model: str, config: Mapping[str, Any]) -> None:
    """Refuse, in one line, a ``config.json`` whose attention heads, window or soft caps
    transformers cannot run as said (see the module doc)."""

    def refused(key: str, why: str) -> BadInput:
        return BadInput(f"cannot load model {model!r}: config.json says {key} {config[key]!r}, {why}")

    for key in COUNTS:
        if config.get(key) is not None and not is_count(config[key]):
            raise refused(key, "not a count")
    for key in SOFTCAPS:
        value = config.get(key)
        if value is not None and not (isinstance(value, float) and value > 0):
            raise refused(key, "not a positive decimal number (null for no cap)")
    heads, shared = _said(config, HEADS), config.get("num_key_value_heads")
    if heads is not None and shared is not None and heads[1] % shared:
        raise refused("num_key_value_heads", f"which does not divide its {heads[1]} {heads[0]}")
    width = _said(config, WIDTHS)
    if heads is None or width is None or _said(config, HEAD_WIDTHS) is not None:
        return
    if is_count(width[1]) and width[1] % heads[1]:
        raise refused(width[0], f"which its {heads[1]} {heads[0]} do not split evenly (no head_dim)")
