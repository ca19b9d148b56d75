"""question -> vector -> hits, with the index's own stored strategy and its query encoder (the
indexer's network exported to ONNX and its NumPy head: no torch, see ``indexer.encoders``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from indexer.embedding.strategy import Strategy
from indexer.encoders.factory import encoder_for
from indexer.encoders.options import EmbeddingOptions, given
from indexer.errors import IndexMoved
from indexer.store import StoredIndex, live_version, open_index
from indexer.vectors import single_threaded
from search.read.confidence import unruled
from search.read.encoding import Encoding
from search.read.requests import Embedding, Hit, check_strategy, here
from search.read.snapshot import Snapshot

if TYPE_CHECKING:
    from indexer.encoders.base import Encoder

T = TypeVar("T")
R = TypeVar("R")

RETRIES = 3
"""Times a search is redone on a reopened snapshot when updates commit under it."""


def configure_threads() -> None:
    """Process setting for serving and searching: one FAISS (OpenMP) thread.

    One query at a time gains nothing from FAISS threads, and their OpenMP spin-wait after each
    search steals the cores torch needs for the next query: measured 10.2 -> 5.2 ms per query.
    Called once where the process is set up (the server's ``create_app``, the CLI), never by a
    constructor.
    """
    single_threaded()


class SearchEngine:
    """Opens an index once and keeps the model warm; ``search`` is the hot path.

    ``snapshot`` is the current version; ``reload_if_changed`` publishes a new one when
    ``add``/``delete``/``index`` wrote a new version (the model is reloaded only if the strategy
    changed); ``reloads`` counts them. Take ``snapshot`` once per request: it stays whole whatever
    reloads happen after.
    """

    def __init__(
        self,
        index_dir: str | Path,
        *,
        strategy: dict[str, Any] | None = None,
        options: EmbeddingOptions | None = None,
    ):
        """``strategy``: what the caller asks for, checked against the stored one (never applied);
        ``options``: how queries embed, for a server (``EmbeddingOptions.for_serving``: by default
        the index's graph on the CPU; ``device="cuda"``: torch on the GPU, for a server of many
        requests; ``provider``: the ONNX Runtime execution provider queries run on,
        ``CUDAExecutionProvider``...)."""
        self.path = Path(index_dir)
        self.options = given(options).for_serving().checked()
        self.reloads = 0
        self.reloading = threading.Lock()  # the server reloads from its request threads too
        index = open_index(self.path)
        check_strategy(index.strategy, strategy or {})
        self.snapshot = Snapshot(index, Encoding(self._encoder(index), index.transform))

    def _encoder(self, index: StoredIndex) -> Encoder:
        return encoder_for(index.strategy, self.options, queries=True, held=index.graph)

    @property
    def index(self) -> StoredIndex:
        return self.snapshot.index

    @property
    def embedder(self) -> Encoder:
        return self.snapshot.encoding.embedder

    @property
    def strategy(self) -> Strategy:
        return self.snapshot.index.strategy

    def reload_if_changed(self) -> bool:
        with self.reloading:
            current = self.snapshot
            if live_version(self.path) == current.index.version.name and not current.changed():
                return False
            fresh = open_index(self.path)
            same = fresh.strategy == current.index.strategy
            encoder = current.encoding.embedder if same else self._encoder(fresh)
            self.snapshot = Snapshot(fresh, Encoding(encoder, fresh.transform))
            self.reloads += 1
            return True

    def search(
        self,
        query: str,
        k: int = 10,
        where: str | None = None,
        min_score: float | None = None,
        group_by: str | None = None,
        mode: str | None = None,
    ) -> list[Hit]:
        """The k best hits for ``query``, best first, embedded with the index's own strategy.

        ``where``: a filter on stored fields (``search.read.filters``), applied before the vectors are
        compared. ``min_score``: hits scoring below this are marked not answered, in any mode
        (one scale: ``search.read.hybrid``; over the calibrated rule). ``group_by``: a stored field;
        the best hit per value of it (k groups, each hit's ``others`` counting the rest of its
        group), e.g. one FAQ question with several answers shown once. ``mode``: dense, keyword
        or hybrid (``search.read.hybrid``; None: the index's default, ``Snapshot.mode``)."""
        return self.search_many([query], k, where, min_score, group_by, mode)[0]

    def no_rule_note(self, mode: str | None, min_score: float | None = None) -> str | None:
        """One line where a search in ``mode`` (None: the default) leaves its hits unmarked
        though the index has no-answer rules for other modes, or one fitted on a score the mode no
        longer shows (``search.read.confidence.unruled``);
        None where its rule or ``min_score`` marks them, or the index has no rule."""
        if min_score is not None:
            return None
        return self.retrying(lambda snapshot: unruled(snapshot.rules, snapshot.mode(mode), snapshot.stale))

    def keyword_notes(self, queries: Sequence[str], mode: str | None = None) -> list[str | None]:
        """One line per query whose keyword scores are all 0 in ``mode`` (None: the default)
        because none of its words weighs anything (``Snapshot.keyword_notes``); None for the
        others. What the CLI prints with the hits."""
        return self.retrying(lambda snapshot: snapshot.keyword_notes(queries, mode))

    def search_many(
        self,
        queries: Sequence[str],
        k: int = 10,
        where: str | None = None,
        min_score: float | None = None,
        group_by: str | None = None,
        mode: str | None = None,
        *,
        embed: Embedding[list[list[Hit]], R] = here,
    ) -> R:
        """``search`` for each query: the one query pipeline (the CLI, Python and the server run
        it). The queries are embedded in one pass by ``embed`` with the current snapshot's
        encoding, then looked up on that snapshot (``retrying``); what ``embed`` returns is the
        answer (the server's step returns it awaitable)."""
        # checked before embedding, on a snapshot that may reopen (a killed writer's journal)
        first, plan = self.retrying(lambda s: (s, s.plan(queries, k, where, min_score, group_by, mode)))

        def look_up(vectors: np.ndarray) -> list[list[Hit]]:
            def attempt(snapshot: Snapshot) -> list[list[Hit]]:
                return snapshot.run(plan, vectors if snapshot is first else snapshot.embed(queries))

            return self.retrying(attempt, first)

        return embed(first.encoding, list(queries), look_up)

    def retrying(self, work: Callable[[Snapshot], T], snapshot: Snapshot | None = None) -> T:
        """``work`` on ``snapshot`` (default the current one), redone on a reopened one when an
        update committed under it (``IndexMoved``), a few times before the error reaches the caller."""
        snapshot = snapshot or self.snapshot
        for _ in range(RETRIES):
            try:
                return work(snapshot)
            except IndexMoved:
                self.reload_if_changed()
                snapshot = self.snapshot
        return work(snapshot)
