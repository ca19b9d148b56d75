"""The one error answer, built here for every handler: ``{"error": "<one line>"}``, and on
``/v1/embeddings`` OpenAI's own ``{"error": {"message", "type", "param", "code"}}``, the shape
OpenAI's clients read the reason from (they show only the status code for any other)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi.responses import JSONResponse

OPENAI_PATHS = frozenset({"/v1/embeddings", "/v1/models"})  # routes whose clients are OpenAI's


def error_body(path: str, status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """The error answer for a request to ``path``: the one-line ``message`` in its clients' shape
    (OpenAI's names the error's ``code``, e.g. ``model_not_found``)."""
    if path not in OPENAI_PATHS:
        return {"error": message}
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def error_answer(
    path: str,
    status: int,
    message: str,
    headers: Mapping[str, str] | None = None,
    code: str | None = None,
) -> JSONResponse:
    """``error_body`` as a JSON response with ``status``."""
    return JSONResponse(error_body(path, status, message, code), status_code=status, headers=headers)
