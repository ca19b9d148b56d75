"""Texts -> vectors with a resolved Strategy. Used by the indexer and, unchanged, by the query side.

Why it is fast enough on a CPU: texts are tokenised in one batched call, sorted by length so a
batch carries little padding, the forward pass stops at the deepest layer the strategy reads, and
inference runs under ``torch.inference_mode()``. One forward pass can also feed many strategies
at once (``embed_grid``), which is what makes a layer x pooling sweep cost about one strategy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from indexer.errors import BadInput
from indexer.models import ModelFacts, identified, load_model, model_location, resolve_strategy
from indexer.network import Network, NetworkOutput, TorchNetwork
from indexer.pooling import Pooling
from indexer.strategy import Strategy


@dataclass(frozen=True)
class Tokenized:
    """Token ids of each piece to embed and, for each piece, the index of the text it came from."""

    ids: list[list[int]]
    owners: np.ndarray


class Head:
    """The strategy's part after the network: pick layers, combine them, pool, normalise."""

    def __init__(self, strategy: Strategy, num_layers: int, special_ids: Sequence[int]):
        self.strategy = strategy
        self.layers = [i % (num_layers + 1) for i in strategy.layers or (-1,)]
        self.pooling = Pooling(strategy.pooling, skip_special=strategy.skip_special, special_ids=special_ids)

    def tokens(self, output: NetworkOutput) -> torch.Tensor:
        """Per-token vectors of the chosen layers, combined: ``[batch, tokens, width]``."""
        picked = [output.hidden_states[i] for i in self.layers]
        if len(picked) == 1:
            return picked[0]
        if self.strategy.combine == "concat":
            return torch.cat(picked, dim=-1)
        stacked = torch.stack(picked)
        return stacked.sum(0) if self.strategy.combine == "sum" else stacked.mean(0)

    def __call__(
        self, output: NetworkOutput, input_ids: torch.Tensor, attention: torch.Tensor
    ) -> torch.Tensor:
        tokens = None if self.strategy.pooling == "pooler" else self.tokens(output)
        vectors = self.pooling(tokens, input_ids, attention, output.pooler_output).float()
        if self.strategy.normalize:
            vectors = torch.nn.functional.normalize(vectors, p=2, dim=1)
        return vectors


class Embedder:
    """A loaded model plus the resolved strategy; ``embed`` and ``embed_documents`` give vectors.

    ``all_layers`` keeps every block (for sweeps over strategies, ``embed_grid``); otherwise the
    network is cut after the deepest layer the strategy reads. The strategy's backend picks the
    ``Network`` (``indexer.network``): torch, or ONNX Runtime.
    """

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
        pooler = self.strategy.pooling == "pooler"
        network = TorchNetwork(model, None if self.all_layers or pooler else max(self.head.layers))
        if self.strategy.backend == "torch":
            return network
        if self.all_layers:
            raise BadInput("sweeps run on the torch backend")
        from indexer.onnx_backend import OnnxNetwork

        return OnnxNetwork(
            network.model,
            model_location(self.strategy.model),
            [] if pooler else self.head.layers,
            pooler,
            self.strategy.backend,
        )

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
        """Length-sorted batches through the network; each head turns them into its vectors."""
        from tqdm import tqdm

        outs = [
            np.zeros((len(tokenized.ids), h.strategy.dimension(self.hidden_size)), dtype=np.float32)
            for h in heads
        ]
        order = np.argsort([len(ids) for ids in tokenized.ids], kind="stable")
        pad = self.tokenizer.pad_token_id or 0
        with (
            torch.inference_mode(),
            tqdm(total=len(order), disable=not progress, unit="text", desc="embedding") as bar,
        ):
            for start in range(0, len(order), self.batch_size):
                batch = order[start : start + self.batch_size]
                pieces = [tokenized.ids[i] for i in batch]
                width = max(len(p) for p in pieces)
                input_ids = torch.full((len(pieces), width), pad, dtype=torch.long)
                attention = torch.zeros((len(pieces), width), dtype=torch.long)
                for row, piece in enumerate(pieces):
                    input_ids[row, : len(piece)] = torch.tensor(piece)
                    attention[row, : len(piece)] = 1
                output = self.network(input_ids, attention)
                for out, head in zip(outs, heads, strict=True):
                    out[batch] = head(output, input_ids, attention).numpy()
                bar.update(len(batch))
        return outs
