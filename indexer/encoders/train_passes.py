"""A training step's forward passes, rows of like length together: a step's cost on the CPU is
its padded tokens, and one padded pass reads a short pair at the length of the step's longest
(WikiQA's 2 lists of 9 pairs: 43% of a step's tokens were padding). The passes are cut by the one
batching rule (``indexer.embedding.batching``) the encoders' own passes use, at a training pass's
fixed cost; the rows come back in their order, so a loss reads them as from one pass (padding
never leaks: the same outputs, float error aside). On a GPU a pass is worth a torch launch
(``TORCH_CALL_TOKENS``), so a step is cut only where its padding would cost more than that."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from indexer.embedding.batching import TORCH_CALL_TOKENS, Batching

TRAIN_CPU_CALL_TOKENS = 32
"""A training pass's (forward and backward) fixed cost on the CPU, in padded tokens it is worth:
on 2 cores a reranker's step of 2 WikiQA lists of 9 pairs took a median 652 / 599 / 585 / 652 ms
cut at 8 / 16 / 32 / 64 tokens (``bench/train_step.py --calls``, docs/tuning.md)."""


def in_passes(
    lengths: Sequence[int], device: torch.device, run: Callable[[list[int]], torch.Tensor]
) -> torch.Tensor:
    """``run(rows)`` (one output per row, along the first dimension) for every row, in the rows'
    order, each pass the rows of like ``lengths`` (tokens) that ``Batching.plan`` puts together."""
    if not len(lengths):
        return run([])
    call = TRAIN_CPU_CALL_TOKENS if device.type == "cpu" else TORCH_CALL_TOKENS
    plan = Batching(len(lengths), 1 << 40, call).plan(list(lengths))
    if len(plan) == 1:
        return run(list(range(len(lengths))))
    out = torch.cat([run(rows.tolist()) for rows in plan])
    back = torch.from_numpy(np.argsort(np.concatenate(plan), kind="stable")).to(out.device)
    return out.index_select(0, back)
