"""What every encoder is (``Encoder``), what the factory says about the one it built (``Choice``)
and the part shared by the encoders that run a network in this process (``NetworkEncoder``).

Torch and ONNX Runtime encoders differ only in their network: both tokenise with
``indexer.encoders.tokens`` and run ``indexer.embedding.head.encode``, so a query is embedded by exactly the
code that embedded the corpus.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from indexer.embedding.head import Head, Network, encode
from indexer.embedding.strategy import PRECISION, Strategy
from indexer.encoders.devices import Placement
from indexer.encoders.tokens import TextTokenizer
from indexer.progress import Share, batches


@dataclass(frozen=True)
class Choice:
    """What the factory built for a strategy and why, fixed when the encoder is made."""

    backend: str
    """What runs the network: ``torch``, ``onnx`` / ``onnx-int8`` (ONNX Runtime) or ``ray``."""
    why: str
    """One line: why this backend (asked for, graph cached, graph exported now, export failed...)."""
    export_failure: str | None = None
    """Why the strategy's graph cannot be exported to ONNX, when that was found: queries then run on
    torch, and a build says so."""
    provider: str | None = None
    """The ONNX Runtime execution provider, for the ONNX backends."""

    @property
    def status(self) -> str:
        """What ``info`` shows: ``onnx``, ``torch``, or ``torch (why not onnx)``."""
        if self.backend.startswith("onnx"):
            return "onnx"
        return f"{self.backend} ({self.export_failure})" if self.export_failure else self.backend


class Encoder(Protocol):
    """Texts -> vectors with a resolved strategy. ``embed`` truncates at ``max_length`` (queries,
    sentences; ``role="passage"``: texts read as an index's entries, with the passage prefix);
    ``embed_documents`` embeds passages, chunking long ones when the strategy says so, and gives
    the text index of each vector. ``progress``: told each batch's share of the texts' work
    (``indexer.progress``)."""

    strategy: Strategy
    """The resolved strategy the vectors follow (its backend: what embedded them)."""
    choice: Choice
    placement: Placement
    """Where the vectors are made and at what precision (what ``info`` records)."""

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
        batch_size: int,
        choice: Choice,
    ):
        self.strategy = strategy
        self.tokens = tokens
        self.head = head
        self.network = network
        self.hidden_size = hidden_size
        self.dimension = strategy.dimension(hidden_size)
        self.batch_size = batch_size
        self.choice = choice
        self.placement = Placement("cpu", PRECISION[strategy.backend])
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
            batch_size=self.batch_size,
            pad=self.tokens.pad,
            on_batch=batches(progress, len(ids)),
        )
