"""Texts -> vectors with a resolved Strategy. Used by the indexer and, unchanged, by the query side.

Why it is fast enough on a CPU: texts are tokenised in one batched call, sorted by length so a
batch carries little padding, the forward pass stops at the deepest layer the strategy reads, and
inference runs under ``torch.inference_mode()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

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


class Embedder:
    """A loaded model plus the resolved strategy; ``embed`` and ``embed_documents`` give vectors."""

    def __init__(self, strategy: Strategy | None = None, *, batch_size: int = 32):
        strategy = strategy or Strategy()
        if Path(strategy.model).is_dir():  # stored in the index: must not depend on the cwd
            strategy = replace(strategy, model=str(Path(strategy.model).resolve()))
        self.tokenizer, self.network = load_model(strategy.model, need_pooler=strategy.pooling == "pooler")
        config = self.network.config
        num_layers = int(config.num_hidden_layers)
        limit = min(
            int(getattr(config, "max_position_embeddings", 512) or 512),
            int(self.tokenizer.model_max_length),
        )
        st = sentence_transformers_config(model_location(strategy.model))
        self.strategy = strategy.resolve(
            num_layers=num_layers, model_limit=limit, st_pooling=st.pooling, st_max_length=st.max_length
        )
        self.batch_size = batch_size
        self.dimension = self.strategy.dimension(int(config.hidden_size))
        self.layers = [i % (num_layers + 1) for i in self.strategy.layers]
        if self.strategy.pooling != "pooler":
            # keep one block at least: with none, some models report no hidden states at all
            self._drop_layers_after(max(1, *self.layers))
        special = (
            self.tokenizer.cls_token_id,
            self.tokenizer.sep_token_id,
            self.tokenizer.bos_token_id,
            self.tokenizer.eos_token_id,
        )
        self.pooling = Pooling(
            self.strategy.pooling,
            skip_special=self.strategy.skip_special,
            special_ids=[i for i in special if i is not None],
        )

    def _drop_layers_after(self, deepest: int) -> None:
        """Run only the blocks up to the deepest hidden state read: later ones are wasted work."""
        found = _layer_stack(self.network)
        if found is not None:
            parent, attr = found
            blocks = getattr(parent, attr)
            if deepest < len(blocks):
                setattr(parent, attr, torch.nn.ModuleList(list(blocks)[:deepest]))

    def tokenize(self, texts: Sequence[str], *, chunk: bool) -> Tokenized:
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
        return self.embed_tokenized(self.tokenize(texts, chunk=False), progress=progress)

    def embed_documents(
        self, texts: Sequence[str], *, progress: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """Vectors for documents and the text index of each (several per text when chunking)."""
        tokenized = self.tokenize(texts, chunk=True)
        return self.embed_tokenized(tokenized, progress=progress), tokenized.owners

    def embed_tokenized(self, tokenized: Tokenized, *, progress: bool = False) -> np.ndarray:
        from tqdm import tqdm

        out = np.zeros((len(tokenized.ids), self.dimension), dtype=np.float32)
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
                out[batch] = self._forward(input_ids, attention).numpy()
                bar.update(len(batch))
        return out

    def _forward(self, input_ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        output = self.network(
            input_ids=input_ids, attention_mask=attention, output_hidden_states=True, return_dict=True
        )
        hidden = output.hidden_states
        picked = [hidden[i] for i in self.layers]
        if len(picked) == 1:
            tokens = picked[0]
        elif self.strategy.combine == "concat":
            tokens = torch.cat(picked, dim=-1)
        elif self.strategy.combine == "sum":
            tokens = torch.stack(picked).sum(0)
        else:
            tokens = torch.stack(picked).mean(0)
        vectors = self.pooling(tokens, input_ids, attention, getattr(output, "pooler_output", None))
        if self.strategy.normalize:
            vectors = torch.nn.functional.normalize(vectors.float(), p=2, dim=1)
        return vectors.float()
