"""The ASGI app: its routes and error handlers, over a ``LiveEngine`` and one ``MicroBatcher``.
A new endpoint goes here (its request model in ``schema``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi import Query as QueryParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException

from indexer.catalog import DatabaseError
from indexer.errors import BadInput, SemsearchError
from search.read.engine import SearchEngine, configure_threads
from search.read.loading import load_engine
from search.read.requests import SearchRequest as Asked
from search.read.similar import rank_similar
from search.read.snapshot import Snapshot
from search.server.batching import MicroBatcher
from search.server.connections import BodyLimit, ClientGone, while_connected
from search.server.encode import add_encode_routes, encode_only
from search.server.errors import error_answer
from search.server.live import LiveEngine
from search.server.names import ServedNames, list_models, naming
from search.server.page import add_page
from search.server.rerank import NO_RERANKER, Served, cohere_rerank, cohere_v2_rerank, tei_rerank
from search.server.scans import MAX_DUPLICATE_PAIRS, Scans
from search.server.schema import (
    MAX_BATCH,
    BatchRequest,
    OpenAIError,
    RerankAnswer,
    RerankV2Answer,
    SearchRequest,
    SimilarRequest,
    TeiRank,
    answered,
    answers,
    install_openapi,
)

if TYPE_CHECKING:
    from indexer.encoders.rerankers import Reranker
    from search.read.encoding import Encoding, Roles
    from search.read.requests import Hit


def _field_error(error: dict[str, Any]) -> str:
    """One line for a validation error: ``<field>: <message>`` (``body`` for unreadable JSON)."""
    location = [str(part) for part in error.get("loc", ()) if part != "body"]
    where = "body" if error.get("type") == "json_invalid" or not location else ".".join(location)
    return f"{where}: {error.get('msg', 'invalid')}"


def noted(*notes: str | None) -> dict[str, str]:
    """``{"note": ...}`` holding the notes there are (joined by "; "), else nothing."""
    said = [note for note in notes if note]
    return {"note": "; ".join(said)} if said else {}


def asked(engine: SearchEngine, queries: list[str], body: SearchRequest | BatchRequest) -> Asked:
    """The search a body asks of ``engine``: reranked by the engine's reranker unless it says
    ``rerank: false``; ``rerank: true`` where the engine has none is one line."""
    if body.rerank and engine.rerank is None:
        raise BadInput(f"rerank: {NO_RERANKER}")
    return engine.request(
        queries,
        k=body.k,
        where=body.where,
        min_score=body.min_score,
        group_by=body.group_by,
        mode=body.mode,
        rerank=None if body.rerank is False else engine.rerank,
        rerank_depth=body.rerank_depth,
    )


def reranker_of(engine: SearchEngine) -> Reranker | None:
    """The reranker ``engine`` reranks with, or None."""
    return None if engine.rerank is None else engine.reranker(engine.rerank)


async def user_error(request: Request, exc: SemsearchError) -> JSONResponse:
    """The user's error: its status, its one line (and its OpenAI ``code``, where it has one)."""
    return error_answer(request.url.path, exc.http_status, str(exc), code=getattr(exc, "code", None))


async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    return error_answer(request.url.path, 400, "; ".join(_field_error(e) for e in exc.errors()[:3]))


async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's own answers (404, 405, a body FastAPI cannot parse) in the one shape."""
    return error_answer(request.url.path, exc.status_code, str(exc.detail), exc.headers)


async def unreadable(request: Request, exc: Exception) -> JSONResponse:
    """The index's files failed under the server (removed, garbled): it cannot serve."""
    reason = " ".join(str(exc).split()) or type(exc).__name__
    return error_answer(request.url.path, 503, f"the index cannot be read: {reason}")


async def client_gone(request: Request, exc: ClientGone) -> Response:
    return Response(status_code=499)  # nobody reads it: the connection is closed


async def internal_error(request: Request, exc: Exception) -> JSONResponse:
    return error_answer(request.url.path, 500, f"internal error: {type(exc).__name__}")


ERROR_HANDLERS: dict[type[Exception], Callable[..., Any]] = {
    SemsearchError: user_error,
    RequestValidationError: invalid_request,
    HTTPException: http_error,
    DatabaseError: unreadable,
    OSError: unreadable,
    ClientGone: client_gone,
    Exception: internal_error,
}


def add_error_handlers(app: FastAPI) -> None:
    """Every failure answered in its route's error shape (``search.server.errors``), never a trace."""
    for kind, handler in ERROR_HANDLERS.items():
        app.add_exception_handler(kind, handler)


async def health() -> dict[str, str]:
    return {"status": "ok"}


RERANK_ROUTES = (
    ("/v1/rerank", cohere_rerank, RerankAnswer),
    ("/v2/rerank", cohere_v2_rerank, RerankV2Answer),
    ("/rerank", tei_rerank, list[TeiRank]),
)


def add_shared_routes(app: FastAPI) -> None:
    """The routes of every server, with an index or without: health, the models it runs, and the
    rerank APIs (a 404 where it has no reranker)."""
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/health", health, methods=["HEAD"], include_in_schema=False)
    app.add_api_route("/v1/models", list_models, methods=["GET"], responses=answers(503, shape=OpenAIError))
    for path, handler, answer in RERANK_ROUTES:
        app.add_api_route(path, handler, methods=["POST"], responses=answered(answer, 400, 404, 413, 503))


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
    batcher = MicroBatcher(max_batch)
    app = FastAPIOffline(
        title="semsearch", description="Semantic search over a semsearch index.", version="0.1.0"
    )
    app.add_middleware(BodyLimit)

    add_error_handlers(app)
    add_shared_routes(app)
    app.state.names = names or ServedNames()
    if index_dir is None:

        async def served_alone() -> Reranker | None:
            return None if reranking is None else reranking.result()

        app.state.reranking = Served(batcher, served_alone)
        if reranking is not None:
            reranking.result()  # a reranker that cannot load fails here, before the server binds
        install_openapi(app)
        return encode_only(app, batcher, encoding)
    live = LiveEngine(loading, index_dir, reload_every)
    scans = Scans()

    async def served_reranker() -> Reranker | None:
        return reranker_of(await live.engine())

    app.state.reranking = Served(batcher, served_reranker)

    async def current_encoding() -> Encoding:
        return (await live.current()).encoding

    add_encode_routes(app, batcher, current_encoding)

    def batched(answer: Callable[[Any], Any]) -> Callable[..., Any]:
        """The pipeline's embedding step through the micro-batcher, ``answer`` shaping the result
        on the lookup thread (JSON-ready dicts, off the event loop)."""

        def shaped(then: Callable[[np.ndarray], Any]) -> Callable[[np.ndarray], Any]:
            return lambda vectors: answer(then(vectors))

        def step(
            encoding: Encoding, texts: list[str], then: Callable[[np.ndarray], Any], roles: Roles = "query"
        ) -> Any:
            return batcher.run(encoding, texts, shaped(then), roles)

        return step

    def to_dicts(hits: list[Hit]) -> list[dict[str, Any]]:
        return [hit.to_dict() for hit in hits]

    each_to_dicts = batched(lambda found: [to_dicts(hits) for hits in found])

    @app.post("/search", responses=answers(400, 413, 503))
    async def search_one(body: SearchRequest, request: Request) -> dict[str, Any]:
        """Top-k entries for one query, optionally filtered on stored fields first and grouped by
        one (the best entry per value)."""
        engine = await live.engine()
        search = asked(engine, [body.query], body)
        found = engine.answer(search, embed=each_to_dicts, reranker=await app.state.reranking.batched())
        answer = {"query": body.query, "hits": (await while_connected(request, found))[0]}
        (keyword,) = engine.keyword_notes([body.query], body.mode)
        return {**answer, **noted(engine.note(search), keyword)}

    @app.post("/search/batch", responses=answers(400, 413, 503))
    async def search_batch(body: BatchRequest, request: Request) -> dict[str, Any]:
        """Top-k entries for each of up to 64 queries, embedded in one pass."""
        engine = await live.engine()
        search = asked(engine, body.queries, body)
        reranker = await app.state.reranking.batched()
        results = await while_connected(
            request, engine.answer(search, embed=each_to_dicts, reranker=reranker)
        )
        keyword = engine.keyword_notes(body.queries, body.mode)
        answer = {
            "results": [
                {"query": q, "hits": h, **noted(n)}
                for q, h, n in zip(body.queries, results, keyword, strict=True)
            ]
        }
        return {**answer, **noted(engine.note(search))}

    @app.post("/similar", responses=answers(400, 413, 503))
    async def similar_one(body: SimilarRequest, request: Request) -> dict[str, Any]:
        """Rank the candidates by similarity to the sentence, with the index's strategy and its
        fitted post-processing."""
        encoding = (await live.current()).encoding
        ranked = rank_similar(
            body.sentence, body.candidates, k=body.k, encoding=encoding, embed=batched(to_dicts)
        )
        return {"query": body.sentence, "hits": await while_connected(request, ranked)}

    @app.get("/duplicates", responses=answers(400, 503))
    async def duplicates(
        request: Request,
        min_score: Annotated[float, QueryParam(gt=0, le=1)] = 0.9,
        limit: Annotated[int, QueryParam(ge=0, le=MAX_DUPLICATE_PAIRS)] = 100,
    ) -> dict[str, Any]:
        """Pairs of entries at cosine >= min_score (the best ``limit``, at most 1000) and their groups."""
        snapshot = await live.current()
        return await while_connected(request, scans.scan(snapshot, min_score, limit))

    @app.get("/info", responses=answers(503))
    async def info(request: Request) -> dict[str, Any]:
        engine = await live.engine()
        return {
            **await asyncio.to_thread(engine.retrying, Snapshot.info),
            **await naming(request),
            "reranking": engine.rerank,  # the reranker its searches rerank with (None: none)
            "reloads": live.reloads,
            "largest_batch": batcher.largest,
            "dropped": batcher.dropped,
        }

    @app.get("/fields", responses=answers(503))
    async def fields() -> dict[str, Any]:
        """Each stored field's type; its values with counts when it has few; min/max if numeric."""
        engine = await live.engine()
        return {"fields": await asyncio.to_thread(engine.retrying, Snapshot.facets)}

    add_page(app)

    @app.post("/reload", responses=answers(503))
    async def force_reload() -> dict[str, Any]:
        snapshot = await live.current(force=True)
        return {"version": snapshot.index.version.name, "reloads": live.reloads}

    install_openapi(app)
    loading.result()  # a bad index fails here, before the server binds
    return app
