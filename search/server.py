"""The HTTP API (FastAPI + uvicorn, the ``serve`` extra): the engine over JSON, for applications.

The model loads once. Queries that arrive together are embedded together: a single worker takes
every query waiting (up to ``max_batch``) and embeds them in
one forward pass, so throughput grows with load instead of queries queueing one by one for the
CPU. A new index version written by ``add``/``delete``/``index`` is picked up between requests
(checked at most every ``reload_every`` seconds, or at once with ``POST /reload``); a request
always works on one complete version.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from indexer.errors import BadInput, IndexDamaged, IndexLocked, SemsearchError, StrategyConflict
from indexer.store import live_version
from indexer.transform import Transform
from search.engine import SearchEngine, check_queries
from search.similar import rank_similar

MAX_BODY = 1 << 20
MAX_QUERY = 2000
MAX_K = 100
MAX_BATCH = 64


def http_status(error: SemsearchError) -> int:
    """409 for a conflict with the index's state, 503 for an index that cannot serve, else 400."""
    if isinstance(error, (StrategyConflict, IndexLocked)):
        return 409
    if isinstance(error, IndexDamaged):
        return 503
    return 400


class SearchRequest(BaseModel):
    query: str = Field(min_length=1, max_length=MAX_QUERY)
    k: int = Field(10, ge=1, le=MAX_K)
    where: str | None = Field(None, max_length=1000)


class BatchRequest(BaseModel):
    queries: list[str] = Field(min_length=1, max_length=MAX_BATCH)
    k: int = Field(10, ge=1, le=MAX_K)
    where: str | None = Field(None, max_length=1000)


class SimilarRequest(BaseModel):
    sentence: str = Field(min_length=1, max_length=MAX_QUERY)
    candidates: list[str] = Field(min_length=1, max_length=1000)
    k: int | None = Field(None, ge=1, le=1000)


class MicroBatcher:
    """Collects concurrent embedding requests and runs them as one batch in a worker thread."""

    def __init__(self, engine: SearchEngine, max_batch: int):
        self.engine = engine
        self.max_batch = max_batch
        self.queue: asyncio.Queue[tuple[list[str], asyncio.Future]] = asyncio.Queue()
        self.task: asyncio.Task | None = None
        self.largest = 0  # most queries embedded in one pass so far: shows batching at work

    async def embed(self, texts: list[str]) -> np.ndarray:
        if self.task is None:
            self.task = asyncio.create_task(self._work())
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        await self.queue.put((texts, future))
        return await future

    async def _work(self) -> None:
        """Greedy batching: while one batch is embedded, new requests queue up; the next batch takes
        all of them. No timer, so a lone request waits for nothing."""
        while True:
            waiting = [await self.queue.get()]
            size = len(waiting[0][0])
            while size < self.max_batch and not self.queue.empty():
                waiting.append(self.queue.get_nowait())
                size += len(waiting[-1][0])
            texts = [t for item, _ in waiting for t in item]
            self.largest = max(self.largest, len(texts))
            try:
                vectors = await asyncio.to_thread(self.engine.embedder.embed, texts)
            except Exception as exc:  # hand the failure to every waiting request
                for _, future in waiting:
                    future.set_exception(exc)
                continue
            start = 0
            for item, future in waiting:
                future.set_result(vectors[start : start + len(item)])
                start += len(item)


def create_app(index_dir: str | Path, *, max_batch: int = MAX_BATCH, reload_every: float = 1.0) -> FastAPI:
    """Load the index and model now (so a bad index fails before the server binds)."""
    engine = SearchEngine(index_dir)
    batcher = MicroBatcher(engine, max_batch)
    state = {"checked": time.monotonic(), "reloads": 0}
    app = FastAPI(title="semsearch", description="Semantic search over a semsearch index.", version="0.1.0")

    @app.middleware("http")
    async def bounded_body(request: Request, call_next: Any) -> Any:
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY):
            return JSONResponse({"error": f"request body over {MAX_BODY} bytes"}, status_code=413)
        return await call_next(request)

    @app.exception_handler(SemsearchError)
    async def user_error(request: Request, exc: SemsearchError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=http_status(exc))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"error": f"internal error: {type(exc).__name__}"}, status_code=500)

    async def reload(force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - state["checked"] < reload_every:
            return
        state["checked"] = now
        if live_version(engine.path) != engine.index.version.name and await asyncio.to_thread(
            engine.reload_if_changed
        ):
            state["reloads"] += 1

    async def search(queries: list[str], k: int, where: str | None) -> list[list[dict[str, Any]]]:
        await reload()
        check_queries(queries)
        index = engine.index
        allowed = engine.allowed(where, index)
        vectors = await batcher.embed(queries)
        vectors = Transform.apply_optional(index.transform, vectors)
        return [[hit.to_dict() for hit in hits] for hits in engine.lookup(vectors, k, allowed, index)]

    @app.post("/search")
    async def search_one(body: SearchRequest) -> dict[str, Any]:
        """Top-k entries for one query, optionally filtered on stored fields first."""
        return {"query": body.query, "hits": (await search([body.query], body.k, body.where))[0]}

    @app.post("/search/batch")
    async def search_batch(body: BatchRequest) -> dict[str, Any]:
        """Top-k entries for each of up to 64 queries, embedded in one pass."""
        if any(len(q) > MAX_QUERY for q in body.queries):
            raise BadInput(f"a query is longer than {MAX_QUERY} characters")
        results = await search(body.queries, body.k, body.where)
        return {"results": [{"query": q, "hits": h} for q, h in zip(body.queries, results, strict=True)]}

    @app.post("/similar")
    async def similar(body: SimilarRequest) -> dict[str, Any]:
        """Rank the candidates by similarity to the sentence, with the index's strategy."""
        hits = await asyncio.to_thread(
            rank_similar, body.sentence, body.candidates, k=body.k, embedder=engine.embedder
        )
        return {"query": body.sentence, "hits": [h.to_dict() for h in hits]}

    @app.get("/info")
    async def info() -> dict[str, Any]:
        await reload()
        index = engine.index
        return {
            "strategy": index.strategy.to_dict(),
            "entries": index.meta["count"],
            "vectors": index.meta["vectors"],
            "dimension": index.meta["dimension"],
            "version": index.version.name,
            "reloads": state["reloads"],
            "largest_batch": batcher.largest,
        }

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/reload")
    async def force_reload() -> dict[str, Any]:
        await reload(force=True)
        return {"version": engine.index.version.name, "reloads": state["reloads"]}

    return app
