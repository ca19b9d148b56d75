"""Exporting a reranker's classifier to ONNX (needs torch): the network's logits for a batch of
pairs, once, atomically, into the graph cache the bi-encoders' graphs lie in
(``indexer.embedding.cross_folder.cross_graph``). ``indexer.encoders.rerankers`` runs it on ONNX
Runtime without torch.

The graph takes ``input_ids`` and ``attention_mask``, and ``token_type_ids`` where the network
reads them and its tokenizer gives them (BERT's family; not DistilBERT, MPNet or ModernBERT): the
inputs the reranker feeds are the graph's own. It is exported as the bi-encoders' graphs are
(``indexer.encoders.onnx_export``: attention eager, ONNX Runtime's BERT fusions, the weights in a
file of their own moved in before the graph).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from indexer.embedding.graphs import GraphSpec
from indexer.encoders.onnx_export import export_into

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class _Logits(torch.nn.Module):
    """The classifier with its inputs by position and its logits as the one output."""

    def __init__(self, network: torch.nn.Module, types: bool):
        super().__init__()
        self.network, self.types = network, types

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *rest: torch.Tensor
    ) -> torch.Tensor:
        given = {"token_type_ids": rest[0]} if self.types else {}
        return self.network(input_ids=input_ids, attention_mask=attention_mask, **given).logits


def export_classifier(network: Any, spec: GraphSpec, sample: Sequence[torch.Tensor], types: bool) -> Path:
    """The classifier graph of ``spec`` from ``network`` (eval mode, CPU, fp32), unless cached.
    ``sample``: a padded batch of two pairs of different lengths (ids, mask, and type ids when
    ``types``) to trace with."""
    if spec.exported:
        return spec.path
    names = list(INPUTS[: 3 if types else 2])
    axes = {name: {0: "batch", 1: "tokens"} for name in names}
    axes["logits"] = {0: "batch"}
    module = _Logits(network, types).eval()
    export_into(network, module, tuple(sample[: len(names)]), (names, ["logits"]), axes, spec)
    return spec.path
