"""The ASGI app: its route table over top-level handlers (``search.server.routes``), over a
``LiveEngine`` and one ``MicroBatcher``. A new endpoint is a handler here and a row of ``ROUTES``
(its request model in ``schema``); each handler finds what it serves on ``request.app.state``
(``live``, ``batcher``, ``scans``, ``reranking``, ``encoding``, ``names``; ``closing``: what
shutdown closes)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi import Query as QueryParam

from indexer.errors import BadInput
from search.read.engine import SearchEngine, configure_threads
from search.read.loading import load_engine
from search.read.requests import SearchRequest as Asked
from search.read.similar import rank_similar
from search.read.snapshot import Snapshot
from search.server.batching import MicroBatcher
from search.server.connections import BodyLimit, while_connected
from search.server.encode import add_encode_routes, encode_only
from search.server.live import LiveEngine
from search.server.names import ServedNames, list_models, naming
from search.server.page import add_page
from search.server.rerank import NO_RERANKER, Served, cohere_rerank, cohere_v2_rerank, tei_rerank
from search.server.routes import new_app, post
from search.server.scans import MAX_DUPLICATE_PAIRS, Scans
from search.server.schema import (
    MAX_BATCH,
    BatchRequest,
    OpenAIError,
    RerankAnswer,
    RerankRequest,
    RerankV2Answer,
    RerankV2Request,
    SearchRequest,
    SimilarRequest,
    TeiRank,
    TeiRerankRequest,
    answered,
    answers,
    check_pairs,
    install_openapi,
)

if TYPE_CHECKING:
    from indexer.encoders.rerankers import Reranker
    from search.read.encoding import Encoding, Roles
    from search.read.requests import Hit


def noted(*notes: str | None) -> dict[str, str]:
    """``{"note": ...}`` holding the notes there are (joined by "; "), else nothing."""
    said = [note for note in notes if note]
    return {"note": "; ".join(said)} if said else {}


def asked(engine: SearchEngine, queries: list[str], body: SearchRequest | BatchRequest) -> Asked:
    """The search a body asks of ``engine``, checked: reranked by the engine's reranker unless it
    says ``rerank: false``, with its rerank options (``Searching.reranking``); ``rerank: true``
    where the engine has none, or more pairs to rerank than one request may cause
    (``check_pairs``), is one line, before any model work."""
    if body.rerank and engine.rerank is None:
        raise BadInput(f"rerank: {NO_RERANKER}")
    search = engine.request(
        queries,
        k=body.k,
        where=body.where,
        min_score=body.min_score,
        group_by=body.group_by,
        mode=body.mode,
        rerank=body.reranking(),
    ).checked()
    if search.reranked_by is not None:
        check_pairs(len(queries), search.depth)
    return search


def reranker_of(engine: SearchEngine) -> Reranker | None:
    """The reranker ``engine`` reranks with, or None."""
    return None if engine.rerank is None else engine.reranker(engine.rerank)


def through(batcher: MicroBatcher, answer: Callable[[Any], Any], waits: bool = False) -> Callable[..., Any]:
    """The pipeline's embedding step (``search.read.requests.Embedding``) through ``batcher``,
    ``answer`` shaping the result on the lookup thread (JSON-ready dicts, off the event loop);
    ``waits``: the lookup scores rerank pairs through the batcher (``MicroBatcher.run``)."""

    def shaped(then: Callable[[np.ndarray], Any]) -> Callable[[np.ndarray], Any]:
        return lambda vectors: answer(then(vectors))

    def step(
        encoding: Encoding, texts: list[str], then: Callable[[np.ndarray], Any], roles: Roles = "query"
    ) -> Any:
        return batcher.run(encoding, texts, shaped(then), roles, waits)

    return step


def to_dicts(hits: list[Hit]) -> list[dict[str, Any]]:
    return [hit.to_dict() for hit in hits]


def each_to_dicts(found: list[list[Hit]]) -> list[list[dict[str, Any]]]:
    return [to_dicts(hits) for hits in found]


async def searched(request: Request, queries: list[str], body: SearchRequest | BatchRequest) -> tuple:
    """The engine, the search ``body`` asks for ``queries`` and each query's hits as dicts."""
    state = request.app.state
    engine = await state.live.engine()
    search = asked(engine, queries, body)
    step = through(state.batcher, each_to_dicts, waits=search.reranked_by is not None)
    found = engine.answer(search, embed=step, reranker=await state.reranking.batched())
    return engine, search, await while_connected(request, found)


async def search_one(body: SearchRequest, request: Request) -> dict[str, Any]:
    """Top-k entries for one query, optionally filtered on stored fields first and grouped by
    one (the best entry per value)."""
    engine, search, (hits,) = await searched(request, [body.query], body)
    (keyword,) = engine.keyword_notes([body.query], body.mode)
    return {"query": body.query, "hits": hits, **noted(engine.note(search), keyword)}


async def search_batch(body: BatchRequest, request: Request) -> dict[str, Any]:
    """Top-k entries for each of up to 64 queries, embedded in one pass."""
    engine, search, results = await searched(request, body.queries, body)
    keyword = engine.keyword_notes(body.queries, body.mode)
    answer = [
        {"query": q, "hits": h, **noted(n)} for q, h, n in zip(body.queries, results, keyword, strict=True)
    ]
    return {"results": answer, **noted(engine.note(search))}


async def similar_one(body: SimilarRequest, request: Request) -> dict[str, Any]:
    """Rank the candidates by similarity to the sentence, with the index's strategy and its
    fitted post-processing."""
    state = request.app.state
    encoding = (await state.live.current()).encoding
    step = through(state.batcher, to_dicts)
    ranked = rank_similar(body.sentence, body.candidates, k=body.k, encoding=encoding, embed=step)
    return {"query": body.sentence, "hits": await while_connected(request, ranked)}


async def duplicates(
    request: Request,
    min_score: Annotated[float, QueryParam(gt=0, le=1)] = 0.9,
    limit: Annotated[int, QueryParam(ge=0, le=MAX_DUPLICATE_PAIRS)] = 100,
) -> dict[str, Any]:
    """Pairs of entries at cosine >= min_score (the best ``limit``, at most 1000) and their groups."""
    state = request.app.state
    snapshot = await state.live.current()
    return await while_connected(request, state.scans.scan(snapshot, min_score, limit))


async def info(request: Request) -> dict[str, Any]:
    state = request.app.state
    engine = await state.live.engine()
    return {
        **await asyncio.to_thread(engine.retrying, Snapshot.info),
        **await naming(request),
        "reranking": engine.rerank,  # the reranker its searches rerank with (None: none)
        "reloads": state.live.reloads,
        "largest_batch": state.batcher.largest,
        "dropped": state.batcher.dropped,
    }


async def fields(request: Request) -> dict[str, Any]:
    """Each stored field's type; its values with counts when it has few; min/max if numeric."""
    engine = await request.app.state.live.engine()
    return {"fields": await asyncio.to_thread(engine.retrying, Snapshot.facets)}


async def force_reload(request: Request) -> dict[str, Any]:
    live = request.app.state.live
    snapshot = await live.current(force=True)
    return {"version": snapshot.index.version.name, "reloads": live.reloads}


async def health(request: Request) -> dict[str, str]:
    """ok while the server can serve: a server over an index whose files cannot be read is a 503
    (``LiveEngine.check``: at most one cheap look a reload interval)."""
    live = getattr(request.app.state, "live", None)
    if live is not None:
        await live.check()
    return {"status": "ok"}


ROUTES = (
    ("/search", search_one, SearchRequest, answers(400, 413, 503)),
    ("/search/batch", search_batch, BatchRequest, answers(400, 413, 503)),
    ("/similar", similar_one, SimilarRequest, answers(400, 413, 503)),
)
"""The index's JSON POST routes: path, handler, request model, error answers."""
RERANK_ROUTES = (
    ("/v1/rerank", cohere_rerank, RerankRequest, answered(RerankAnswer, 400, 404, 413, 503)),
    ("/v2/rerank", cohere_v2_rerank, RerankV2Request, answered(RerankV2Answer, 400, 404, 413, 503)),
    ("/rerank", tei_rerank, TeiRerankRequest, answered(list[TeiRank], 400, 404, 413, 503)),
)
"""The rerank routes of every server (a 404 where it has no reranker)."""
GETS = (
    ("/duplicates", duplicates, answers(400, 503)),
    ("/info", info, answers(503)),
    ("/fields", fields, answers(503)),
)


def add_shared_routes(app: FastAPI) -> None:
    """The routes of every server, with an index or without: health, the models it runs, and the
    rerank APIs."""
    app.add_api_route("/health", health, methods=["GET"], responses=answers(503))
    app.add_api_route("/health", health, methods=["HEAD"], include_in_schema=False)
    app.add_api_route("/v1/models", list_models, methods=["GET"], responses=answers(503, shape=OpenAIError))
    for path, handler, model, responses in RERANK_ROUTES:
        post(app, path, handler, model, responses=responses)


def add_index_routes(app: FastAPI) -> None:
    """The routes of a server over an index: search, similar, duplicates, info, fields, reload
    and the page."""
    for path, handler, model, responses in ROUTES:
        post(app, path, handler, model, responses=responses)
    for path, handler, responses in GETS:
        app.add_api_route(path, handler, methods=["GET"], responses=responses)
    add_page(app)
    app.add_api_route("/reload", force_reload, methods=["POST"], responses=answers(503))


@asynccontextmanager
async def closing_at_shutdown(app: FastAPI) -> AsyncIterator[None]:
    """What the app was given to load ends with it: at shutdown the engine (its rerankers' pass
    threads, its catalog) or the reranker served alone is closed."""
    yield
    for loaded in app.state.closing:
        if loaded.done() and loaded.exception() is None:
            await asyncio.to_thread(loaded.result().close)


def create_app(
    index_dir: str | Path | None,
    *,
    max_batch: int = MAX_BATCH,
    reload_every: float = 1.0,
    loading: Future[SearchEngine] | None = None,
    encoding: Future[Encoding] | None = None,
    reranking: Future[Reranker] | None = None,
    names: ServedNames | None = None,
) -> FastAPI:
    """Load the index and model now (so a bad index fails before the server binds), and set up the
    serving process (``configure_threads``). The engine loads in a thread while the routes are set
    up; ``loading``: an engine already loading (``semsearch serve`` starts it before importing
    anything heavy, to overlap those imports too: ``search.read.loading``), whose reranker reranks
    its searches and answers the rerank endpoints. ``index_dir`` None: serve vectors alone, with
    the ``encoding`` loading (``search.read.loading.load_encoding``), and pairs scored by the
    ``reranking`` one if given. ``names``: what its models are called (``serve --served-model-name``)."""
    configure_threads()
    if loading is None and index_dir is not None:
        loading = load_engine(index_dir)
    app = new_app(
        title="semsearch",
        description="Semantic search over a semsearch index.",
        version="0.1.0",
        lifespan=closing_at_shutdown,
    )
    app.state.closing = [f for f in (loading, reranking) if f is not None]
    app.add_middleware(BodyLimit)  # FastAPI's routes; the table reads its bodies within the same bound
    app.state.batcher = batcher = MicroBatcher(max_batch)
    app.state.names = names or ServedNames()
    add_shared_routes(app)
    if index_dir is None:

        async def served_alone() -> Reranker | None:
            return None if reranking is None else reranking.result()

        app.state.reranking = Served(batcher, served_alone)
        if reranking is not None:
            reranking.result()  # a reranker that cannot load fails here, before the server binds
        install_openapi(app)
        return encode_only(app, encoding)
    app.state.live = live = LiveEngine(loading, index_dir, reload_every)
    app.state.scans = Scans()

    async def served_reranker() -> Reranker | None:
        return reranker_of(await live.engine())

    async def current_encoding() -> Encoding:
        return (await live.current()).encoding

    app.state.reranking = Served(batcher, served_reranker)
    add_encode_routes(app, current_encoding)
    add_index_routes(app)
    install_openapi(app)
    loading.result()  # a bad index fails here, before the server binds
    return app
