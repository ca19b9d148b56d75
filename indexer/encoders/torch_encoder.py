"""Texts -> vectors on torch, from a model loaded with transformers: the reference every other
backend is held to, what exports the ONNX graphs (``indexer.encoders.onnx_export``), and what
sweeps and word vectors run on.

It embeds through ``indexer.encoders.pipeline`` on the placement it is given (``--device``,
``--precision``: the CPU in fp32 unless asked otherwise): texts tokenised ahead on another thread,
length-sorted batches, the heads on the device. The forward pass stops at the deepest layer the
strategy reads, and one forward pass can feed many strategies at once (``embed_grid``), which is
what makes a layer x pooling sweep cost about one strategy. ``TorchNetwork`` is the same model as
a NumPy ``Network`` on the CPU (word vectors).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from indexer.embedding.graphs import graph_spec
from indexer.embedding.head import Head, NetworkOutput, Tokenized
from indexer.embedding.models import (
    ModelFacts,
    identified,
    load_model,
    model_file,
    model_location,
    resolve_strategy,
)
from indexer.embedding.strategy import BACKEND_PRECISION, ROLES, Strategy
from indexer.encoders.base import Decision, NetworkEncoder
from indexer.encoders.pipeline import DeviceNetwork, embed
from indexer.encoders.tokens import TextTokenizer
from indexer.errors import BadInput
from indexer.progress import Share

TOKENIZER_PROBES = (
    "The bike station near the river",
    "  spaces,  tabs\tand a new\nline",
    "Numbers 42 and 3.14; punctuation! (brackets) 'quotes' \"double\"",
    "naïve café, Straße, 東京, ñandú, emoji 🙂",
)
"""Texts a model's ``tokenizer.json`` alone must tokenise as transformers does before its graph is
exported (the graph's queries are tokenised from the file, without transformers)."""


def layer_stack(model: torch.nn.Module) -> tuple[torch.nn.Module, str] | None:
    """The module holding the transformer blocks as a ModuleList, where cutting it leaves the
    hidden states before the cut as they were: BERT's family (``encoder.layer``) and DistilBERT
    (``transformer.layer``). ModernBERT's ``layers`` are not cut: it normalises whichever hidden
    state comes last, so a cut model's layer 2 differs from the whole model's. ALBERT shares one
    block group across its layers: nothing to cut."""
    for parent_name, attr in (("encoder", "layer"), ("transformer", "layer")):
        parent = getattr(model, parent_name, None)
        if parent is not None and isinstance(getattr(parent, attr, None), torch.nn.ModuleList):
            return parent, attr
    return None


class TorchNetwork:
    """The transformers model in eval mode, as a ``Network`` (NumPy in, NumPy out). With
    ``deepest``, the blocks after that hidden state are dropped: a strategy reading layer 2 of 12
    runs 2 blocks, not 12."""

    def __init__(self, model: Any, deepest: int | None = None):
        self.model = model
        found = layer_stack(model)
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


class TorchEncoder(NetworkEncoder):
    """A loaded model plus the resolved strategy, run on torch whatever the strategy's backend
    (``indexer.encoders.factory`` picks the backend; this is the one that loads the model).

    ``all_layers`` keeps every block (for sweeps over strategies, ``embed_grid``); otherwise the
    network is cut after the deepest layer the strategy reads. ``loaded``: the tokenizer and model
    of another ``TorchEncoder`` of the same model, reused rather than loaded again. ``trusted``:
    the model's own code may run (``EmbeddingOptions.trust_remote_code``). ``decision``:
    the factory's (``indexer.encoders.factory``, which alone builds one): the device and precision
    it embeds on (the model moves there at its first embedding, so the query graph is exported
    from the fp32 CPU model before) and its batching.
    """

    def __init__(
        self,
        strategy: Strategy | None = None,
        *,
        decision: Decision,
        all_layers: bool = False,
        loaded: tuple[Any, Any] | None = None,
        trusted: bool = False,
    ):
        request = identified(strategy or Strategy())  # located and fingerprinted, not cwd-relative
        if all_layers and BACKEND_PRECISION[request.backend] == "int8":
            raise BadInput(f"sweeps run in fp32 (backend onnx or torch), not {request.backend}")
        self.tokenizer, self.model = loaded or load_model(
            request.model, need_pooler=request.pooling == "pooler", trusted=trusted
        )
        self.facts = ModelFacts.of(
            self.model.config, self.tokenizer.model_max_length, model_location(request.model)
        )
        self.num_layers = self.facts.num_layers
        self.all_layers = all_layers
        resolved = resolve_strategy(request, self.facts)
        # a copy: transformers sets its own truncation on its backend each call (word vectors)
        backend = self.tokenizer.backend_tokenizer
        tokens = TextTokenizer(
            backend.from_str(backend.to_str()), self.tokenizer.special_tokens_map, resolved
        )
        self.location = model_location(resolved.model)
        head = Head(resolved, self.num_layers, tokens.special_ids, self.location)
        deepest = None if all_layers or resolved.pooling == "pooler" else max(head.layers)
        super().__init__(
            resolved,
            tokens,
            head,
            TorchNetwork(self.model, deepest),
            hidden_size=self.facts.hidden_size,
            decision=decision,
        )
        self._on_device: DeviceNetwork | None = None

    @property
    def loaded(self) -> tuple[Any, Any]:
        return self.tokenizer, self.model

    def export_for_queries(self) -> str | None:
        """Export (once, cached) the graph an index of this strategy answers its queries with, from
        this model; the reason it cannot be (noted beside the graph, so nobody retries), or None.
        A graph runs with the model's ``tokenizer.json`` alone: where transformers tokenises
        otherwise (a tokenizer class that rebuilds what the file says), it is not exported."""
        from indexer.encoders.onnx_export import export_for_queries, not_exported

        spec = graph_spec(self.strategy, self.num_layers)
        differs = self._tokenizer_file_differs()
        if differs is not None:
            return not_exported(spec, differs)
        return export_for_queries(self.model, spec)

    def _tokenizer_file_differs(self) -> str | None:
        """How the model's ``tokenizer.json``, read alone, tokenises ``TOKENIZER_PROBES`` otherwise
        than transformers does (both roles, their prefixes included), or None."""
        if model_file(self.location, "tokenizer.json") is None:
            return None
        alone = TextTokenizer.from_files(self.location, self.strategy)
        for role in ROLES:
            if alone.ids(TOKENIZER_PROBES, role) != self.tokens.ids(TOKENIZER_PROBES, role):
                return "its tokenizer.json alone tokenises otherwise than transformers' tokenizer class"
        return None

    def embed(
        self, texts: Sequence[str], *, progress: Share | None = None, role: str = "query"
    ) -> np.ndarray:
        """One float32 vector per text (queries, sentences; or passages): always truncated at
        max_length."""
        return self._embed(texts, self._truncated(role), [self.head], progress)[0][0]

    def embed_documents(
        self, texts: Sequence[str], *, progress: Share | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Vectors for documents and the text index of each (several per text when chunking)."""
        (vectors,), owners = self._embed(texts, self.tokens.documents, [self.head], progress)
        return vectors, owners

    def embed_ids(self, ids: Sequence[Sequence[int]], *, progress: Share | None = None) -> np.ndarray:
        """``embed`` of texts already tokenised, through the same device loop (a GPU's)."""

        def given(part: Sequence[Sequence[int]]) -> Tokenized:
            return Tokenized(list(part), np.arange(len(part), dtype=np.int64))

        return self._embed(ids, given, [self.head], progress)[0][0]

    def _truncated(self, role: str) -> Callable[[Sequence[str]], Tokenized]:
        """Texts -> their ids as a ``role``, each truncated."""

        def tokenize(texts: Sequence[str]) -> Tokenized:
            return Tokenized(self.tokens.ids(texts, role), np.arange(len(texts), dtype=np.int64))

        return tokenize

    def _embed(
        self, texts: Sequence[str], tokenize: Any, heads: Sequence[Head], progress: Share | None
    ) -> tuple[list[np.ndarray], np.ndarray]:
        if self._on_device is None:
            self._on_device = DeviceNetwork(self.model, self.decision.placement)
        return embed(
            self._on_device,
            tokenize,
            list(texts),
            heads,
            [h.strategy.dimension(self.hidden_size) for h in heads],
            batching=self.decision.batching,
            pad=self.tokens.pad,
            on_share=progress,
        )

    def token_vectors(self, input_ids: np.ndarray, attention: np.ndarray) -> np.ndarray:
        """The head's per-token vectors (its layers combined) of one padded batch, float32 NumPy,
        computed on this encoder's placement (word vectors read them)."""
        if self.decision.placement.on_cpu and self.decision.placement.precision == "fp32":
            return self.head.tokens(self.network(input_ids, attention))
        if self._on_device is None:
            self._on_device = DeviceNetwork(self.model, self.decision.placement)
        device = self._on_device.device
        with torch.inference_mode():
            ids, mask = (torch.from_numpy(a).to(device) for a in (input_ids, attention))
            output = self._on_device(ids, mask)
            return self.head.tokens(output).float().cpu().numpy()

    def make_head(self, strategy: Strategy) -> Head:
        """Resolve a strategy against this model ('auto' -> concrete, ranges checked)."""
        resolved = resolve_strategy(strategy, self.facts)
        return Head(resolved, self.num_layers, self.tokens.special_ids, self.location)

    def embed_grid(
        self,
        texts: Sequence[str],
        strategies: Sequence[Strategy],
        *,
        progress: Share | None = None,
        role: str = "query",
    ) -> list[np.ndarray]:
        """Vectors of every strategy from one forward pass per batch (needs ``all_layers``).

        The strategies share this encoder's model, max_length and prefixes (``role``'s is put
        before each text); they differ after the network.
        """
        heads = [
            self.make_head(replace(s, model=self.strategy.model, max_length=self.strategy.max_length))
            for s in strategies
        ]
        if not self.all_layers:
            raise BadInput("embed_grid needs a TorchEncoder built with all_layers=True")
        return self._embed(texts, self._truncated(role), heads, progress)[0]
