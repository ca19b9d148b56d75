"""The torch embedding loop, the same on a GPU and on the CPU: texts -> token ids -> batches ->
network -> heads, with the host work kept off the device's critical path.

What makes a GPU busy rather than waiting (the peer, sentence-transformers, leaves it idle most of
the time on short texts: tokenising, padding and copying in one thread between batches):

- **Tokenising ahead**: texts are tokenised a window at a time on another thread (``tokenizers``
  releases the GIL and uses every core) while the device runs the window before.
- **Batches planned from token counts** (``indexer.embedding.batching``, the rule every loop
  runs): short texts go in batches of thousands, long ones in fewer rows, so a batch is about the
  same work and carries little padding.
- **Pinned memory and non-blocking copies** of each padded batch; the heads (layers, pooling,
  normalising) run on the device, so only the sentence vectors come back, once a window.
- **Half precision** where asked (``indexer.encoders.devices``): the network's weights in fp16 or
  bf16 (attention through PyTorch's fused SDPA kernels), the heads in fp32.

On the CPU the same code runs in fp32 with the batch size as its row limit: the path a CPU-only
CI exercises is the one a GPU runs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from indexer.embedding.batching import Batching
from indexer.embedding.head import Head, NetworkOutput, Tokenized, finite, pad_batch
from indexer.encoders.devices import Placement

WINDOW = 8192
"""Texts tokenised and sorted together: enough for batches of like lengths, small enough that the
first batch starts soon and a window's vectors are a few MB."""
LOOKAHEAD = 2
"""Windows tokenised ahead of the one the device runs."""
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class _Float32States(Mapping[int, torch.Tensor]):
    """Hidden states read in fp32 (the heads pool and normalise in fp32 whatever the network ran in),
    each cast once however many heads read it (a sweep's grid)."""

    def __init__(self, states: Sequence[torch.Tensor]):
        self.states = states
        self.cast: dict[int, torch.Tensor] = {}

    def __getitem__(self, layer: int) -> torch.Tensor:
        if layer not in self.cast:
            self.cast[layer] = self.states[layer].float()
        return self.cast[layer]

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.states)))

    def __len__(self) -> int:
        return len(self.states)


class DeviceNetwork:
    """A transformers model on a device at a precision, tensors in and out (on the device)."""

    def __init__(self, model: Any, placement: Placement):
        self.placement = placement
        self.device = torch.device(placement.device)
        self.model = model.to(device=self.device, dtype=DTYPES[placement.precision]).eval()

    def __call__(self, input_ids: torch.Tensor, attention: torch.Tensor) -> NetworkOutput:
        out = self.model(
            input_ids=input_ids, attention_mask=attention, output_hidden_states=True, return_dict=True
        )
        pooler = getattr(out, "pooler_output", None)
        return NetworkOutput(_Float32States(out.hidden_states), None if pooler is None else pooler.float())


@dataclass
class _Window:
    """One window tokenised and batched on the host, ready to copy."""

    start: int
    texts: int
    owners: np.ndarray
    batches: list[tuple[np.ndarray, torch.Tensor, torch.Tensor]]


def _prepare(
    tokenize: Callable[[Sequence[str]], Tokenized],
    texts: Sequence[str],
    start: int,
    batching: Batching,
    pad: int,
    pin: bool,
) -> _Window:
    tokenized = tokenize(texts)
    lengths = np.fromiter((len(p) for p in tokenized.ids), dtype=np.int64, count=len(tokenized.ids))
    batches = []
    for rows in batching.plan(lengths):
        input_ids, attention = pad_batch([tokenized.ids[i] for i in rows], pad)
        ids_t, mask_t = torch.from_numpy(input_ids), torch.from_numpy(attention)
        if pin:
            ids_t, mask_t = ids_t.pin_memory(), mask_t.pin_memory()
        batches.append((rows, ids_t, mask_t))
    return _Window(start, len(texts), tokenized.owners, batches)


def embed(
    network: DeviceNetwork,
    tokenize: Callable[[Sequence[str]], Tokenized],
    texts: Sequence[str],
    heads: Sequence[Head],
    dimensions: Sequence[int],
    *,
    batching: Batching,
    pad: int,
    on_share: Callable[[float], object] | None = None,
) -> tuple[list[np.ndarray], np.ndarray]:
    """Each head's float32 vectors of every piece ``tokenize`` makes of ``texts``, in order, and
    the text index of each piece. ``on_share``: told each batch's share of all the work."""
    device, pin = network.device, network.device.type == "cuda"
    starts = range(0, len(texts), WINDOW)
    outs: list[list[np.ndarray]] = [[] for _ in heads]
    owners: list[np.ndarray] = []
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenise") as pool, torch.inference_mode():

        def submit(start: int) -> Any:
            window = texts[start : start + WINDOW]
            return pool.submit(_prepare, tokenize, window, start, batching, pad, pin)

        pending = deque(submit(s) for s in starts[:LOOKAHEAD])
        following = iter(starts[LOOKAHEAD:])
        while pending:
            window: _Window = pending.popleft().result()
            if (start := next(following, None)) is not None:
                pending.append(submit(start))
            pieces = len(window.owners)
            vectors = [torch.empty((pieces, d), dtype=torch.float32, device=device) for d in dimensions]
            for rows, ids_t, mask_t in window.batches:
                input_ids = ids_t.to(device, non_blocking=True)
                attention = mask_t.to(device, non_blocking=True)
                output = network(input_ids, attention)
                where = torch.from_numpy(rows).to(device, non_blocking=True)
                for out, head in zip(vectors, heads, strict=True):
                    out[where] = head(output, input_ids, attention).float()
                if on_share is not None:
                    on_share(len(rows) / pieces * window.texts / len(texts))
            for kept, out, head in zip(outs, vectors, heads, strict=True):
                kept.append(finite(out.cpu().numpy(), head.strategy))
            owners.append(window.owners + window.start)
    if not owners:
        return [np.zeros((0, d), dtype=np.float32) for d in dimensions], np.zeros(0, dtype=np.int64)
    return [np.concatenate(kept) for kept in outs], np.concatenate(owners)
