"""The ASGI app: its routes and error handlers, over a ``LiveEngine`` and one ``MicroBatcher``.
A new endpoint goes here (its request model in ``schema``)."""

from __future__ import annotations

import asyncio
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
from indexer.errors import IndexMoved, SemsearchError
from search.engine import RETRIES, SearchEngine, Snapshot, check_queries, configure_threads
from search.loading import load_engine
from search.server.batching import MicroBatcher, check_budget
from search.server.connections import BodyLimit, ClientGone, while_connected
from search.server.encode import add_encode_routes, encode_only
from search.server.errors import error_answer
from search.server.live import LiveEngine
from search.server.page import add_page
from search.server.scans import MAX_DUPLICATE_PAIRS, Scans
from search.server.schema import (
    MAX_BATCH,
    BatchRequest,
    SearchRequest,
    SimilarRequest,
    answers,
    install_openapi,
)
from search.similar import rank_vectors, rankable

if TYPE_CHECKING:
    from search.encoding import Encoding


def _field_error(error: dict[str, Any]) -> str:
    """One line for a validation error: ``<field>: <message>`` (``body`` for unreadable JSON)."""
    location = [str(part) for part in error.get("loc", ()) if part != "body"]
    where = "body" if error.get("type") == "json_invalid" or not location else ".".join(location)
    return f"{where}: {error.get('msg', 'invalid')}"


def create_app(
    index_dir: str | Path | None,
    *,
    max_batch: int = MAX_BATCH,
    reload_every: float = 1.0,
    loading: Future[SearchEngine] | None = None,
    encoding: Future[Encoding] | None = None,
) -> FastAPI:
    """Load the index and model now (so a bad index fails before the server binds), and set up the
    serving process (``configure_threads``). The engine loads in a thread while the routes are set
    up; ``loading``: an engine already loading (``semsearch serve`` starts it before importing
    anything heavy, to overlap those imports too: ``search.loading``). ``index_dir`` None: serve
    vectors alone, with the ``encoding`` loading (``search.loading.load_encoding``)."""
    configure_threads()
    if loading is None and index_dir is not None:
        loading = load_engine(index_dir)
    batcher = MicroBatcher(max_batch)
    app = FastAPIOffline(
        title="semsearch", description="Semantic search over a semsearch index.", version="0.1.0"
    )
    app.add_middleware(BodyLimit)

    @app.exception_handler(SemsearchError)
    async def user_error(request: Request, exc: SemsearchError) -> JSONResponse:
        return error_answer(request.url.path, exc.http_status, str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_answer(request.url.path, 400, "; ".join(_field_error(e) for e in exc.errors()[:3]))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        """Starlette's own answers (404, 405, a body FastAPI cannot parse) in the one shape."""
        return error_answer(request.url.path, exc.status_code, str(exc.detail), exc.headers)

    async def unreadable(request: Request, exc: Exception) -> JSONResponse:
        """The index's files failed under the server (removed, garbled): it cannot serve."""
        reason = " ".join(str(exc).split()) or type(exc).__name__
        return error_answer(request.url.path, 503, f"the index cannot be read: {reason}")

    app.add_exception_handler(DatabaseError, unreadable)
    app.add_exception_handler(OSError, unreadable)

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=499)  # nobody reads it: the connection is closed

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        return error_answer(request.url.path, 500, f"internal error: {type(exc).__name__}")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    app.add_api_route("/health", health, methods=["HEAD"], include_in_schema=False)
    if index_dir is None:
        install_openapi(app)
        return encode_only(app, batcher, encoding)
    live = LiveEngine(loading, index_dir, reload_every)
    scans = Scans()
    add_encode_routes(app, batcher, live.current)

    async def search(
        queries: list[str], k: int, where: str | None, min_score: float | None, group_by: str | None
    ) -> list[list[dict[str, Any]]]:
        check_queries(queries)

        async def once(snapshot: Snapshot) -> list[list[dict[str, Any]]]:
            check_budget(queries, snapshot.embedder.strategy.max_length)
            allowed = None if where is None else await asyncio.to_thread(snapshot.allowed, where)
            grouping = None if group_by is None else await asyncio.to_thread(snapshot.grouping, group_by)

            def look_up(vectors: np.ndarray) -> list[list[dict[str, Any]]]:
                hits = snapshot.lookup(snapshot.finish(vectors), k, allowed, min_score, grouping)
                return [[hit.to_dict() for hit in found] for found in hits]

            return await batcher.run(snapshot.embedder, queries, look_up)

        for _ in range(RETRIES):
            try:
                return await once(await live.current())
            except IndexMoved:  # an update committed under the snapshot: reload, ask again
                await live.current(force=True)
        return await once(await live.current())

    @app.post("/search", responses=answers(400, 413, 503))
    async def search_one(body: SearchRequest, request: Request) -> dict[str, Any]:
        """Top-k entries for one query, optionally filtered on stored fields first and grouped by
        one (the best entry per value)."""
        found = await while_connected(
            request, search([body.query], body.k, body.where, body.min_score, body.group_by)
        )
        return {"query": body.query, "hits": found[0]}

    @app.post("/search/batch", responses=answers(400, 413, 503))
    async def search_batch(body: BatchRequest, request: Request) -> dict[str, Any]:
        """Top-k entries for each of up to 64 queries, embedded in one pass."""
        results = await while_connected(
            request, search(body.queries, body.k, body.where, body.min_score, body.group_by)
        )
        return {"results": [{"query": q, "hits": h} for q, h in zip(body.queries, results, strict=True)]}

    async def similar(sentence: str, candidates: list[str], k: int | None) -> list[dict[str, Any]]:
        kept = rankable(sentence, candidates)
        texts = [sentence] + [text for _, text in kept]
        snapshot = await live.current()
        check_budget(texts, snapshot.embedder.strategy.max_length)

        def rank(vectors: np.ndarray) -> list[dict[str, Any]]:
            return [hit.to_dict() for hit in rank_vectors(snapshot.finish(vectors), kept, k)]

        return await batcher.run(snapshot.embedder, texts, rank)

    @app.post("/similar", responses=answers(400, 413, 503))
    async def similar_one(body: SimilarRequest, request: Request) -> dict[str, Any]:
        """Rank the candidates by similarity to the sentence, with the index's strategy and its
        fitted post-processing."""
        hits = await while_connected(request, similar(body.sentence, body.candidates, body.k))
        return {"query": body.sentence, "hits": hits}

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
    async def info() -> dict[str, Any]:
        snapshot = await live.current()
        return {
            **await asyncio.to_thread(snapshot.info),
            "reloads": live.reloads,
            "largest_batch": batcher.largest,
            "dropped": batcher.dropped,
        }

    @app.get("/fields", responses=answers(503))
    async def fields() -> dict[str, Any]:
        """Each stored field's type; its values with counts when it has few; min/max if numeric."""
        snapshot = await live.current()
        return {"fields": await asyncio.to_thread(snapshot.facets)}

    add_page(app)

    @app.post("/reload", responses=answers(503))
    async def force_reload() -> dict[str, Any]:
        snapshot = await live.current(force=True)
        return {"version": snapshot.index.version.name, "reloads": live.reloads}

    install_openapi(app)
    loading.result()  # a bad index fails here, before the server binds
    return app
