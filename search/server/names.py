"""The names a server's models go by (``serve --served-model-name``, ``--served-reranker-name``, as
vLLM's and text-embeddings-inference's): the ``model`` its answers give, the one a request may
name (another is a 404 ``model_not_found``, OpenAI's answer), and ``GET /v1/models`` listing them.
The handlers find them on ``app.state.names``; the encoding and reranker they name on
``app.state.encoding`` and ``app.state.reranking`` (``search.server.encode``, ``.rerank``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fastapi import Request
from pydantic import BaseModel

from indexer.embedding.strategy import DEFAULT_MODEL
from indexer.errors import SemsearchError


@dataclass(frozen=True)
class ServedNames:
    """The names clients use for the embedding model and the reranker; None: as stored (the
    embedding model as its strategy names it, the reranker by its folder's name)."""

    model: str | None = None
    reranker: str | None = None


class ModelNotServed(SemsearchError):
    """A request naming a model this server does not run: OpenAI's 404 and its code."""

    http_status = 404
    code = "model_not_found"


def served_names(model: str) -> frozenset[str]:
    """The ``model`` names a request may give for the served ``model`` when it has no served name:
    as the index stores it, its folder's name and full path, for the bundled model its Hugging
    Face id, for a Hugging Face model (stored as ``NAME@COMMIT``) its name and the name's last part."""
    from indexer.embedding.hub import hub_name

    names = {model, Path(model).name}
    named = hub_name(model)
    if named is not None:
        names |= {named[0], Path(named[0]).name}
    if model == DEFAULT_MODEL:
        names.add(f"sentence-transformers/{DEFAULT_MODEL}")
    elif Path(model).is_dir():
        names.add(str(Path(model).resolve()))
    return frozenset(names)


def check_model(asked: str | None, given: str | None, stored: str, doing: str) -> None:
    """Refuse a request whose ``model`` (``asked``; None, left out: whatever is served) is not the
    served one: its ``given`` name alone, else any of ``served_names(stored)``."""
    if asked is None or asked in ({given} if given else served_names(stored)):
        return
    name = given or Path(stored).name
    raise ModelNotServed(f"model {asked!r} is not served here: this server {doing} {name!r}")


def model_name(request: Request, stored: str) -> str:
    """The name answers give the embedding model stored as ``stored``."""
    return request.app.state.names.model or stored


def reranker_name(request: Request, folder: str) -> str:
    """The name answers give the reranker in ``folder``."""
    return request.app.state.names.reranker or Path(folder).name


async def naming(request: Request) -> dict[str, str | None]:
    """``/info``'s names: the embedding model's and the reranker's (None: no reranker)."""
    state = request.app.state
    reranker = await state.reranking.current()
    return {
        "served_model_name": model_name(request, (await state.encoding()).strategy.model),
        "served_reranker_name": None if reranker is None else reranker_name(request, reranker.folder.path),
    }


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int  # when this server listed it: the models have no date of their own
    owned_by: str = "semsearch"


class ModelList(BaseModel):
    """OpenAI's list of models: the embedding model, then the reranker where there is one."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


async def list_models(request: Request) -> ModelList:
    """The models this server runs, by the names its answers give them (OpenAI's ``/v1/models``,
    what its clients and vLLM's or TEI's users list)."""
    now = int(time.time())
    names = [name for name in (await naming(request)).values() if name is not None]
    return ModelList(data=[ModelCard(id=name, created=now) for name in names])
