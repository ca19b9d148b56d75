"""The strategy's part after the network, in NumPy: pad token ids into batches, run a network,
pick and combine hidden states, pool, normalise. ``Head`` also runs on torch tensors, so
fine-tuning (``indexer.encoders.training``) trains through the head the index embeds with.

Every encoder (``indexer.encoders``: torch, or the same graph on ONNX Runtime) runs its network
through ``encode``, so a query is embedded by exactly the code that embedded the corpus; only the
network differs.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import chain

import numpy as np

from indexer.embedding.batching import Batching
from indexer.embedding.modules.base import after_pooling, namespace
from indexer.embedding.modules.normalize import Normalize
from indexer.embedding.modules.pooling import Pooling
from indexer.embedding.strategy import Strategy
from indexer.errors import ModelFailed


@dataclass(frozen=True)
class NetworkOutput:
    """``hidden_states[i]`` (``i`` in 0..num_layers, 0 = embedding output) for at least the layers
    the strategy reads, each ``[batch, tokens, hidden]``; the pooler output when it was asked for."""

    hidden_states: Sequence[np.ndarray] | Mapping[int, np.ndarray]
    pooler_output: np.ndarray | None = None


@dataclass(frozen=True)
class Tokenized:
    """Token ids of each piece to embed and, for each piece, the index of the text it came from."""

    ids: list[list[int]]
    owners: np.ndarray


class Head:
    """The strategy's part after the network: pick layers, combine them, pool, run the model
    folder's modules after pooling (``indexer.embedding.modules``: its Dense ones read from
    ``location``), keep the first ``dimensions``, normalise."""

    def __init__(
        self, strategy: Strategy, num_layers: int, special_ids: Sequence[int], location: str | None = None
    ):
        self.strategy = strategy
        self.layers = [i % (num_layers + 1) for i in strategy.layers or (-1,)]
        self.pooling = Pooling(strategy.pooling, skip_special=strategy.skip_special, special_ids=special_ids)
        self.after = after_pooling(location, strategy.modules)

    def tokens(self, output: NetworkOutput) -> np.ndarray:
        """Per-token vectors of the chosen layers, combined: ``[batch, tokens, width]``."""
        xp = namespace(output.hidden_states[self.layers[0]])
        picked = [output.hidden_states[i] for i in self.layers]
        if xp is np:
            picked = [np.asarray(p, dtype=np.float32) for p in picked]
        if len(picked) == 1:
            return picked[0]
        if self.strategy.combine == "concat":
            return xp.concatenate(picked, axis=-1)
        total = sum(picked[1:], picked[0])
        return total if self.strategy.combine == "sum" else total / len(picked)

    def __call__(self, output: NetworkOutput, input_ids: np.ndarray, attention: np.ndarray) -> np.ndarray:
        """Sentence vectors (float32 NumPy, or torch tensors that keep their gradient)."""
        tokens = None if self.strategy.pooling == "pooler" else self.tokens(output)
        pooler = output.pooler_output
        vectors = self.pooling(tokens, input_ids, attention, pooler)
        for step in self.after:
            vectors = step(vectors)
        if self.strategy.dimensions is not None:  # Matryoshka: cut before normalising, as s-t does
            vectors = vectors[:, : self.strategy.dimensions]
        if namespace(vectors) is np:
            vectors = np.asarray(vectors, dtype=np.float32)
        if self.strategy.normalize:
            vectors = Normalize()(vectors)
        return vectors


def pad_batch(pieces: Sequence[Sequence[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    """Token id lists -> right-padded ``input_ids`` and ``attention`` (int64 ``[batch, width]``)."""
    return Packed(pieces).padded(np.arange(len(pieces)), pad)


class Packed:
    """Token id lists as one array, once: every pass's padded matrices are then cut from it in a
    few NumPy calls, with no Python per piece (per piece and per pass, that costs as much as a
    cheap model's pass)."""

    def __init__(self, pieces: Sequence[Sequence[int]]):
        self.lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
        self.ids = np.fromiter(chain.from_iterable(pieces), dtype=np.int64, count=int(self.lengths.sum()))
        self.starts = np.cumsum(self.lengths) - self.lengths

    def padded(self, rows: np.ndarray, pad: int) -> tuple[np.ndarray, np.ndarray]:
        """The pieces ``rows``, right-padded with ``pad``: ``input_ids`` and ``attention``."""
        lengths = self.lengths[rows]
        columns = np.arange(int(lengths.max()))
        kept = columns < lengths[:, None]
        input_ids = np.full(kept.shape, pad, dtype=np.int64)
        input_ids[kept] = self.ids[(self.starts[rows][:, None] + columns)[kept]]
        return input_ids, kept.astype(np.int64)


def finite(vectors: np.ndarray, strategy: Strategy) -> np.ndarray:
    """``vectors``, checked where they leave the network: NaN compares with nothing, so an index of
    it answers no query, and JSON cannot carry it."""
    if not np.isfinite(vectors).all():
        raise ModelFailed(
            f"the model {strategy.model} produced non-finite vectors (NaN or infinity): "
            "its weights or its exported ONNX graph are damaged"
        )
    return vectors


Network = Callable[[np.ndarray, np.ndarray], NetworkOutput]
"""Token ids and attention mask (int64 ``[batch, tokens]``) -> hidden states."""


def encode(
    network: Network | Sequence[Network],
    ids: Sequence[Sequence[int]],
    heads: Sequence[Head],
    dimensions: Sequence[int],
    *,
    batching: Batching,
    pad: int,
    on_batch: Callable[[int], object] | None = None,
) -> list[np.ndarray]:
    """The passes ``batching`` plans from the pieces' token counts through the network; each head
    makes its vectors. Several networks (copies of one: ONNX Runtime sessions, each on a few
    cores) run batches side by side, one thread each: one session cannot keep many cores busy on
    small batches."""
    networks = [network] if callable(network) else list(network)
    outs = [np.zeros((len(ids), d), dtype=np.float32) for d in dimensions]
    packed = Packed(ids)
    batches = batching.plan(packed.lengths)

    def run(on: Network, batch: np.ndarray) -> int:
        input_ids, attention = packed.padded(batch, pad)
        output = on(input_ids, attention)
        for out, head in zip(outs, heads, strict=True):
            out[batch] = finite(head(output, input_ids, attention), head.strategy)
        return len(batch)

    if len(networks) == 1:
        for batch in batches:
            count = run(networks[0], batch)
            if on_batch is not None:
                on_batch(count)
        return outs
    free: queue.SimpleQueue[Network] = queue.SimpleQueue()
    for each in networks:
        free.put(each)

    def borrowing(batch: np.ndarray) -> int:
        on = free.get()
        try:
            return run(on, batch)
        finally:
            free.put(on)

    with ThreadPoolExecutor(len(networks), thread_name_prefix="session") as pool:
        for count in pool.map(borrowing, batches):
            if on_batch is not None:
                on_batch(count)
    return outs
