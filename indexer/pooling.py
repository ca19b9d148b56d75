"""Token vectors -> one sentence vector. Padding never takes part: every mode reads the mask.

Modes are data (a name -> function table), as in sentence-transformers' ``models/Pooling.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from indexer.errors import BadInput


def _cls(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return tokens[:, 0]


def _mean(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    weights = mask.unsqueeze(-1).to(tokens.dtype)
    return (tokens * weights).sum(1) / weights.sum(1).clamp(min=1e-9)


def _max(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return tokens.masked_fill(~mask.unsqueeze(-1), float("-inf")).max(1).values


def _mean_max(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.cat([_mean(tokens, mask), _max(tokens, mask)], dim=-1)


MODES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
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
        self.special_ids = torch.tensor(sorted(set(special_ids)), dtype=torch.long)

    def token_mask(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Which tokens pool: real ones, minus [CLS]/[SEP] when asked (never an empty set)."""
        mask = attention_mask.bool()
        if self.skip_special and len(self.special_ids):
            content = mask & ~torch.isin(input_ids, self.special_ids)
            has_content = content.any(dim=1, keepdim=True)
            mask = torch.where(has_content, content, mask)
        return mask

    def __call__(
        self,
        tokens: torch.Tensor | None,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        pooler_output: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if self.mode == "pooler":
            if pooler_output is None:
                raise BadInput("this model has no pooler output: choose another pooling")
            return pooler_output
        assert tokens is not None, "token vectors are needed for every mode but pooler"
        return MODES[self.mode](tokens, self.token_mask(input_ids, attention_mask))
