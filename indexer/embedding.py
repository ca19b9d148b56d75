"""Texts -> vectors with a resolved Strategy. Used by the indexer and, unchanged, by the query side.

Why it is fast enough on a CPU: texts are tokenised in one batched call, sorted by length so a
batch carries little padding, the forward pass stops at the deepest layer the strategy reads, and
inference runs under ``torch.inference_mode()``. One forward pass can also feed many strategies
at once (``embed_grid``), which is what makes a layer x pooling sweep cost about one strategy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from indexer.errors import BadInput
from indexer.models import load_model, model_location, sentence_transformers_config
from indexer.pooling import Pooling
from indexer.strategy import Strategy


@dataclass(frozen=True)
class Tokenized:
    """Token ids of each piece to embed and, for each piece, the index of the text it came from."""

    ids: list[list[int]]
    owners: np.ndarray


def _layer_stack(network: torch.nn.Module) -> tuple[torch.nn.Module, str] | None:
    """The module holding the transformer blocks as a ModuleList, for BERT-like families."""
    for parent_name, attr in (("encoder", "layer"), ("transformer", "layer"), ("", "layers")):
        parent = getattr(network, parent_name) if parent_name else network
        if parent is not None and isinstance(getattr(parent, attr, None), torch.nn.ModuleList):
            return parent, attr
    return None


class Head:
    """The strategy's part after the network: pick layers, combine them, pool, normalise."""

    def __init__(self, strategy: Strategy, num_layers: int, special_ids: Sequence[int]):
        self.strategy = strategy
        self.layers = [i % (num_layers + 1) for i in strategy.layers or (-1,)]
        self.pooling = Pooling(strategy.pooling, skip_special=strategy.skip_special, special_ids=special_ids)

    def tokens(self, hidden_states: Sequence[torch.Tensor]) -> torch.Tensor:
        """Per-token vectors of the chosen layers, combined: ``[batch, tokens, width]``."""
        picked = [hidden_states[i] for i in self.layers]
        if len(picked) == 1:
            return picked[0]
        if self.strategy.combine == "concat":
            return torch.cat(picked, dim=-1)
        stacked = torch.stack(picked)
        return stacked.sum(0) if self.strategy.combine == "sum" else stacked.mean(0)

    def __call__(self, output: Any, input_ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        tokens = None if self.strategy.pooling == "pooler" else self.tokens(output.hidden_states)
        vectors = self.pooling(tokens, input_ids, attention, getattr(output, "pooler_output", None)).float()
        if self.strategy.normalize:
            vectors = torch.nn.functional.normalize(vectors, p=2, dim=1)
        return vectors


class Embedder:
    """A loaded model plus the resolved strategy; ``embed`` and ``embed_documents`` give vectors.

    ``all_layers`` keeps every block (for sweeps over strategies); otherwise the network is cut
    after the deepest layer the strategy reads.
    """

    def __init__(self, strategy: Strategy | None = None, *, batch_size: int = 32, all_layers: bool = False):
        strategy = strategy or Strategy()
        if Path(strategy.model).is_dir():  # stored in the index: must not depend on the cwd
            strategy = replace(strategy, model=str(Path(strategy.model).resolve()))
        self.tokenizer, self.network = load_model(strategy.model, need_pooler=strategy.pooling == "pooler")
        config = self.network.config
        self.num_layers = int(config.num_hidden_layers)
        self.hidden_size = int(config.hidden_size)
        self._limit = min(
            int(getattr(config, "max_position_embeddings", 512) or 512),
            int(self.tokenizer.model_max_length),
        )
        self._st = sentence_transformers_config(model_location(strategy.model))
        special = (
            self.tokenizer.cls_token_id,
            self.tokenizer.sep_token_id,
            self.tokenizer.bos_token_id,
            self.tokenizer.eos_token_id,
        )
        self.special_ids = [i for i in special if i is not None]
        self.batch_size = batch_size
        self.head = self.make_head(strategy)
        self.strategy = self.head.strategy
        self.dimension = self.strategy.dimension(self.hidden_size)
        if not all_layers and self.strategy.pooling != "pooler":
            # keep one block at least: with none, some models report no hidden states at all
            self._drop_layers_after(max(1, *self.head.layers))
        if self.strategy.backend != "torch":
            if all_layers:
                raise BadInput("sweeps run on the torch backend")
            from indexer.onnx_backend import OnnxNetwork

            pooler = self.strategy.pooling == "pooler"
            self.network = OnnxNetwork(
                self.network,
                model_location(self.strategy.model),
                [] if pooler else self.head.layers,
                pooler,
                self.strategy.backend,
            )

    def make_head(self, strategy: Strategy) -> Head:
        """Resolve a strategy against this model ('auto' -> concrete, ranges checked)."""
        resolved = strategy.resolve(
            num_layers=self.num_layers,
            model_limit=self._limit,
            st_pooling=self._st.pooling,
            st_max_length=self._st.max_length,
        )
        return Head(resolved, self.num_layers, self.special_ids)

    def _drop_layers_after(self, deepest: int) -> None:
        """Run only the blocks up to the deepest hidden state read: later ones are wasted work."""
        found = _layer_stack(self.network)
        if found is not None:
            parent, attr = found
            blocks = getattr(parent, attr)
            if deepest < len(blocks):
                setattr(parent, attr, torch.nn.ModuleList(list(blocks)[:deepest]))

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
        found = _layer_stack(self.network)
        if found is not None and len(getattr(*found)) < self.num_layers:
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
                output = self.network(
                    input_ids=input_ids, attention_mask=attention, output_hidden_states=True, return_dict=True
                )
                for out, head in zip(outs, heads, strict=True):
                    out[batch] = head(output, input_ids, attention).numpy()
                bar.update(len(batch))
        return outs
