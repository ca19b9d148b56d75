"""What every encoder is (``Encoder``), what the factory decided for the one it built (``Decision``)
and the part shared by the encoders that run a network in this process (``NetworkEncoder``).

Torch and ONNX Runtime encoders differ only in their network: both tokenise with
``indexer.encoders.tokens`` and run ``indexer.embedding.head.encode``, so a query is embedded by exactly the
code that embedded the corpus.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from indexer.embedding.batching import Batching
from indexer.embedding.head import Head, Network, encode
from indexer.embedding.strategy import Strategy
from indexer.encoders.devices import Placement
from indexer.encoders.tokens import TextTokenizer
from indexer.progress import Share, batches

if TYPE_CHECKING:
    from indexer.embedding.graphs import GraphSpec


@dataclass(frozen=True)
class Decision:
    """What will embed a strategy's texts, decided before anything loads
    (``indexer.encoders.factory.decide``), and carried by the encoder it made: the runtime, the
    device and precision, the batching, Ray or not, and why (a fallback says so here: it is a
    decision too). ``info`` shows the record a build or an add wrote (``record``)."""

    runtime: str
    """What runs the network: ``torch`` or ``onnx`` (ONNX Runtime), on Ray's workers when ``ray``."""
    placement: Placement
    """The device and precision (``int8`` for ``onnx-int8``)."""
    batching: Batching
    why: str
    """One line: why this runtime (asked for, graph cached, exported now, export failed...)."""
    ray: str | None = None
    """The Ray address the texts are embedded at, each worker on ``placement``; None: here."""
    workers: int | None = None
    """Ray actors (None: one per CPU of the cluster)."""
    export_failure: str | None = None
    """Why the strategy's graph cannot be exported to ONNX, when that was found: queries then run on
    torch, and a build says so."""
    provider: str | None = None
    """The ONNX Runtime execution provider."""
    graph: GraphSpec | None = field(default=None, compare=False)
    """The exported graph ONNX Runtime runs."""
    strategy: Strategy | None = field(default=None, compare=False)
    """The resolved strategy that graph runs, where known before loading."""
    export: bool = False
    """The graph must be exported from the torch model first (a failure falls back to torch)."""

    @property
    def status(self) -> str:
        """What ``info`` shows for queries: ``onnx``, ``torch``, or ``torch (why not onnx)``."""
        if self.runtime == "onnx":
            return "onnx"
        return f"torch ({self.export_failure})" if self.export_failure else "torch"

    def record(self) -> dict[str, Any]:
        """What the index keeps of it (``info``'s ``embedded``)."""
        return {
            "runtime": self.runtime,
            **self.placement.to_dict(),
            "batching": self.batching.to_dict(),
            "ray": self.ray,
            "workers": self.workers,
            "why": self.why,
        }

    def same_work(self, other: Decision) -> bool:
        """Whether ``other`` embeds as this does: runtime, kind of device, precision, batching
        (what a Ray worker is checked against; its GPU may be numbered otherwise)."""
        return (self.runtime, self.placement.on_cpu, self.placement.precision, self.batching) == (
            other.runtime,
            other.placement.on_cpu,
            other.placement.precision,
            other.batching,
        )


def describe_record(record: dict[str, Any]) -> str:
    """One line of ``Decision.record`` (or of an older index's device and precision alone)."""
    line = f"{record['device']}, {record['precision']}"
    if "runtime" not in record:
        return line
    batching = Batching(**record["batching"]).describe()
    count = record["workers"]
    workers = "a worker per CPU" if count is None else f"{count} worker" + ("s" if count > 1 else "")
    where = f" on Ray at {record['ray']} ({workers})" if record["ray"] else ""
    return f"{record['runtime']}{where}, {line}, {batching}; {record['why']}"


class Encoder(Protocol):
    """Texts -> vectors with a resolved strategy. ``embed`` truncates at ``max_length`` (queries,
    sentences; ``role="passage"``: texts read as an index's entries, with the passage prefix);
    ``embed_documents`` embeds passages, chunking long ones when the strategy says so, and gives
    the text index of each vector. ``progress``: told each batch's share of the texts' work
    (``indexer.progress``)."""

    strategy: Strategy
    """The resolved strategy the vectors follow (its backend: what embedded them)."""
    decision: Decision
    """What embeds the vectors, where, how batched, and why (what ``info`` records)."""

    def embed(
        self, texts: Sequence[str], *, progress: Share | None = None, role: str = "query"
    ) -> np.ndarray: ...

    def embed_documents(
        self, texts: Sequence[str], *, progress: Share | None = None
    ) -> tuple[np.ndarray, np.ndarray]: ...


class NetworkEncoder:
    """An ``Encoder`` running a ``Network`` in this process: tokens -> network -> head.
    A backend subclass builds the network (and the tokenizer and head of its model)."""

    def __init__(
        self,
        strategy: Strategy,
        tokens: TextTokenizer,
        head: Head,
        network: Network,
        *,
        hidden_size: int,
        decision: Decision,
    ):
        self.strategy = strategy
        self.tokens = tokens
        self.head = head
        self.network = network
        self.hidden_size = hidden_size
        self.dimension = strategy.dimension(hidden_size)
        self.decision = decision
        self.copies: Sequence[Network] = ()
        """More copies of the network that run batches beside it (``indexer.encoders.onnx_encoder``)."""

    def embed(
        self, texts: Sequence[str], *, progress: Share | None = None, role: str = "query"
    ) -> np.ndarray:
        """One float32 vector per text (queries, sentences; or passages): always truncated at
        max_length."""
        return self.run(self.tokens.ids(texts, role), [self.head], progress=progress)[0]

    def embed_documents(
        self, texts: Sequence[str], *, progress: Share | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Vectors for documents and the text index of each (several per text when chunking)."""
        tokenized = self.tokens.documents(texts)
        return self.run(tokenized.ids, [self.head], progress=progress)[0], tokenized.owners

    def embed_ids(self, ids: Sequence[Sequence[int]], *, progress: Share | None = None) -> np.ndarray:
        """One float32 vector per text already tokenised (``tokens.ids``, ``tokens.documents``):
        what a server that counts tokens at its door, or a build that tokenises ahead, hands the
        model."""
        return self.run(ids, [self.head], progress=progress)[0]

    @property
    def sessions(self) -> Sequence[Network]:
        """The network and its copies: what runs batches side by side."""
        return (self.network, *self.copies)

    def run(
        self, ids: Sequence[Sequence[int]], heads: Sequence[Head], *, progress: Share | None = None
    ) -> list[np.ndarray]:
        """Token ids through the network; each head turns them into its vectors."""
        dimensions = [h.strategy.dimension(self.hidden_size) for h in heads]
        return encode(
            self.sessions,
            ids,
            heads,
            dimensions,
            batching=self.decision.batching,
            pad=self.tokens.pad,
            on_batch=batches(progress, len(ids)),
        )
