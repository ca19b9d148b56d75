"""The torch network a strategy reads: token ids in, hidden states (and the pooler output) out.

A ``Network`` (``indexer.head``) takes and gives NumPy arrays; ``TorchNetwork`` is the transformers
model, cut after the deepest hidden state the strategy reads, and ``indexer.onnx_graph.OnnxGraph``
the same network exported to ONNX Runtime. The strategy's ``backend`` picks one for indexing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from indexer.head import NetworkOutput


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

    def __call__(self, input_ids: np.ndarray, attention: np.ndarray) -> NetworkOutput:
        with torch.inference_mode():
            out = self.model(
                input_ids=torch.from_numpy(input_ids),
                attention_mask=torch.from_numpy(attention),
                output_hidden_states=True,
                return_dict=True,
            )
        pooler = getattr(out, "pooler_output", None)
        return NetworkOutput(
            [h.numpy() for h in out.hidden_states], None if pooler is None else pooler.numpy()
        )
