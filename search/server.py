"""The HTTP API (FastAPI + uvicorn, the ``serve`` extra): the engine over JSON, for applications.

The model loads once and one worker thread owns it: every text to embed (queries of /search and
/search/batch, sentences of /similar) goes through a micro-batcher that hands whatever is waiting
(up to ``max_batch`` texts) to that thread as one batch, embedded in passes of similar length, so
throughput grows with load instead of queries queueing one by one for the CPU. A batch's FAISS
and SQLite work runs on one lookup thread, never on the event loop.

``GET /`` is a search page for people (``search/static``: plain HTML/CSS/JS over this API, served
with a policy that lets it load nothing from elsewhere); ``GET /fields`` gives it the stored
fields' values and ranges to filter on.

A new index version written by ``add``/``delete``/``index`` is picked up between requests (checked
at most every ``reload_every`` seconds, or at once with ``POST /reload``). A request takes one
snapshot of the engine (index, embedder, transform) and uses it throughout, so it always works on
one complete version.

Bounds: a body is at most ``MAX_BODY`` bytes however it is sent (chunked too), and the texts of
one request may cost the model at most ``MAX_REQUEST_TOKENS`` tokens. When a client hangs up, its
request is cancelled and its texts, if still queued, are dropped without costing any model time.

Errors: every error answer is ``{"error": "<one line>"}``, Starlette's and uvicorn's own too (404,
405, HTTP h11 cannot read), and ``/openapi.json`` documents them as ``Error``. Input the server
cannot read or that breaks a limit (bad JSON, a missing or out-of-range field, text that is not
valid Unicode, a bad filter, too much text) is 400; a body over ``MAX_BODY`` is 413; a conflict with
the index is 409; an index that cannot serve is 503 (each error class's ``http_status``), as are
index files that fail under the running server (removed, garbled: OSError, sqlite3.DatabaseError).

Connections (``serve``, ``GuardedH11``): a whole request within ``REQUEST_TIMEOUT``, idle
keep-alive for ``KEEP_ALIVE``, at most ``MAX_CONNECTIONS`` open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import h11
import numpy as np
from fastapi import FastAPI, Request
from fastapi import Query as QueryParam
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from pydantic import AfterValidator, BaseModel, Field
from starlette.exceptions import HTTPException
from uvicorn.protocols.http.h11_impl import H11Protocol

from indexer.errors import BadInput, IndexDamaged, SemsearchError
from search.duplicates import find_duplicates
from search.engine import SearchEngine, Snapshot, check_queries, configure_threads
from search.filters import MAX_FILTER_LENGTH
from search.loading import load_engine
from search.queries import check_text
from search.similar import rank_vectors, rankable

if TYPE_CHECKING:  # queries are embedded without torch (indexer.encoders.onnx_encoder)
    from indexer.encoders.base import Encoder

MAX_BODY = 1 << 20  # bytes in a request body, counted as they arrive
MAX_QUERY = 2000  # characters in one query or sentence
MAX_K = 100
MAX_BATCH = 64  # queries in one /search/batch, and default texts per forward pass
MAX_CANDIDATES = 1000
MAX_DUPLICATE_PAIRS = 1000  # pairs one /duplicates response lists (the groups hold them all)
MAX_SCANS = 16  # /duplicates answers kept for the live version
# Model work one request may cause, in tokens: each text counts its characters (WordPiece makes at
# most one token of a character), capped at the strategy's max_length (where the model cuts it).
# As much as a full batch of 64 queries at 256 tokens: about 10 s of this 2-core machine under load
# with the default model, at the worst.
MAX_REQUEST_TOKENS = 64 * 256
# A request's texts reach the model in parts of at most this many tokens (counted the same way),
# each queued when the one before is done: other requests get their turn in between, and a request
# whose client hangs up stops after the part being embedded.
PART_TOKENS = 4096
# What one more forward pass costs, in characters of padding it saves (``length_groups``): a pass
# of the demo's query encoder costs about 1 ms besides its tokens, ~0.2 ms per token of ~4.5
# characters (docs/profile-serve.md).
CALL_COST = 24
# The search page (``search/static``, package data) loads nothing from elsewhere and runs no inline
# script: the browser enforces both, so a stored value that slips into markup still cannot run.
PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
STATIC = Path(__file__).parent / "static"
# Connections (``serve``): a client has REQUEST_TIMEOUT s from connecting or from its previous
# answer to send a whole request (a 1 MiB body at 100 kB/s fits), an idle keep-alive connection is
# closed after KEEP_ALIVE s, and past MAX_CONNECTIONS open at once a new one is refused (503).
REQUEST_TIMEOUT = 10.0
KEEP_ALIVE = 5.0
MAX_CONNECTIONS = 256

T = TypeVar("T")


def _unicode(text: str) -> str:
    """JSON can carry lone surrogates (``"\\ud800"``): refused at the boundary, field by field."""
    try:
        return check_text(text)
    except BadInput as exc:
        raise ValueError(str(exc)) from None


Text = Annotated[str, AfterValidator(_unicode)]
Query = Annotated[str, Field(min_length=1, max_length=MAX_QUERY), AfterValidator(_unicode)]
Where = Annotated[str, Field(max_length=MAX_FILTER_LENGTH), AfterValidator(_unicode)]


class Error(BaseModel):
    """Every error answer: one line saying what went wrong."""

    error: str


def _answers(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The error answers a route gives, for its OpenAPI entry (all of them ``Error``)."""
    return {code: {"model": Error, "description": ERRORS[code]} for code in codes}


ERRORS = {
    400: "Bad input: unreadable JSON or text, a missing or out-of-range field, a bad filter, too much text.",
    404: "No such route or file.",
    405: "The route does not take this method.",
    409: "A conflict with the index's state.",
    413: f"A request body over {MAX_BODY} bytes.",
    503: "The index cannot serve: damaged, removed or unreadable.",
}


class SearchRequest(BaseModel):
    query: Query
    k: int = Field(10, ge=1, le=MAX_K)
    where: Where | None = None
    min_score: float | None = Field(None, ge=-1, le=1)  # answered = cosine >= it, over the stored rule


class BatchRequest(BaseModel):
    queries: list[Query] = Field(min_length=1, max_length=MAX_BATCH)
    k: int = Field(10, ge=1, le=MAX_K)
    where: Where | None = None
    min_score: float | None = Field(None, ge=-1, le=1)


class SimilarRequest(BaseModel):
    sentence: Query
    candidates: list[Text] = Field(min_length=1, max_length=MAX_CANDIDATES)
    k: int | None = Field(None, ge=1, le=MAX_CANDIDATES)


def token_bound(text: str, max_length: int) -> int:
    """Most tokens ``text`` can cost the model: WordPiece makes at most one token of a character,
    and the model reads at most ``max_length``."""
    return min(len(text), max_length)


def check_budget(texts: Sequence[str], max_length: int) -> None:
    """Refuse a request whose texts may cost the model more than ``MAX_REQUEST_TOKENS``."""
    bound = sum(token_bound(t, max_length) for t in texts)
    if bound > MAX_REQUEST_TOKENS:
        raise BadInput(
            f"too much text for one request: up to {bound} tokens to embed, at most {MAX_REQUEST_TOKENS} "
            "(each text counts its characters, up to the model's max_length): split it"
        )


def split(texts: Sequence[str], max_length: int, budget: int = PART_TOKENS) -> list[list[str]]:
    """Consecutive parts of ``texts`` of at most ``budget`` tokens each (one text at least)."""
    parts: list[list[str]] = [[]]
    cost = 0
    for text in texts:
        tokens = token_bound(text, max_length)
        if parts[-1] and cost + tokens > budget:
            parts.append([])
            cost = 0
        parts[-1].append(text)
        cost += tokens
    return parts


class BodyLimit:
    """ASGI middleware: refuses a body over ``limit`` bytes with 413. The bytes are counted as they
    arrive (a chunked body has no content-length to trust) and the app gets the body whole, so no
    more than ``limit`` bytes of it are ever held."""

    def __init__(self, app: Any, limit: int = MAX_BODY):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await self.refuse(scope, send)
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return await self.refuse(scope, send)
            more = message.get("more_body", False)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: the disconnect, whenever it comes
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        return await self.app(scope, replay, send)

    async def refuse(self, scope: dict, send: Callable) -> None:
        answer = JSONResponse({"error": f"request body over {self.limit} bytes"}, status_code=413)
        await answer(scope, None, send)


class PageFiles(StaticFiles):
    """The page's files, each with the page's policy: opened directly (``/static/index.html``) the
    page is as confined as at ``/``."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers["Content-Security-Policy"] = PAGE_POLICY
        return response


def length_groups(lengths: Sequence[int], call_cost: int = CALL_COST, widest: int = 32) -> list[list[int]]:
    """Positions of texts in groups of similar length, one forward pass each. A pass costs about
    ``call_cost`` plus its texts times the longest one (shorter ones are padded): the groups that
    cost least in all, found by dynamic programming over the lengths sorted (groups of at most
    ``widest`` texts, the query encoder's own batch)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    ordered = [lengths[i] for i in order]
    best = [0.0] + [float("inf")] * len(order)
    cut = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        for start in range(max(0, end - widest), end):
            cost = best[start] + call_cost + (end - start) * ordered[end - 1]
            if cost < best[end]:
                best[end], cut[end] = cost, start
    groups, end = [], len(order)
    while end:
        groups.append(order[cut[end] : end])
        end = cut[end]
    return groups[::-1]


def embed_in_groups(embedder: Encoder, texts: Sequence[str]) -> np.ndarray:
    """``embedder.embed(texts)``, a forward pass per ``length_groups`` group (by characters, the
    proxy ``token_bound`` uses too): a batch of mixed lengths padded to its longest text costs
    the model as much as embedding each text alone."""
    groups = length_groups([len(text) for text in texts])
    parts = [embedder.embed([texts[i] for i in group]) for group in groups]
    vectors = np.empty((len(texts), parts[0].shape[1]), dtype=parts[0].dtype)
    for group, part in zip(groups, parts, strict=True):
        vectors[group] = part
    return vectors


@dataclass
class _Job:
    embedder: Encoder
    texts: list[str]
    future: asyncio.Future
    after: Callable[[np.ndarray], Any] | None = None  # run on the lookup thread with the vectors


def _outcomes(jobs: list[_Job], vectors: list[np.ndarray]) -> list[tuple[bool, Any]]:
    """Each job's ``after`` of its vectors (or the vectors), as (True, result) or (False, error);
    a job whose request is gone meanwhile is skipped."""
    outcomes: list[tuple[bool, Any]] = []
    for job, mine in zip(jobs, vectors, strict=True):
        try:
            skip = job.future.done() or job.after is None
            outcomes.append((True, mine if skip else job.after(mine)))
        except Exception as exc:  # the request's own failure (a bad min score, an unreadable index)
            outcomes.append((False, exc))
    return outcomes


class MicroBatcher:
    """Collects concurrent embedding requests and runs them as batches on the one model thread.

    A batch costs two hops off the event loop, whatever its size: the model thread embeds it
    (``embed_in_groups``), then the lookup thread runs each job's ``after`` (FAISS, SQLite) while
    the model thread takes the next batch, and hands all the answers back at once.

    Jobs whose requests are gone (cancelled) by the time their batch runs are dropped unembedded;
    a failed or cancelled job never stops the worker, and a worker task that ended is restarted.
    Jobs are grouped by embedder, so each request embeds with its own snapshot's model.
    """

    def __init__(self, max_batch: int):
        self.max_batch = max_batch
        self.model_thread = ThreadPoolExecutor(1, thread_name_prefix="semsearch-model")
        self.lookup_thread = ThreadPoolExecutor(1, thread_name_prefix="semsearch-lookup")
        self.queue: asyncio.Queue[_Job] | None = None
        self.task: asyncio.Task | None = None
        self.finishing: set[asyncio.Task] = set()
        self.largest = 0  # most texts embedded in one pass so far: shows batching at work
        self.dropped = 0  # jobs dropped because their request was gone

    async def embed(self, embedder: Encoder, texts: list[str]) -> np.ndarray:
        """Vectors of ``texts``, queued in parts of at most ``PART_TOKENS`` one after the other."""
        return await self.run(embedder, texts, None)

    async def run(
        self,
        embedder: Encoder,
        texts: list[str],
        after: Callable[[np.ndarray], T] | None,
    ) -> Any:
        """``after(vectors of texts)`` computed off the event loop (the vectors if ``after`` is None):
        with the rest of its batch on the lookup thread when the texts fit in one part, else once
        every part is embedded."""
        parts = split(texts, embedder.strategy.max_length)
        if len(parts) == 1:
            return await self._embed_part(embedder, parts[0], after)
        vectors = np.concatenate([await self._embed_part(embedder, part, None) for part in parts])
        return vectors if after is None else await asyncio.to_thread(after, vectors)

    async def _embed_part(
        self, embedder: Encoder, texts: list[str], after: Callable[[np.ndarray], Any] | None
    ) -> Any:
        loop = asyncio.get_running_loop()
        if self.task is None or self.task.get_loop() is not loop:
            self.queue = asyncio.Queue()
        if self.task is None or self.task.done() or self.task.get_loop() is not loop:
            self.task = loop.create_task(self._work())
        future = loop.create_future()
        self.queue.put_nowait(_Job(embedder, texts, future, after))
        return await future

    async def _work(self) -> None:
        """Greedy batching: while one batch is embedded, new requests queue up; the next batch takes
        all of them. No timer, so a lone request waits for nothing."""
        while True:
            jobs = [await self.queue.get()]
            size = len(jobs[0].texts)
            while size < self.max_batch and not self.queue.empty():
                jobs.append(self.queue.get_nowait())
                size += len(jobs[-1].texts)
            groups: dict[int, list[_Job]] = {}
            for job in jobs:
                groups.setdefault(id(job.embedder), []).append(job)
            for group in groups.values():
                await self._run(group)

    async def _run(self, jobs: list[_Job]) -> None:
        live = [job for job in jobs if not job.future.done()]
        self.dropped += len(jobs) - len(live)
        if not live:
            return
        texts = [t for job in live for t in job.texts]
        self.largest = max(self.largest, len(texts))
        loop = asyncio.get_running_loop()
        try:
            vectors = await loop.run_in_executor(self.model_thread, embed_in_groups, live[0].embedder, texts)
        except Exception as exc:  # hand the failure to every request still waiting
            for job in live:
                if not job.future.done():
                    job.future.set_exception(exc)
            return
        bounds = np.cumsum([0] + [len(job.texts) for job in live])
        mine = [vectors[start:end] for start, end in zip(bounds[:-1], bounds[1:], strict=True)]
        finishing = loop.create_task(self._finish(live, mine))  # the model takes the next batch
        self.finishing.add(finishing)
        finishing.add_done_callback(self.finishing.discard)

    async def _finish(self, jobs: list[_Job], vectors: list[np.ndarray]) -> None:
        loop = asyncio.get_running_loop()
        outcomes = await loop.run_in_executor(self.lookup_thread, _outcomes, jobs, vectors)
        for job, (ok, value) in zip(jobs, outcomes, strict=True):
            if job.future.done():  # its request may have gone while the batch ran
                continue
            if ok:
                job.future.set_result(value)
            else:
                job.future.set_exception(value)


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with the bounds it lacks: a connection past ``max_connections`` is
    answered 503 and closed before anything is read, and a client has ``request_timeout`` seconds
    from connecting (or from its previous answer) to send a whole request, head and body: past
    that the connection is closed, with a 408 if a request was begun. (uvicorn's keep-alive
    timeout starts only after a first answer and stops at the first byte of the next request, so
    an idle or slowloris connection was held forever.)"""

    request_timeout = REQUEST_TIMEOUT
    max_connections = MAX_CONNECTIONS

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.deadline: asyncio.TimerHandle | None = None
        self.refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.max_connections:
            self.refused = True
            transport.write(_raw_error(503, f"too many connections: at most {self.max_connections} at once"))
            transport.close()
            return
        super().connection_made(transport)
        self._rearm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.refused:
            return
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._disarm()
        self._follow()

    def send_400_response(self, msg: str) -> None:
        """HTTP that h11 cannot read: the one error shape too."""
        self.transport.write(_raw_error(400, msg))
        self.transport.close()

    def _follow(self) -> None:
        """The deadline runs while a request is being received (or awaited), not while answered."""
        if self.transport.is_closing() or self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
            self._disarm()
        elif self.deadline is None:
            self._rearm()

    def _rearm(self) -> None:
        self._disarm()
        self.deadline = self.loop.call_later(self.request_timeout, self._expire)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _expire(self) -> None:
        self.deadline = None
        if self.transport.is_closing():
            return
        begun = self.conn.their_state is h11.SEND_BODY or bool(self.conn.trailing_data[0])
        if begun and not (self.cycle is not None and self.cycle.response_started):
            self.transport.write(_raw_error(408, f"request not received within {self.request_timeout:g} s"))
        self.transport.close()


def _raw_error(status: int, message: str) -> bytes:
    """A whole HTTP/1.1 error answer in the one shape, for a connection about to be closed."""
    body = json.dumps({"error": message}).encode()
    reason = {400: "Bad Request", 408: "Request Timeout", 503: "Service Unavailable"}[status]
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


def listen(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound here so that a port in use (or a host that cannot be
    bound) is one line of BadInput, not uvicorn's log line and exit 3 (a strategy conflict's)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say so (else each answer
    # waits ~40 ms for a delayed ACK)
    listening = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind((host, port))
    except OSError as exc:
        listening.close()
        raise BadInput(
            f"cannot listen on {host}:{port}: {exc.strerror or exc} (another server there? choose --port)"
        ) from None
    return listening


def serve(
    app: FastAPI,
    listening: socket.socket,
    *,
    request_timeout: float = REQUEST_TIMEOUT,
    keep_alive: float = KEEP_ALIVE,
    max_connections: int = MAX_CONNECTIONS,
) -> None:
    """Run ``app`` on the ``listen`` socket until interrupted, with the connection bounds of
    GuardedH11 and uvicorn's keep-alive timeout."""
    import uvicorn

    bounds = {"request_timeout": request_timeout, "max_connections": max_connections}
    config = uvicorn.Config(
        app,
        http=type("Guarded", (GuardedH11,), bounds),
        timeout_keep_alive=keep_alive,
        log_level="warning",
    )
    uvicorn.Server(config).run(sockets=[listening])


class ClientGone(Exception):
    """The client hung up before its answer was ready."""


async def _disconnected(receive: Callable[[], Awaitable[dict]]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def while_connected(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result, or ClientGone as soon as the client disconnects: the work is then
    cancelled, which drops its texts from the batcher's queue."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
    if not task.done() or task.cancelled():  # cancelled, not yet unwound: it ends on its own
        raise ClientGone
    return task.result()


async def _finish(work: asyncio.Future) -> None:
    """Wait until ``work`` has ended, however often the waiter is cancelled meanwhile (a thread
    cannot be cancelled: whoever holds a lock for it must hold it that long); its outcome is
    dropped."""
    while not work.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({work})
    if not work.cancelled():
        work.exception()


def _field_error(error: dict[str, Any]) -> str:
    """One line for a validation error: ``<field>: <message>`` (``body`` for unreadable JSON)."""
    location = [str(part) for part in error.get("loc", ()) if part != "body"]
    where = "body" if error.get("type") == "json_invalid" or not location else ".".join(location)
    return f"{where}: {error.get('msg', 'invalid')}"


def create_app(
    index_dir: str | Path,
    *,
    max_batch: int = MAX_BATCH,
    reload_every: float = 1.0,
    loading: Future[SearchEngine] | None = None,
) -> FastAPI:
    """Load the index and model now (so a bad index fails before the server binds), and set up the
    serving process (``configure_threads``). The engine loads in a thread while the routes are set
    up; ``loading``: an engine already loading (``semsearch serve`` starts it before importing
    anything heavy, to overlap those imports too: ``search.loading``)."""
    configure_threads()
    if loading is None:
        loading = load_engine(index_dir)
    batcher = MicroBatcher(max_batch)
    state = {"checked": time.monotonic(), "reloads": 0}
    reloading = asyncio.Lock()
    app = FastAPIOffline(
        title="semsearch", description="Semantic search over a semsearch index.", version="0.1.0"
    )
    app.add_middleware(BodyLimit)

    @app.exception_handler(SemsearchError)
    async def user_error(request: Request, exc: SemsearchError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=exc.http_status)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": "; ".join(_field_error(e) for e in exc.errors()[:3])}, status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        """Starlette's own answers (404, 405, a body FastAPI cannot parse) in the one shape."""
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    async def unreadable(request: Request, exc: Exception) -> JSONResponse:
        """The index's files failed under the server (removed, garbled): it cannot serve."""
        reason = " ".join(str(exc).split()) or type(exc).__name__
        return JSONResponse({"error": f"the index cannot be read: {reason}"}, status_code=503)

    app.add_exception_handler(sqlite3.DatabaseError, unreadable)
    app.add_exception_handler(OSError, unreadable)

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=499)  # nobody reads it: the connection is closed

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"error": f"internal error: {type(exc).__name__}"}, status_code=500)

    async def current(force: bool = False) -> Snapshot:
        """The snapshot a request works on, after picking up a new version if one is due."""
        now = time.monotonic()
        if force or now - state["checked"] >= reload_every:
            state["checked"] = now
            async with reloading:
                try:
                    reloaded = await asyncio.to_thread(engine.reload_if_changed)
                except (SemsearchError, OSError, sqlite3.DatabaseError) as exc:
                    raise IndexDamaged(f"the index at {index_dir} cannot be read: {exc}") from None
                state["reloads"] += reloaded
        return engine.snapshot

    async def search(
        queries: list[str], k: int, where: str | None, min_score: float | None = None
    ) -> list[list[dict[str, Any]]]:
        check_queries(queries)
        snapshot = await current()
        check_budget(queries, snapshot.embedder.strategy.max_length)
        allowed = None if where is None else await asyncio.to_thread(snapshot.allowed, where)

        def look_up(vectors: np.ndarray) -> list[list[dict[str, Any]]]:
            hits = snapshot.lookup(snapshot.finish(vectors), k, allowed, min_score)
            return [[hit.to_dict() for hit in found] for found in hits]

        return await batcher.run(snapshot.embedder, queries, look_up)

    @app.post("/search", responses=_answers(400, 413, 503))
    async def search_one(body: SearchRequest, request: Request) -> dict[str, Any]:
        """Top-k entries for one query, optionally filtered on stored fields first."""
        found = await while_connected(request, search([body.query], body.k, body.where, body.min_score))
        return {"query": body.query, "hits": found[0]}

    @app.post("/search/batch", responses=_answers(400, 413, 503))
    async def search_batch(body: BatchRequest, request: Request) -> dict[str, Any]:
        """Top-k entries for each of up to 64 queries, embedded in one pass."""
        results = await while_connected(request, search(body.queries, body.k, body.where, body.min_score))
        return {"results": [{"query": q, "hits": h} for q, h in zip(body.queries, results, strict=True)]}

    async def similar(sentence: str, candidates: list[str], k: int | None) -> list[dict[str, Any]]:
        kept = rankable(sentence, candidates)
        texts = [sentence] + [text for _, text in kept]
        snapshot = await current()
        check_budget(texts, snapshot.embedder.strategy.max_length)

        def rank(vectors: np.ndarray) -> list[dict[str, Any]]:
            return [hit.to_dict() for hit in rank_vectors(snapshot.finish(vectors), kept, k)]

        return await batcher.run(snapshot.embedder, texts, rank)

    @app.post("/similar", responses=_answers(400, 413, 503))
    async def similar_one(body: SimilarRequest, request: Request) -> dict[str, Any]:
        """Rank the candidates by similarity to the sentence, with the index's strategy and its
        fitted post-processing."""
        hits = await while_connected(request, similar(body.sentence, body.candidates, body.k))
        return {"query": body.sentence, "hits": hits}

    scanning = asyncio.Lock()
    scans: dict[tuple[str, float, int], dict[str, Any]] = {}

    async def scan(snapshot: Snapshot, min_score: float, limit: int) -> dict[str, Any]:
        """One duplicates scan at a time, and one per version and question: a scan can take
        seconds on a large index, so a repeated or concurrent request gets the stored answer.
        "At a time" counts threads, not requests: a request whose client hung up tells its scan
        to stop (at its next step) and holds the lock until the thread has ended."""
        index = snapshot.index  # an update commits a new generation into the same version
        key = (f"{index.version.name}/{index.manifest.generation}", min_score, limit)
        async with scanning:
            if key not in scans:
                gone = threading.Event()
                work = asyncio.ensure_future(
                    asyncio.to_thread(
                        find_duplicates, index, min_score, limit, snapshot.db_lock, stop=gone.is_set
                    )
                )
                try:
                    found = await asyncio.shield(work)
                except asyncio.CancelledError:
                    gone.set()
                    await _finish(work)
                    raise
                if len(scans) >= MAX_SCANS or any(version != key[0] for version, *_ in scans):
                    scans.clear()  # answers of an older version, or more kept than worth it
                scans[key] = found.to_dict()
            return scans[key]

    @app.get("/duplicates", responses=_answers(400, 503))
    async def duplicates(
        request: Request,
        min_score: Annotated[float, QueryParam(gt=0, le=1)] = 0.9,
        limit: Annotated[int, QueryParam(ge=0, le=MAX_DUPLICATE_PAIRS)] = 100,
    ) -> dict[str, Any]:
        """Pairs of entries at cosine >= min_score (the best ``limit``, at most 1000) and their groups."""
        snapshot = await current()
        return await while_connected(request, scan(snapshot, min_score, limit))

    @app.get("/info", responses=_answers(503))
    async def info() -> dict[str, Any]:
        snapshot = await current()
        return {
            **await asyncio.to_thread(snapshot.info),
            "reloads": state["reloads"],
            "largest_batch": batcher.largest,
            "dropped": batcher.dropped,
        }

    @app.get("/fields", responses=_answers(503))
    async def fields() -> dict[str, Any]:
        """Each stored field's type; its values with counts when it has few; min/max if numeric."""
        snapshot = await current()
        return {"fields": await asyncio.to_thread(snapshot.facets)}

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def page() -> FileResponse:
        """The search page: a person's way to try the index in a browser."""
        return FileResponse(STATIC / "index.html", headers={"Content-Security-Policy": PAGE_POLICY})

    app.mount("/static", PageFiles(packages=[("search", "static")]), name="static")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    app.add_api_route("/health", health, methods=["HEAD"], include_in_schema=False)

    @app.post("/reload", responses=_answers(503))
    async def force_reload() -> dict[str, Any]:
        snapshot = await current(force=True)
        return {"version": snapshot.index.version.name, "reloads": state["reloads"]}

    def openapi() -> dict[str, Any]:
        """FastAPI's schema, less the 422 it documents for every route with input: this server
        answers bad input with 400 ``Error`` (``invalid_request``)."""
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            for operations in schema["paths"].values():
                for operation in operations.values():
                    operation["responses"].pop("422", None)
            for unused in ("HTTPValidationError", "ValidationError"):
                schema["components"]["schemas"].pop(unused, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    engine = loading.result()
    return app
