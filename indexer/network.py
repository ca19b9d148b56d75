"""The network a strategy reads: token ids in, hidden states (and the pooler output) out.

``Network`` is what the Embedder runs; ``TorchNetwork`` is the transformers model, cut after the
deepest hidden state the strategy reads, and ``indexer.onnx_backend.OnnxNetwork`` the same network
exported to ONNX Runtime. The strategy's ``backend`` picks one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass(frozen=True)
class NetworkOutput:
    """``hidden_states[i]`` (``i`` in 0..num_layers, 0 = embedding output) for at least the layers
    the strategy reads, each ``[batch, tokens, hidden]``; the pooler output when it was asked for."""

    hidden_states: Sequence[torch.Tensor] | Mapping[int, torch.Tensor]
    pooler_output: torch.Tensor | None = None


class Network(Protocol):
    def __call__(self, input_ids: torch.Tensor, attention: torch.Tensor) -> NetworkOutput: ...


def _layer_stack(model: torch.nn.Module) -> tuple[torch.nn.Module, str] | None:
    """The module holding the transformer blocks as a ModuleList, for BERT-like families."""
    for parent_name, attr in (("encoder", "layer"), ("transformer", "layer"), ("", "layers")):
        parent = getattr(model, parent_name) if parent_name else model
        if parent is not None and isinstance(getattr(parent, attr, None), torch.nn.ModuleList):
            return parent, attr
    return None


class TorchNetwork:
    """The transformers model in eval mode. With ``deepest``, the blocks after that hidden state
    are dropped: a strategy reading layer 2 of 12 runs 2 blocks, not 12."""

    def __init__(self, model: Any, deepest: int | None = None):
        self.model = model
        found = _layer_stack(model)
        if deepest is not None and found is not None:
            parent, attr = found
            blocks = getattr(parent, attr)
            # keep one block at least: with none, some models report no hidden states at all
            if max(1, deepest) < len(blocks):
                setattr(parent, attr, torch.nn.ModuleList(list(blocks)[: max(1, deepest)]))

    def __call__(self, input_ids: torch.Tensor, attention: torch.Tensor) -> NetworkOutput:
        out = self.model(
            input_ids=input_ids, attention_mask=attention, output_hidden_states=True, return_dict=True
        )
        return NetworkOutput(out.hidden_states, getattr(out, "pooler_output", None))
