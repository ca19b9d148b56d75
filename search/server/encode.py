"""The encode endpoints: ``POST /v1/embeddings`` (OpenAI's shape, for its clients and LangChain's
or LlamaIndex's OpenAI embedding classes) and ``POST /encode`` (bert-as-service's), over whatever
the server encodes with: an index's snapshot (its strategy and fitted post-processing, the vectors
its queries get) or, served with no index, an ``Encoding`` (``encode_only``). Their texts go
through the micro-batcher and the token budget like /search's; a large answer is serialised to
JSON on the lookup thread, never on the event loop (a few vectors' on it: ``INLINE_TOKENS``)."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic_core import to_json

from indexer.embedding.strategy import Strategy
from indexer.errors import BadInput
from search.read.encoding import Encoding, check_texts
from search.read.loading import load_encoding
from search.server.batching import few
from search.server.connections import while_connected
from search.server.names import check_model, model_name, naming
from search.server.routes import post
from search.server.schema import (
    EmbeddingsAnswer,
    EmbeddingsRequest,
    EncodeAnswer,
    EncodeRequest,
    OpenAIError,
    answered,
    answers,
)

INLINE_TOKENS = 512
"""Up to this many tokens (a few texts) a request's answer is written on the event loop once its
vectors are back: a few vectors' JSON costs less than the lookup thread's hop (15-20% of a
one-text request's CPU, docs/profile-serve.md); a larger answer is written on the lookup thread."""


def _json(answer: dict[str, Any]) -> Response:
    return Response(to_json(answer), media_type="application/json")


def _base64(vector: np.ndarray) -> str:
    """OpenAI's ``encoding_format: base64``: the little-endian float32 bytes."""
    return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")


def embeddings_answer(
    vectors: np.ndarray, model: str, tokens: int, encoding_format: str = "float"
) -> dict[str, Any]:
    """OpenAI's embeddings answer for ``vectors`` (row i: input i)."""
    as_text = _base64 if encoding_format == "base64" else (lambda vector: vector.tolist())
    data = [
        {"object": "embedding", "index": i, "embedding": as_text(vector)} for i, vector in enumerate(vectors)
    ]
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def shortened(vectors: np.ndarray, dimensions: int) -> np.ndarray:
    """OpenAI's ``dimensions``: each vector's first ``dimensions``, unit length again (a Matryoshka
    model's vectors cut as sentence-transformers' ``truncate_dim`` cuts them); more than the
    vectors have is refused."""
    if dimensions > vectors.shape[1]:
        width = vectors.shape[1]
        raise BadInput(f"dimensions: these vectors have {width}, not {dimensions}: ask for at most {width}")
    cut = vectors[:, :dimensions]
    return cut / np.maximum(np.linalg.norm(cut, axis=1, keepdims=True), 1e-12)


async def encoded(
    request: Request,
    texts: Sequence[str],
    answer: Callable[[Encoding, np.ndarray, int], dict[str, Any]],
    role: str,
) -> Response:
    """``answer(encoding, vectors, tokens the model read)`` of ``texts`` as ``role`` texts, its
    JSON written here when small (``INLINE_TOKENS``), else on the lookup thread with the rest of
    its batch. A few texts (``few``) are tokenised on the model thread with their batch."""
    texts = check_texts(texts)
    state = request.app.state
    encoding = await state.encoding()
    if few(encoding, texts):  # at most FEW_TOKENS <= INLINE_TOKENS: written here
        vectors, tokens = await while_connected(request, state.batcher.embed_few(encoding, texts, role))
        return _json(answer(encoding, vectors, tokens))
    ids = await state.batcher.tokenize(encoding, texts, role)
    tokens = sum(map(len, ids))

    def respond(vectors: np.ndarray) -> Response:
        return _json(answer(encoding, vectors, tokens))

    if tokens <= INLINE_TOKENS:  # a few vectors: their JSON costs less here than a hop
        return respond(await while_connected(request, state.batcher.run_tokens(encoding, ids, None)))
    return await while_connected(request, state.batcher.run_tokens(encoding, ids, respond))


async def embeddings(body: EmbeddingsRequest, request: Request) -> Response:
    """OpenAI-compatible embeddings of ``input`` (a string or a list of strings): ``data[i]
    .embedding`` for input i, floats or (``encoding_format: base64``) little-endian float32;
    ``input_type``: the texts are queries (default) or passages, each with its prefix; ``model``
    names the served model (or is left out), else a 404 ``model_not_found`` (``names``); ``dimensions``:
    each vector's first N, unit length again (``shortened``)."""
    state = request.app.state
    check_model(body.model, state.names.model, (await state.encoding()).strategy.model, "runs")

    def answer(encoding: Encoding, vectors: np.ndarray, tokens: int) -> dict[str, Any]:
        if body.dimensions is not None:
            vectors = shortened(vectors, body.dimensions)
        name = model_name(request, encoding.strategy.model)
        return embeddings_answer(vectors, name, tokens, body.encoding_format)

    return await encoded(request, body.input, answer, body.input_type)


async def encode(body: EncodeRequest, request: Request) -> Response:
    """bert-as-service's shape: ``{"texts": [...]}`` -> ``{"vectors": [[...], ...]}``, row i
    for text i; ``input_type``: queries (default) or passages, each with its prefix."""
    return await encoded(
        request, body.texts, lambda encoding, vectors, _: {"vectors": vectors.tolist()}, body.input_type
    )


def add_encode_routes(app: FastAPI, current: Callable[[], Awaitable[Encoding]]) -> None:
    """``/v1/embeddings`` and ``/encode`` on ``app``; ``current()`` gives the ``Encoding`` a request
    encodes with (an index snapshot's, or the one served alone): ``app.state.encoding``."""
    app.state.encoding = current
    openai = answered(EmbeddingsAnswer, 400, 404, 413, 503, shape=OpenAIError)
    post(app, "/v1/embeddings", embeddings, EmbeddingsRequest, responses=openai)
    post(app, "/encode", encode, EncodeRequest, responses=answered(EncodeAnswer, 400, 413, 503))


async def vectors_info(request: Request) -> dict[str, Any]:
    """The strategy the vectors follow, their dimension and the encoder that runs them."""
    state = request.app.state
    encoding = await state.encoding()
    batches = {"largest_batch": state.batcher.largest, "dropped": state.batcher.dropped}
    return {**encoding.info(), **await naming(request), **batches}


def encode_only(app: FastAPI, loading: Future[Encoding] | None) -> FastAPI:
    """``app`` serving vectors alone (``semsearch serve --model ...``, no index): the encode
    endpoints and ``/info`` (the strategy); the encoder loaded before it returns (``loading``,
    else the bundled model's default strategy)."""
    if loading is None:
        loading = load_encoding(Strategy())
    ready = loading

    async def current() -> Encoding:
        return ready.result()

    add_encode_routes(app, current)
    app.add_api_route("/info", vectors_info, methods=["GET"], responses=answers(503))
    loading.result()
    return app
