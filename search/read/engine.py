"""question -> vector -> hits, with the index's own stored strategy and its query encoder (the
indexer's network exported to ONNX and its NumPy head: no torch, see ``indexer.encoders``)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from indexer.embedding.strategy import Strategy
from indexer.encoders.factory import encoder_for, remote_code_refusal
from indexer.encoders.options import EmbeddingOptions, given
from indexer.errors import BadInput, IndexMoved
from indexer.store import StoredIndex, live_version, open_index
from indexer.vectors import single_threaded
from search.read.confidence import Scale, score_kind, unruled
from search.read.encoding import Encoding
from search.read.requests import Embedding, Hit, SearchRequest, check_strategy, here
from search.read.reranked import RERANKER_KEY, RerankOptions
from search.read.snapshot import Plan, Snapshot
from search.read.unloaded import Unloaded

if TYPE_CHECKING:
    from indexer.encoders.base import Encoder
    from indexer.encoders.rerankers import Reranker

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
    """Opens an index once and keeps the model (and its reranker) warm; ``search`` is the hot path.

    ``snapshot`` is the current version; ``reload_if_changed`` publishes a new one when
    ``add``/``delete``/``index`` wrote a new version (the model is reloaded only if the strategy
    changed); ``reloads`` counts them. Take ``snapshot`` once per request: it stays whole whatever
    reloads happen after. ``close`` (or ``with``) ends the threads of the rerankers it loaded and
    closes the index's catalog.
    """

    def __init__(
        self,
        index_dir: str | Path,
        *,
        strategy: dict[str, Any] | None = None,
        options: EmbeddingOptions | None = None,
        rerank: str | Path | bool | Reranker | RerankOptions = True,
    ):
        """``strategy``: what the caller asks for, checked against the stored one (never applied);
        ``options``: how queries embed, for a server (``EmbeddingOptions.for_serving``: by default
        the index's graph on the CPU; ``device="cuda"``: torch on the GPU, for a server of many
        requests; ``provider``: the ONNX Runtime execution provider queries run on,
        ``CUDAExecutionProvider``...). ``rerank``: a cross-encoder's folder that re-orders every
        search's first stage (``SearchRequest.rerank``), loaded once here, or a reranker already
        loaded (``reranker_for``); True: the index's default reranker if it stores one
        (``semsearch index --rerank``); False: none; or ``RerankOptions`` saying which, and the
        options every search takes where it gives none (``backend``: what runs the reranker)."""
        if not isinstance(index_dir, str | os.PathLike):
            kind = type(index_dir).__name__
            raise BadInput(f"index_dir: give the path of an index folder (a str or Path), not {kind}")
        self.path = Path(index_dir)
        self.options = given(options).for_serving().checked()
        self.reloads = 0
        self.closed = False
        self.reloading = threading.Lock()  # the server reloads from its request threads too
        self.rerankers: dict[tuple[str, tuple[object, ...]], Reranker] = {}
        self.loaded: list[Reranker] = []  # the rerankers it loaded itself: closed with it
        self.loading_rerankers = threading.Lock()
        index = open_index(self.path)
        check_strategy(index.strategy, strategy or {})
        said = rerank if isinstance(rerank, RerankOptions) else None
        how = RerankOptions() if said is None else replace(said, model=None, off=False)
        self.rerank = self._default_reranker(index, rerank if said is None else said.engine, how)
        self.reranking = replace(how, model=self.rerank)  # what a search takes where it says none
        self.snapshot = Snapshot(index, Encoding(self._encoder(index), index.transform))

    def _default_reranker(
        self, index: StoredIndex, rerank: str | Path | bool | Reranker, how: RerankOptions
    ) -> str | None:
        """The folder of the reranker every search reranks with (loaded now as ``how`` says, so a
        bad one fails before any search): ``rerank``'s, or the index's stored one (True), whose
        files must still be those it was stored with; one taken by Hub name whose folder is gone
        here is fetched again by its name at its commit (``indexer.embedding.hub``: the cache first)."""
        if rerank is False:
            return None
        if not isinstance(rerank, str | Path | bool):  # loaded already: kept as its folder's
            self.rerankers[self._key(rerank.folder.path, how)] = rerank
            return rerank.folder.path
        if rerank is not True:
            self.reranker(str(rerank), how)
            return str(rerank)
        stored = index.meta.get(RERANKER_KEY)
        if not stored:
            return None
        if not isinstance(stored, dict) or not isinstance(stored.get("path"), str):
            raise BadInput(
                f"the index's {RERANKER_KEY} {stored!r} is not a folder: rebuild with --rerank MODEL"
            )
        folder = stored["path"]
        if not Path(folder).is_dir():
            if not stored.get("name"):
                raise BadInput(
                    f"this index reranks with {folder}, which is not on this machine: give --rerank MODEL "
                    "or --no-rerank"
                )
            folder = self.reranker(stored["name"], how).folder.path  # fetched again, kept by its folder
            self.rerankers[self._key(folder, how)] = self.rerankers.pop(self._key(stored["name"], how))
        loaded = self.reranker(folder, how)
        if loaded.folder.fingerprint != stored.get("fingerprint"):
            raise BadInput(
                f"the reranker at {folder} is not the one this index stored (its files changed): give "
                f"--rerank {folder} to rerank with it as it is now, or --no-rerank"
            )
        return folder

    def reranker(self, folder: str | Path, asked: RerankOptions | None = None) -> Reranker:
        """The reranker of ``folder`` loaded as ``asked`` says (None: as the engine's own options
        say), loaded once per engine for each way it is asked to load (``RerankOptions.load``
        with the engine's embedding options), never per search."""
        how = replace(asked or self.reranking, model=str(folder), off=False)
        key = self._key(folder, how)
        with self.loading_rerankers:
            if key not in self.rerankers:
                loaded = self.rerankers[key] = how.load(self.options)
                self.loaded.append(loaded)
                self.rerankers.setdefault(self._key(folder, how.loaded_as(loaded)), loaded)
            return self.rerankers[key]

    def close(self) -> None:
        """End the pass threads of every reranker the engine loaded (one handed to it is the
        caller's to close) and close the current snapshot's catalog: the engine answers no more."""
        with self.loading_rerankers:
            loaded, self.loaded = self.loaded, []
        for reranker in loaded:
            reranker.close()
        self.closed = True
        self.snapshot.close()

    def __enter__(self) -> SearchEngine:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _key(self, folder: str | Path, asked: RerankOptions | None = None) -> tuple[str, tuple[object, ...]]:
        """What the engine keeps a reranker by: its folder, resolved where it is on this machine,
        and how it loads (``RerankOptions.loading``; None: as the engine's own)."""
        return _folder_key(folder), (asked or self.reranking).loading

    def _encoder(self, index: StoredIndex) -> Encoder:
        """The index's query encoder; ``Unloaded`` where its model may not run here (its own code,
        without ``--trust-remote-code``): keyword searches need none."""
        refusal = remote_code_refusal(index.strategy, self.options)
        if refusal is not None:
            return Unloaded(index.strategy, refusal)
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

    @property
    def refused(self) -> str | None:
        """Why the index's model may not run here (``Unloaded``): only keyword searches answer;
        None where it runs."""
        embedder = self.embedder
        return embedder.refusal if isinstance(embedder, Unloaded) else None

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
        """The k best hits for ``query``, best first, embedded with the index's own strategy
        (``SearchRequest`` says what each parameter does), reranked by the engine's reranker."""
        asked = self.request([query], k=k, where=where, min_score=min_score, group_by=group_by, mode=mode)
        return self.answer(asked)[0]

    def request(self, queries: Sequence[str], **fields: Any) -> SearchRequest:
        """``SearchRequest(queries, **fields)``, reranked by the engine's reranker unless the
        fields name one (``rerank``: a folder or name, ``RerankOptions``; None or False: not
        reranked), with the rerank options given as ``rerank_NAME=`` (``rerank_depth=``,
        ``rerank_backend=``...: ``search.read.reranked.RerankOptions.asked``), the engine's own
        where they give none."""
        named = [name for name in fields if name == "rerank" or name.startswith("rerank_")]
        rerank = RerankOptions.asked(**{name: fields.pop(name) for name in named})
        return SearchRequest(queries, rerank=rerank.given(self.reranking), **fields)  # one string: one query

    def search_many(
        self,
        queries: Sequence[str],
        k: int = 10,
        *,
        embed: Embedding[list[list[Hit]], R] = here,
        **fields: Any,
    ) -> R:
        """``search`` for each query (embedded in one pass; ``fields``: the rest of their
        ``SearchRequest``): ``answer`` of their request."""
        return self.answer(self.request(queries, k=k, **fields), embed=embed)

    def no_rule_note(
        self, mode: str | None, min_score: float | None = None, rerank: str | None = None
    ) -> str | None:
        """One line where a search in ``mode`` (None: the default) reranked by ``rerank`` (a
        folder; None: not reranked) leaves its hits unmarked though the index has no-answer rules
        for other modes or scores, or one fitted on a score the mode no longer shows
        (``search.read.confidence.unruled``); None where its rule or ``min_score`` marks them, or
        the index has no rule."""
        if min_score is not None:
            return None
        score = score_kind(None if rerank is None else self.reranker(rerank).folder.fingerprint)
        return self.retrying(
            lambda snapshot: unruled(snapshot.rules, snapshot.mode(mode, score=score), snapshot.stale, score)
        )

    def note(self, request: SearchRequest) -> str | None:
        """``no_rule_note`` of ``request``."""
        return self.no_rule_note(request.mode, request.min_score, request.reranked_by)

    def keyword_notes(self, queries: Sequence[str], mode: str | None = None) -> list[str | None]:
        """One line per query whose keyword scores are all 0 in ``mode`` (None: the default)
        because none of its words weighs anything (``Snapshot.keyword_notes``); None for the
        others. What the CLI prints with the hits."""
        return self.retrying(lambda snapshot: snapshot.keyword_notes(queries, mode))

    def plan(self, request: SearchRequest, reranker: Reranker | None = None) -> tuple[Snapshot, Plan]:
        """The current snapshot and ``request`` planned on it (checked, its mode resolved, its
        reranker the engine's of its folder loaded as it asks, scored through ``reranker`` where
        that is this one as the caller runs it), on a snapshot that may reopen (a killed writer's
        journal); a request that cannot be searched is refused before any reranker loads."""
        if self.closed:
            raise BadInput("this SearchEngine is closed: open a new one")
        folder = request.checked().reranked_by
        if folder is None:
            reranker = None
        else:
            asked = self.reranker(folder, request.rerank)
            if reranker is None or self.rerankers.get(self._key(reranker.folder.path)) is not asked:
                reranker = asked
        return self.retrying(lambda snapshot: (snapshot, snapshot.plan(request, reranker=reranker)))

    def scale(self, request: SearchRequest) -> Scale:
        """The range of the scores ``request`` shows, which its min score must be in
        (``Plan.scale``): the first stage's, or its reranker's (loaded as it asks) fused."""
        return self.plan(replace(request, min_score=None))[1].scale

    def answer(
        self,
        request: SearchRequest,
        *,
        embed: Embedding[list[list[Hit]], R] = here,
        reranker: Reranker | None = None,
    ) -> R:
        """The one query pipeline (the CLI, Python and the server run it): the plan
        (``Snapshot.plan``: checks, mode, rerank stage), the queries embedded in one pass by
        ``embed`` with the snapshot's encoding (none where the plan reads no vector: a keyword
        search), then its phases over the batch (``run``). What ``embed`` returns is the answer
        (the server's step returns it awaitable). ``reranker``: what scores the pairs of the
        request's reranker (its folder's), where not the engine's own: the server's, through its
        batcher."""
        snapshot, plan = self.plan(request, reranker)
        encoding = snapshot.encoding if snapshot.reads_vectors(plan) else snapshot.encoding.vectorless()
        queries = list(request.queries)
        return embed(encoding, queries, lambda vectors: self.run(snapshot, plan, vectors))

    def run(self, snapshot: Snapshot, plan: Plan, vectors: np.ndarray) -> list[list[Hit]]:
        """``plan`` run on ``snapshot`` with its queries' ``vectors`` (``Snapshot.run``); where an
        update commits under it, on the reopened one, a few times: with the same vectors where it
        embeds alike, else with the queries embedded again by its encoding (a new strategy or
        transform under a running search, or a plan that read no vector where the new one does:
        rare, so done here rather than by the embedding step)."""
        for _ in range(RETRIES):
            try:
                return snapshot.run(plan, vectors)
            except IndexMoved:
                self.reload_if_changed()
                fresh = self.snapshot
                unread = not vectors.shape[1]  # a plan that read no vector (``reads_vectors``)
                alike = _embeds_alike(fresh.encoding, snapshot.encoding)
                if fresh.reads_vectors(plan) and (unread or not alike):
                    vectors = fresh.encoding.embed(list(plan.queries))
                snapshot = fresh
        return snapshot.run(plan, vectors)

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


def _folder_key(folder: str | Path) -> str:
    """A reranker folder as the engine keeps its reranker: resolved where it is on this machine."""
    return str(Path(folder).resolve()) if Path(folder).exists() else str(folder)


def _embeds_alike(one: Encoding, other: Encoding) -> bool:
    """Whether two snapshots' encodings give the same query vectors: one encoder, equal transforms."""
    if one.embedder is not other.embedder:
        return False
    a, b = one.transform, other.transform
    if a is None or b is None:
        return a is b
    same_matrix = (a.matrix is None) == (b.matrix is None) and (
        a.matrix is None or np.array_equal(a.matrix, b.matrix)
    )
    return same_matrix and np.array_equal(a.mean, b.mean)
