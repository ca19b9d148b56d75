"""The one rule that cuts pieces into forward passes, from their token counts: what the ONNX loop
(``indexer.embedding.head.encode``), the torch loop (``indexer.encoders.pipeline``) and the
server's micro-batcher (``search.server.batching``) all run, as text-embeddings-inference plans
its batches from tokenised lengths.

A pass costs about its rows times its widest piece (shorter ones are padded) plus a fixed cost
per call (``call_tokens``: about 1 ms of the CPU, ~5 tokens, docs/profile-serve.md; thousands on a
GPU, which a launch keeps idle). The plan is the grouping of the length-sorted pieces that costs
least in all (dynamic programming), each pass at most ``rows`` pieces and ``tokens`` padded
tokens: a short query is never padded to a long sentence, and like lengths share one pass.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

CPU_CALL_TOKENS = 8
"""A pass's fixed cost on the CPU, in tokens of padding it is worth (pass costs of 3 to 200
tokens served the same requests/s, docs/profile-serve.md)."""
GPU_CALL_TOKENS = 4096
"""A pass's fixed cost on a GPU: a launch leaves the device idle, so passes are few and large."""
GPU_TOKENS = 65536
"""Padded tokens in one GPU pass: thousands of short texts, hundreds of long ones."""
GPU_ROWS = 4096


@dataclass(frozen=True)
class Batching:
    """At most ``rows`` pieces and ``tokens`` padded tokens a pass, a pass worth ``call_tokens``."""

    rows: int
    tokens: int
    call_tokens: int = CPU_CALL_TOKENS

    @classmethod
    def on(cls, on_cpu: bool, batch_size: int) -> Batching:
        """The CPU keeps ``batch_size`` rows (its cache-sized passes); a GPU takes a token budget."""
        if on_cpu:
            return cls(rows=batch_size, tokens=batch_size * 1024)
        return cls(max(batch_size, GPU_ROWS), max(batch_size * 512, GPU_TOKENS), GPU_CALL_TOKENS)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    def describe(self) -> str:
        return f"passes of at most {self.rows} texts and {self.tokens} tokens"

    def plan(self, lengths: np.ndarray | list[int]) -> list[np.ndarray]:
        """Piece indices per pass (``lengths``: each piece's tokens), longest pass first (one too
        large for the device fails at once).

        The pieces sorted by length are cut into runs of one length (at most a full pass each),
        and the dynamic programming chooses which neighbouring runs share a pass: a run is kept
        whole (moving some of its pieces to the narrower pass before would add their padding,
        caps aside), and there are few runs (token counts repeat), so planning costs little
        beside the passes."""
        lengths = np.maximum(np.asarray(lengths, dtype=np.int64), 1)
        if len(lengths) == 0:
            return []
        order = np.argsort(lengths, kind="stable")
        ordered = lengths[order]
        edges = [0]  # where each run starts in ``order``
        for start in [*np.flatnonzero(np.diff(ordered)) + 1, len(order)]:
            step = max(1, min(self.rows, self.tokens // int(ordered[edges[-1]])))
            edges += range(edges[-1] + step, int(start), step)
            edges.append(int(start))
        widths = [int(ordered[end - 1]) for end in edges[1:]]
        best = [0] + [0] * len(widths)
        cut = [0] * (len(widths) + 1)
        for end in range(1, len(widths) + 1):
            width, best[end] = widths[end - 1], -1
            for start in range(end - 1, -1, -1):
                rows = edges[end] - edges[start]
                if start < end - 1 and (rows > self.rows or rows * width > self.tokens):
                    break
                cost = best[start] + self.call_tokens + rows * width
                if best[end] < 0 or cost < best[end]:
                    best[end], cut[end] = cost, start
        passes, end = [], len(widths)
        while end:
            passes.append(order[edges[cut[end]] : edges[end]])
            end = cut[end]
        return passes
