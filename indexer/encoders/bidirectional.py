"""The attention masks of a Gemma 3 run bidirectionally (EmbeddingGemma: ``use_bidirectional_attention``
in its ``config.json``), made from plain tensor operators, for the ONNX exporter.

transformers builds them from mask functions through ``torch.vmap``, which the ONNX tracer cannot
follow (``RuntimeError: unordered_map::at``); the model takes masks already made instead (a mapping
of layer type to an additive mask). These are the masks transformers makes: full layers see every
real token, sliding ones every real token nearer than ``sliding_window`` on either side; padding is
never seen.
"""

from __future__ import annotations

from typing import Any

import torch


def bidirectional_masks(config: Any, input_ids: torch.Tensor, attention: torch.Tensor) -> dict | None:
    """``{"full_attention": mask, "sliding_attention": mask}`` (``[batch, 1, tokens, tokens]``,
    0 where a token may look and the dtype's least value where not) for a bidirectional Gemma 3;
    None for any other model (it makes its own masks)."""
    if not getattr(config, "use_bidirectional_attention", False) or not getattr(config, "layer_types", None):
        return None
    dtype = getattr(config, "dtype", None) or torch.float32
    dtype = dtype if isinstance(dtype, torch.dtype) else torch.float32
    seen = attention.bool()[:, None, None, :]  # [batch, 1, 1, keys]
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)
    near = (positions[:, None] - positions[None, :]).abs() < int(config.sliding_window)
    least = torch.finfo(dtype).min

    def additive(allowed: torch.Tensor) -> torch.Tensor:
        zeros = torch.zeros(allowed.shape, dtype=dtype, device=input_ids.device)
        return zeros.masked_fill(~allowed, least)

    rows = torch.ones_like(near)[None, None]  # every query row, [1, 1, tokens, tokens]
    return {"full_attention": additive(seen & rows), "sliding_attention": additive(seen & near[None, None])}
