"""The server's route table (as text-embeddings-inference's ``server.rs``): each JSON ``POST``
route is a top-level handler ``handler(body, request)`` of its request model, answered straight
from the table, and everything else (GET routes, the page, ``/docs``, the OpenAPI schema, 404 and
405) by FastAPI, where the table's routes are registered too so that the schema documents them.

Why a table in front of FastAPI: a one-text ``/v1/embeddings`` request spent most of the server's
CPU in FastAPI's layers around the handler (route matching over every route, dependency solving,
four middlewares, telemetry checks), not in its own work (docs/profile-serve.md). A table route
reads its body within ``MAX_BODY``, parses and validates it in one pass of pydantic-core
(``model_validate_json``), runs the handler and writes its answer (``pydantic_core.to_json``);
every failure is answered by ``ERROR_HANDLERS`` in the route's error shape, as FastAPI's are."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi_offline import FastAPIOffline
from pydantic import BaseModel, ValidationError
from pydantic_core import to_json
from starlette.exceptions import HTTPException

from indexer.catalog import DatabaseError
from indexer.errors import SemsearchError
from search.server.connections import MAX_BODY, BodyTooLarge, ClientGone, read_body
from search.server.errors import error_answer

Handler = Callable[[Any, Request], Awaitable[Any]]


def field_error(error: dict[str, Any]) -> str:
    """One line for a validation error: ``<field>: <message>`` (``body`` for unreadable JSON)."""
    location = [str(part) for part in error.get("loc", ()) if part != "body"]
    where = "body" if error.get("type") == "json_invalid" or not location else ".".join(location)
    return f"{where}: {error.get('msg', 'invalid')}"


def invalid(path: str, errors: list[Any]) -> JSONResponse:
    """The 400 of a body that is not the route's request: its first three faults, one line."""
    return error_answer(path, 400, "; ".join(field_error(e) for e in errors[:3]))


async def user_error(request: Request, exc: SemsearchError) -> JSONResponse:
    """The user's error: its status, its one line (and its OpenAI ``code``, where it has one)."""
    return error_answer(request.url.path, exc.http_status, str(exc), code=getattr(exc, "code", None))


async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    return invalid(request.url.path, list(exc.errors()))


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


ERROR_HANDLERS: dict[type[Exception], Callable[..., Awaitable[Response]]] = {
    SemsearchError: user_error,
    RequestValidationError: invalid_request,
    HTTPException: http_error,
    DatabaseError: unreadable,
    OSError: unreadable,
    ClientGone: client_gone,
    Exception: internal_error,
}
"""Every failure answered in its route's error shape (``search.server.errors``), never a trace."""


def failure(request: Request, exc: Exception) -> Awaitable[Response]:
    """The answer ``ERROR_HANDLERS`` gives ``exc`` (its nearest class's handler)."""
    kind = next(kind for kind in type(exc).__mro__ if kind in ERROR_HANDLERS)
    return ERROR_HANDLERS[kind](request, exc)


def json_answer(answer: Any) -> Response:
    """A handler's answer as sent: a ready ``Response`` as it is, else its JSON."""
    if isinstance(answer, Response):
        return answer
    return Response(to_json(answer), media_type="application/json")


@dataclass(frozen=True)
class Route:
    """One row of the table: the request model a body must be, and its handler."""

    model: type[BaseModel]
    handler: Handler

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        request = Request(scope, receive)  # the body read here: receive gives the disconnect
        try:
            body = await read_body(scope, receive, MAX_BODY)
            if body is None:
                return  # the client left before its body was whole
            try:
                parsed = self.model.model_validate_json(body)
            except ValidationError as exc:
                answer: Response = invalid(scope["path"], exc.errors(include_url=False))
            else:
                answer = json_answer(await self.handler(parsed, request))
        except BodyTooLarge as exc:
            answer = error_answer(scope["path"], 413, str(exc))
        except Exception as exc:  # every failure in the route's shape, as FastAPI's handlers answer
            answer = await failure(request, exc)
        await answer(scope, receive, send)


TELEMETRY_OFF = {"tracing": False, "metrics": False, "logs": False}
"""FastAPI's OpenTelemetry hooks, off: they looked up providers on every request, and this server
has none to report to."""


class RouteTable:
    """ASGI middleware in front of FastAPI's whole middleware stack (server errors, body limit,
    exception telemetry: about a tenth of a one-text request's CPU on the event loop,
    docs/profile-serve.md), whose work a ``Route`` does itself: a ``POST`` to a path of ``table``
    is answered by its ``Route``, anything else passes on to FastAPI's stack."""

    def __init__(self, app: Any, table: dict[str, Route]):
        self.app, self.table = app, table

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        route = self.table.get(scope["path"]) if scope["type"] == "http" else None
        if route is None or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        await route(scope, receive, send)


def new_app(**settings: Any) -> FastAPI:
    """The app (FastAPI with offline docs, ``settings`` its title and the like) with the error
    handlers of ``ERROR_HANDLERS`` and an empty route table (``post`` fills it)."""
    app = FastAPIOffline(telemetry=TELEMETRY_OFF, **settings)
    app.state.table = table = {}
    for kind, handler in ERROR_HANDLERS.items():
        app.add_exception_handler(kind, handler)
    stack = app.build_middleware_stack  # built on the first request, after every route is added
    app.build_middleware_stack = lambda: RouteTable(stack(), table)  # type: ignore[method-assign]
    return app


def post(app: FastAPI, path: str, handler: Handler, model: type[BaseModel], **documented: Any) -> None:
    """``handler`` answers ``POST path`` with bodies of ``model`` from the route table; FastAPI
    documents it (``documented``: ``add_api_route``'s ``responses`` and the like)."""
    app.state.table[path] = Route(model, handler)

    async def endpoint(body: BaseModel, request: Request) -> Any:
        return await handler(body, request)  # what FastAPI would run: the table answers first

    endpoint.__doc__, endpoint.__name__ = handler.__doc__, handler.__name__
    endpoint.__annotations__ = {"body": model, "request": Request, "return": Any}
    app.add_api_route(path, endpoint, methods=["POST"], **documented)
