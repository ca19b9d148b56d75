"""Texts -> vectors with a resolved Strategy, from a model loaded with transformers: what indexes
a corpus. Its network runs on the strategy's backend (by default the model exported to ONNX, which
gives torch's vectors faster; once that graph is cached, ``embedder_for`` indexes without torch, as
queries run: ``indexer.query_encoder``), and the same NumPy ``indexer.head`` follows it.

Why it is fast enough on a CPU: texts are tokenised in one batched call, sorted by length so a
batch carries little padding (``indexer.head.encode``), the forward pass stops at the deepest layer
the strategy reads, and inference runs under ``torch.inference_mode()``. One forward pass can also
feed many strategies at once (``embed_grid``), which is what makes a layer x pooling sweep cost
about one strategy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from indexer.errors import BadInput
from indexer.head import Head, Network, Tokenized, encode
from indexer.models import (
    ModelFacts,
    identified,
    load_model,
    model_facts_from_files,
    model_location,
    resolve_strategy,
)
from indexer.onnx_graph import GraphSpec, OnnxGraph
from indexer.strategy import Strategy

if TYPE_CHECKING:
    from indexer.query_encoder import QueryEncoder


class Embedder:
    """A loaded model plus the resolved strategy; ``embed`` and ``embed_documents`` give vectors.

    ``all_layers`` keeps every block (for sweeps over strategies, ``embed_grid``); otherwise the
    network is cut after the deepest layer the strategy reads. The strategy's backend picks the
    ``Network`` (``indexer.network``): torch, or ONNX Runtime.
    """

    encoder = "torch"
    """What ``info`` shows for queries answered by it (``indexer.query_encoder`` says why)."""
    fallback: str | None = None
    """Why this model's network could not be exported to ONNX, once an export was tried and failed."""

    def __init__(self, strategy: Strategy | None = None, *, batch_size: int = 32, all_layers: bool = False):
        request = identified(strategy or Strategy())  # located and fingerprinted, not cwd-relative
        self.tokenizer, model = load_model(request.model, need_pooler=request.pooling == "pooler")
        self.facts = ModelFacts.of(
            model.config, self.tokenizer.model_max_length, model_location(request.model)
        )
        self.num_layers, self.hidden_size = self.facts.num_layers, self.facts.hidden_size
        special = (
            self.tokenizer.cls_token_id,
            self.tokenizer.sep_token_id,
            self.tokenizer.bos_token_id,
            self.tokenizer.eos_token_id,
        )
        self.special_ids = [i for i in special if i is not None]
        self.batch_size = batch_size
        self.all_layers = all_layers
        self.head = self.make_head(request)
        self.strategy = self.head.strategy
        self.dimension = self.strategy.dimension(self.hidden_size)
        self.network = self._network(model)

    def _network(self, model: Any) -> Network:
        """The strategy's backend. ``onnx`` gives torch's fp32 vectors, so it runs on torch where
        torch serves better: sweeps (one pass over every layer) and a model the exporter fails
        on (``fallback`` then says why, and the strategy says ``torch``: what embedded)."""
        from indexer.network import TorchNetwork

        pooler = self.strategy.pooling == "pooler"
        self.torch_network = TorchNetwork(model, None if self.all_layers or pooler else max(self.head.layers))
        backend = self.strategy.backend
        if backend == "torch" or (backend == "onnx" and self.all_layers):
            return self.torch_network
        if self.all_layers:
            raise BadInput(f"sweeps run in fp32 (backend onnx or torch), not {backend}")
        import torch

        from indexer.onnx_backend import export_failure, export_graph

        spec = self.graph_spec(backend)
        if backend == "onnx":
            self.fallback = self.export_for_queries()  # the same graph: exported once for both
            if self.fallback is not None:
                self.head = self.make_head(replace(self.strategy, backend="torch"))
                self.strategy = self.head.strategy
                return self.torch_network
        try:
            path = export_graph(self.torch_network.model, spec)
        except Exception as exc:  # noqa: BLE001 - int8 vectors exist only on the exported graph
            raise BadInput(
                f"backend {backend}: this model cannot be exported to ONNX ({export_failure(exc)})"
            ) from None
        threads = torch.get_num_threads()
        return OnnxGraph(
            path, spec.layers, spec.pooler, threads=threads, spin=True, per_text=spec.backend == "onnx-int8"
        )

    def graph_spec(self, backend: str = "onnx") -> GraphSpec:
        """The exported graph this strategy's network becomes on ONNX Runtime."""
        pooler = self.strategy.pooling == "pooler"
        layers = () if pooler else tuple(sorted(set(self.head.layers)))
        return GraphSpec(model_location(self.strategy.model), layers, pooler, backend)

    def export_for_queries(self) -> str | None:
        """Export (once, cached) the graph the torch-free query path runs for this strategy; the
        reason it cannot be, or None. ``onnx-int8`` indexes query with their own int8 graph."""
        from indexer.onnx_backend import export_for_queries

        if self.fallback is None:
            backend = "onnx-int8" if self.strategy.backend == "onnx-int8" else "onnx"
            self.fallback = export_for_queries(self.torch_network.model, self.graph_spec(backend))
        return self.fallback

    def make_head(self, strategy: Strategy) -> Head:
        """Resolve a strategy against this model ('auto' -> concrete, ranges checked)."""
        return Head(resolve_strategy(strategy, self.facts), self.num_layers, self.special_ids)

    def tokenize(self, texts: Sequence[str], *, chunk: bool = False) -> Tokenized:
        """One batched tokeniser call; with ``chunk`` long texts become overlapping windows."""
        if not texts:
            return Tokenized([], np.zeros(0, dtype=np.int64))
        overlap = self.strategy.chunk_overlap if chunk else None
        encoded = self.tokenizer(
            list(texts),
            truncation=True,
            max_length=self.strategy.max_length,
            return_overflowing_tokens=overlap is not None,
            stride=overlap or 0,
            return_attention_mask=False,
            return_token_type_ids=False,
        )
        ids = encoded["input_ids"]
        owners = encoded.get("overflow_to_sample_mapping") or range(len(ids))
        return Tokenized(ids, np.asarray(owners, dtype=np.int64))

    def embed(self, texts: Sequence[str], *, progress: bool = False) -> np.ndarray:
        """One float32 vector per text (queries, sentences): always truncated at max_length."""
        return self.run(self.tokenize(texts), [self.head], progress=progress)[0]

    def embed_documents(
        self, texts: Sequence[str], *, progress: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """Vectors for documents and the text index of each (several per text when chunking)."""
        tokenized = self.tokenize(texts, chunk=True)
        return self.run(tokenized, [self.head], progress=progress)[0], tokenized.owners

    def embed_grid(
        self, texts: Sequence[str], strategies: Sequence[Strategy], *, progress: bool = False
    ) -> list[np.ndarray]:
        """Vectors of every strategy from one forward pass per batch (needs ``all_layers``).

        The strategies share this embedder's model and max_length; they differ after the network.
        """
        heads = [
            self.make_head(replace(s, model=self.strategy.model, max_length=self.strategy.max_length))
            for s in strategies
        ]
        if not self.all_layers:
            raise BadInput("embed_grid needs an Embedder built with all_layers=True")
        return self.run(self.tokenize(texts), heads, progress=progress)

    def run(self, tokenized: Tokenized, heads: Sequence[Head], *, progress: bool = False) -> list[np.ndarray]:
        """The tokenised pieces through the network; each head turns them into its vectors."""
        from tqdm import tqdm

        dimensions = [h.strategy.dimension(self.hidden_size) for h in heads]
        with tqdm(total=len(tokenized.ids), disable=not progress, unit="text", desc="embedding") as bar:
            return encode(
                self.network,
                tokenized.ids,
                heads,
                dimensions,
                batch_size=self.batch_size,
                pad=self.tokenizer.pad_token_id or 0,
                on_batch=bar.update,
            )


def embedder_for(strategy: Strategy | None = None, *, batch_size: int = 32) -> Embedder | QueryEncoder:
    """The encoder that indexes with ``strategy``: on an ONNX backend whose graph is already
    exported (cached by the model's fingerprint), ONNX Runtime + ``tokenizers`` alone, the path
    queries take (``indexer.query_encoder``): importing torch and transformers and loading the
    model cost seconds a process, a large part of indexing a small corpus. Otherwise the torch
    ``Embedder`` (which exports the graph for the next time)."""
    from indexer.query_encoder import QueryEncoder, graph_spec

    request = identified(strategy or Strategy())
    facts = model_facts_from_files(request.model) if request.backend != "torch" else None
    if facts is not None:
        resolved = resolve_strategy(request, facts)
        spec = graph_spec(resolved)
        if spec.exported:
            return QueryEncoder(resolved, batch_size=batch_size, spec=spec, spin=True)
    return Embedder(strategy, batch_size=batch_size)
