"""The rerank endpoints: ``POST /v1/rerank`` (the shape Cohere's v1 API, Jina and Infinity use),
``POST /v2/rerank`` (Cohere's v2 API, ``cohere.ClientV2``) and ``POST /rerank``
(text-embeddings-inference's), over the server's reranker (``serve --rerank``, or the index's
default). Each is a top-level handler, routed in ``search.server.app``; it finds the reranker and
the micro-batcher on ``app.state`` (``served``). The pairs are tokenised as they arrive, held to
the request budget in the tokens the reranker reads, and scored on the model thread in the batches
its token budget allows, shared with other requests (``search.server.batching.MicroBatcher.score``)."""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from fastapi import Request
from fastapi.responses import Response

from indexer.errors import SemsearchError
from search.read.encoding import check_texts
from search.read.requests import check_queries
from search.server.batching import Batched, MicroBatcher, Pairs
from search.server.connections import while_connected
from search.server.names import check_model, reranker_name
from search.server.schema import RerankRequest, RerankV2Request, TeiRerankRequest

if TYPE_CHECKING:
    from indexer.encoders.rerankers import Reranker

NO_RERANKER = "this server has no reranker: start it with serve --rerank MODEL (a cross-encoder's folder)"


class NoReranker(SemsearchError):
    """A rerank asked of a server that has no reranker: no such model here."""

    http_status = 404


class Served:
    """What the rerank handlers work with (``app.state.reranking``): the micro-batcher, and the
    reranker a request uses (``current()``: None where the server has none), each run through one
    ``Pairs`` so that concurrent requests share batches."""

    def __init__(self, batcher: MicroBatcher, current: Callable[[], Awaitable[Reranker | None]]):
        self.batcher, self.current = batcher, current
        self.pairs: dict[int, Pairs] = {}

    async def reranker(self) -> Pairs:
        """The reranker of this request, as the batcher runs it; ``NoReranker`` where there is none."""
        reranker = await self.current()
        if reranker is None:
            raise NoReranker(NO_RERANKER)
        return self.pairs.setdefault(id(reranker), Pairs(reranker))

    async def batched(self) -> Batched | None:
        """The reranker a search reranks with through the micro-batcher (``Batched``), or None."""
        reranker = await self.current()
        if reranker is None:
            return None
        pairs = self.pairs.setdefault(id(reranker), Pairs(reranker))
        return Batched(pairs, self.batcher, asyncio.get_running_loop())

    async def scores(
        self, request: Request, question: str, texts: Sequence[str]
    ) -> tuple[Pairs, np.ndarray, int]:
        """The reranker, its score of each of ``texts`` for ``question`` and the tokens it read;
        a blank question or text is refused as a search's or an embedding's is."""
        check_queries([question])
        check_texts(texts)
        pairs = await self.reranker()
        scores, tokens = await while_connected(request, self.batcher.score(pairs, question, texts))
        return pairs, scores, tokens


def served(request: Request) -> Served:
    return request.app.state.reranking


def _json(answer: Any) -> Response:
    return Response(json.dumps(answer, ensure_ascii=False).encode("utf-8"), media_type="application/json")


def _best_first(scores: np.ndarray, top: int | None = None) -> list[int]:
    """Positions of ``scores``, best first, equal scores in the request's order, the first ``top``."""
    return np.argsort(-scores, kind="stable")[:top].tolist()


async def _ranked(
    request: Request, model: str | None, query: str, texts: Sequence[str], top: int | None
) -> tuple[list[tuple[int, float]], str, int]:
    """The first ``top`` of ``texts`` best first, as (position, the reranker's score), the name
    of the reranker that scored them and the tokens it read; a ``model`` not served is a 404."""
    reranker = (await served(request).reranker()).reranker
    check_model(model, request.app.state.names.reranker, reranker.folder.path, "reranks with")
    pairs, scores, tokens = await served(request).scores(request, query, texts)
    ranked = [(i, float(scores[i])) for i in _best_first(scores, top)]
    return ranked, reranker_name(request, pairs.reranker.folder.path), tokens


async def cohere_rerank(body: RerankRequest, request: Request) -> Response:
    """Rerank ``documents`` (strings or ``{"text": ...}``) for ``query``, Cohere's v1, Jina's and
    Infinity's shape: ``{"results": [{"index", "relevance_score", "document"?}], "model", "usage"}``,
    best first, the first ``top_n``; ``relevance_score`` is the reranker's score (as
    CrossEncoder.predict gives it), ``document`` (``return_documents``) ``{"text": ...}``."""
    texts = body.documents
    ranked, name, tokens = await _ranked(request, body.model, body.query, texts, body.top_n)
    results = [
        {
            "index": i,
            "relevance_score": score,
            **({"document": {"text": texts[i]}} if body.return_documents else {}),
        }
        for i, score in ranked
    ]
    return _json({"results": results, "model": name, "usage": {"total_tokens": tokens}})


async def cohere_v2_rerank(body: RerankV2Request, request: Request) -> Response:
    """Rerank ``documents`` (strings) for ``query``, Cohere v2's shape (``cohere.ClientV2``):
    ``{"id", "results": [{"index", "relevance_score"}], "meta"}``, best first, the first ``top_n``;
    the scores /v1/rerank gives, each document cut to its first ``max_tokens_per_doc`` tokens
    first, as Cohere cuts them; ``meta`` the tokens read and Cohere's search units (one a 100
    documents)."""
    texts: Sequence[str] = body.documents
    if body.max_tokens_per_doc is not None:
        reranker = (await served(request).reranker()).reranker
        texts = await asyncio.to_thread(reranker.first_tokens, texts, body.max_tokens_per_doc)
    ranked, _, tokens = await _ranked(request, body.model, body.query, texts, body.top_n)
    meta = {
        "api_version": {"version": "2"},
        "billed_units": {"search_units": math.ceil(len(body.documents) / 100)},
        "tokens": {"input_tokens": tokens, "output_tokens": 0},
    }
    results = [{"index": i, "relevance_score": score} for i, score in ranked]
    return _json({"id": str(uuid.uuid4()), "results": results, "meta": meta})


EDGE = 2.0**-24
"""The float32 step below 1: a sigmoid's or tanh's score is held this far inside its bounds before
its logit is recovered (so a saturated score gives a finite logit, about 16.6 at most)."""


def tei_scores(scores: np.ndarray, activation: str, raw: bool) -> np.ndarray:
    """text-embeddings-inference's scores from the reranker's (after its folder's ``activation``):
    the logit (``raw``) or its sigmoid. A sigmoid's or tanh's logit is recovered from the float32
    score (exact to float32 while the score is not saturated)."""
    values = scores.astype(np.float64)
    if activation == "sigmoid":
        if not raw:
            return values
        held = np.clip(values, EDGE, 1 - EDGE)
        return np.log(held) - np.log1p(-held)
    logits = np.arctanh(np.clip(values, EDGE - 1, 1 - EDGE)) if activation == "tanh" else values
    return logits if raw else 1.0 / (1.0 + np.exp(-logits))


async def tei_rerank(body: TeiRerankRequest, request: Request) -> Response:
    """Rerank ``texts`` for ``query``, text-embeddings-inference's shape: ``[{"index", "score",
    "text"?}]``, best first; ``score`` the sigmoid of the reranker's logit (``raw_scores``: the
    logit), ``text`` with ``return_text``."""
    pairs, scores, _ = await served(request).scores(request, body.query, body.texts)
    shown = tei_scores(scores, pairs.reranker.folder.activation, body.raw_scores)
    ranks = [
        {"index": i, "score": float(shown[i]), **({"text": body.texts[i]} if body.return_text else {})}
        for i in _best_first(scores)
    ]
    return _json(ranks)
