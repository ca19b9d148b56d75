"""The one rule that cuts pieces into forward passes, from their token counts: what the ONNX loop
(``indexer.embedding.head.encode``), the torch loop (``indexer.encoders.pipeline``) and the
server's micro-batcher (``search.server.batching``) all run, as text-embeddings-inference plans
its batches from tokenised lengths.

A pass costs about its rows times its widest piece (shorter ones are padded) plus a fixed cost
per call (``call_tokens``: about 1 ms of the CPU, ~5 tokens, docs/profile-serve.md; thousands on a
GPU, which a launch keeps idle). The plan walks the pieces longest first and starts a new pass
where padding the next ones to the pass's width would cost more than a pass, each pass at most
``rows`` pieces and ``tokens`` padded tokens: a short query is never padded to a long sentence,
and like lengths share one pass.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

CPU_CALL_TOKENS = 8
"""A pass's fixed cost on the CPU, in tokens of padding it is worth (pass costs of 3 to 200
tokens served the same requests/s, docs/profile-serve.md)."""
TORCH_CALL_TOKENS = 4096
"""A torch pass's fixed cost: on a GPU a launch leaves the device idle; on the CPU torch's own
per-call cost is as large (64 StackFAQ answers: 2.0 s in 2 full passes, 4.5 s in 5 passes of like
lengths, where ONNX Runtime took 1.42 and 1.35 s). Its passes are few and full."""
CPU_TOKENS = 256
"""Padded tokens per text of the batch size in a pass on the CPU: ``batch_size`` texts of a whole
window (a MiniLM's 256 tokens), and more texts the shorter they are, since a pass's fixed cost is
worth many short texts (TEI plans its batches by a token budget too)."""
TORCH_CPU_ROWS = 32
"""Most texts of the batch size in a torch pass on the CPU: a bound the token budget meets only
with texts of a few tokens."""
ONNX_CPU_ROWS = 16
"""Most texts of the batch size in an ONNX Runtime pass on the CPU (512 at the default 32): 16-token
texts go 512 a call. Where the model is cheap, ONNX Runtime's cost per call and the Python around
each pass are what a build pays; all-MiniLM-L6-v2 embeds as fast in passes of 32 texts as of 128-512 on
short STS-B sentences, StackFAQ answers and whole 256-token windows (docs/performance.md)."""
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
    def on(cls, on_cpu: bool, batch_size: int, runtime: str = "onnx") -> Batching:
        """On the CPU a pass takes ``batch_size`` texts of a whole window and more of shorter
        ones, up to ``CPU_TOKENS`` padded tokens per text of the batch size; a GPU takes a larger
        budget. ``runtime``: what runs the passes (``torch`` or ``onnx``), whose cost per pass
        differs."""
        call = CPU_CALL_TOKENS if runtime == "onnx" else TORCH_CALL_TOKENS
        if on_cpu:
            rows = TORCH_CPU_ROWS if runtime == "torch" else ONNX_CPU_ROWS
            return cls(batch_size * rows, batch_size * CPU_TOKENS, call)
        return cls(max(batch_size, GPU_ROWS), max(batch_size * 512, GPU_TOKENS), TORCH_CALL_TOKENS)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    def describe(self) -> str:
        return f"passes of at most {self.rows} texts and {self.tokens} tokens"

    def plan(self, lengths: np.ndarray | list[int]) -> list[np.ndarray]:
        """Piece indices per pass (``lengths``: each piece's tokens), longest pass first (one too
        large for the device fails at once).

        The pieces go longest first; a pass takes the next run of pieces of one length while their
        padding to the pass's width costs less than a pass of their own (``call_tokens``) and the
        pass keeps within ``rows`` and ``tokens``. One walk over the runs (token counts repeat):
        planning costs little beside the passes."""
        values = np.maximum(np.asarray(lengths, dtype=np.int64).reshape(-1), 1)
        if not len(values):
            return []
        order = np.argsort(-values, kind="stable")  # longest first, like lengths in their order
        ranked = values[order]
        ends = [*(np.flatnonzero(ranked[1:] != ranked[:-1]) + 1).tolist(), len(ranked)]
        cuts, width, start = [0], int(ranked[0]), 0
        for end in ends:  # each run of one length: order[start:end]
            length = int(ranked[start])
            if start > cuts[-1] and (end - start) * (width - length) > self.call_tokens:
                cuts.append(start)
                width = length
            while end - cuts[-1] > max(1, min(self.rows, self.tokens // width)):
                cuts.append(cuts[-1] + max(1, min(self.rows, self.tokens // width)))
                width = length
            start = end
        return [order[a:b] for a, b in zip(cuts, [*cuts[1:], len(order)], strict=True)]
