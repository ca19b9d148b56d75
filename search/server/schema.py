"""The API's shapes: the request models with their bounds, the ``Error`` every error answer has,
and the OpenAPI schema that documents exactly those answers (no 422: bad input is a 400). Numbers
and flags are strict: JSON's ``true`` is no count and ``"2"`` no number (a 400 naming the field)."""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    Field,
    StrictBool,
    StrictFloat,
    StrictStr,
    WithJsonSchema,
    create_model,
)
from pydantic_core import PydanticCustomError

from indexer.errors import BadInput
from search.read.filters import MAX_FILTER_LENGTH
from search.read.hybrid import MODES, RERANK_DEPTH
from search.read.queries import check_text
from search.read.reranked import TUNING, RerankOptions, Tuning
from search.server.connections import MAX_BODY

MAX_QUERY = 2000  # characters in one query or sentence
MAX_K = 100
MAX_BATCH = 64  # queries in one /search/batch, and default texts per forward pass
MAX_CANDIDATES = 1000
MAX_REQUEST_PAIRS = MAX_BATCH * RERANK_DEPTH
"""Cross-encoder pairs one search request may cause (its queries times its rerank depth), refused
past it before any model work: the least that takes a full batch at the default depth (64 x 50 =
3,200; past k 50 the default depth is k, so a full batch at k 100 must be split in two), and three
searches at the deepest (``MAX_RERANK_DEPTH``). At 200 to 25 pairs/s on 2 cores (short entries on
quiet cores to long ones under load, docs/rerank.md) that is 16 s to 2 min at the worst; 64
queries at depth 1000 would be 64,000 pairs, 5 to 40 min. ``group_by`` may add each query's k
group heads past the depth (so at most twice this). The rerank routes are held to
``MAX_CANDIDATES`` documents, under it, and to ``MAX_REQUEST_TOKENS`` of pairs."""
MAX_FIELD_NAME = 200  # characters in a group_by field name


def check_pairs(queries: int, depth: int) -> None:
    """Refuse a search whose ``queries`` reranked ``depth`` deep pass ``MAX_REQUEST_PAIRS``."""
    pairs = queries * depth
    if pairs > MAX_REQUEST_PAIRS:
        raise BadInput(
            f"too much reranking for one request: {queries} queries at rerank_depth {depth} are "
            f"{pairs} pairs to score, at most {MAX_REQUEST_PAIRS}: split the batch, or lower "
            "rerank_depth (or k, the least depth)"
        )


def _unicode(text: str) -> str:
    """JSON can carry lone surrogates (``"\\ud800"``): refused at the boundary, field by field."""
    try:
        return check_text(text)
    except BadInput as exc:
        raise ValueError(str(exc)) from None


def _json_integer(value: object) -> object:
    """JSON's numbers alone: ``true`` and ``"2"`` are no count (pydantic's lax mode takes them as 1
    and 2); ``2.0`` is one, as JSON Schema's ``integer`` says."""
    if isinstance(value, bool | str):
        shown = json.dumps(value, ensure_ascii=False)[:40]
        raise PydanticCustomError("int_type", "Input should be a JSON integer, not {value}", {"value": shown})
    return value


Count = Annotated[int, BeforeValidator(_json_integer)]
Text = Annotated[str, AfterValidator(_unicode)]
Query = Annotated[str, Field(min_length=1, max_length=MAX_QUERY), AfterValidator(_unicode)]
Where = Annotated[str, Field(max_length=MAX_FILTER_LENGTH), AfterValidator(_unicode)]
GroupBy = Annotated[
    str | None,
    Field(
        min_length=1,
        max_length=MAX_FIELD_NAME,
        description="A stored field: the best hit per value of it, each with `others`, the "
        "count of the rest of its group.",
    ),
    AfterValidator(lambda name: name if name is None else _unicode(name)),
]


class Error(BaseModel):
    """Every error answer (but /v1/embeddings'): one line saying what went wrong."""

    error: str


class OpenAIErrorDetail(BaseModel):
    message: str  # the one line
    type: Literal["invalid_request_error", "server_error"]  # 4xx, 5xx
    param: str | None = None
    code: str | None = None


class OpenAIError(BaseModel):
    """Every error answer of /v1/embeddings: OpenAI's shape, whose message its clients show
    (``search.server.errors``)."""

    error: OpenAIErrorDetail


def answers(*codes: int, shape: type[BaseModel] = Error) -> dict[int | str, dict[str, Any]]:
    """The error answers a route gives, for its OpenAPI entry (all of them ``shape``)."""
    return {code: {"model": shape, "description": ERRORS[code]} for code in codes}


ERRORS = {
    400: "Bad input: unreadable JSON or text, a missing or out-of-range field, a bad filter, too much "
    "text or reranking.",
    404: "No such route or file, or (/v1/embeddings) a model this server does not run.",
    405: "The route does not take this method.",
    409: "A conflict with the index's state.",
    413: f"A request body over {MAX_BODY} bytes.",
    503: "The index cannot serve: damaged, removed or unreadable.",
}


Mode = Literal[MODES] | None  # the names in one place: search.read.hybrid.MODES


def _finite(value: object) -> object:
    """NaN and infinities (JSON ``NaN``, ``Infinity``, or the strings) are no score: refused by
    name before the range check, whose message ("less than or equal to 1") would not say why."""
    try:
        number = float(value) if isinstance(value, float | str) else 0.0
    except ValueError:
        return value  # not a number at all: the float check says so
    if not math.isfinite(number):
        raise PydanticCustomError(
            "finite_number",
            "must be a number in [-1, 1] (the scale of every mode's score; reranked, the reranker's), "
            "not {value}",
            {"value": value},
        )
    return value


MinScore = Annotated[StrictFloat | None, BeforeValidator(_finite)]
"""answered = score >= it (one scale in every mode: search.read.hybrid, in [-1, 1]; reranked, the
reranker's own), over the stored rule; its range is checked with the request
(``search.read.confidence.check_min_score``)."""
Rerank = Annotated[
    StrictBool | None,
    Field(
        description="Rerank with the server's reranker (serve --rerank, or the index's default): "
        "null, where it has one; false, the first stage alone; true, refused where it has none."
    ),
]


JSON_KINDS: dict[type, Any] = {int: Count, float: StrictFloat, str: StrictStr}
"""The strict JSON type of a rerank option of each Python type (``Tuning.kind``)."""


def tuned_field(said: Tuning) -> tuple[Any, Any]:
    """The ``rerank_NAME`` field of a search's body for the rerank option ``said``: its JSON type
    (its names, where it takes a few), null unless given, described as its flag is."""
    kind = Literal[said.choices] if said.choices else JSON_KINDS[said.kind]
    return kind | None, Field(None, description=f"{said.says} Null: {said.default}.")


class Asking(BaseModel):
    """What a search body asks besides its queries and its reranker's options (``Searching``)."""

    k: Count = Field(10, ge=1, le=MAX_K)
    where: Where | None = None
    min_score: MinScore = None
    group_by: GroupBy = None
    mode: Mode = None  # dense, keyword or hybrid (search.read.hybrid); None: the index's default
    rerank: Rerank = None

    def reranking(self) -> RerankOptions:
        """The rerank options this body asks (``RerankOptions.asked``)."""
        tuned = {name: getattr(self, f"rerank_{name}") for name in TUNING}
        return RerankOptions.asked(self.rerank is not False, **tuned)


Searching = create_model(
    "Searching",
    __base__=Asking,
    __doc__="""What a search body asks besides its queries (``/search``, ``/search/batch``). Its
    rerank options are fields ``rerank_NAME``, one built from each ``Tuning`` of
    ``search.read.reranked.TUNING``, checked where the CLI's and Python's are
    (``RerankOptions.checked``: out of range, a 400 naming the field).""",
    **{f"rerank_{name}": tuned_field(said) for name, said in TUNING.items()},
)


class SearchRequest(Searching):
    query: Query


class BatchRequest(Searching):
    queries: list[Query] = Field(min_length=1, max_length=MAX_BATCH)


class SimilarRequest(BaseModel):
    sentence: Query
    candidates: list[Text] = Field(min_length=1, max_length=MAX_CANDIDATES)
    k: Count | None = Field(None, ge=1, le=MAX_CANDIDATES)


MAX_INPUTS = 2048  # texts in one /v1/embeddings or /encode request (OpenAI's own limit)
MAX_TEXT = 20_000  # characters in one text to encode: far past what any model reads (it cuts there)
EncodeText = Annotated[str, Field(min_length=1, max_length=MAX_TEXT), AfterValidator(_unicode)]
InputType = Annotated[
    Literal["query", "passage"],
    Field(description="What the texts are: queries, or passages (entries); each gets the strategy's prefix."),
]


def _inputs(value: object) -> object:
    """OpenAI's ``input``: one string is one text; token ids (its other form) are refused by name."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, int | list) for v in value):
        raise ValueError(
            "token ids are not taken: send the texts (LangChain: check_embedding_ctx_length=False)"
        )
    return value


class EmbeddingsRequest(BaseModel):
    """OpenAI's embeddings request. ``model``, required by OpenAI clients, must name the served model
    (its name, folder or path) or be left out; the answer's ``model`` names what this server runs."""

    input: Annotated[list[EncodeText], BeforeValidator(_inputs), Field(min_length=1, max_length=MAX_INPUTS)]
    model: ModelName = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Count | None = Field(None, ge=1)
    user: str | None = None
    input_type: InputType = "query"


class EncodeRequest(BaseModel):
    """bert-as-service's shape: texts in, one vector each out."""

    texts: list[EncodeText] = Field(min_length=1, max_length=MAX_INPUTS)
    input_type: InputType = "query"


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # floats, or base64 of little-endian float32


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsAnswer(BaseModel):
    """OpenAI's embeddings answer: ``data[i]`` is input i's vector."""

    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: Usage


class EncodeAnswer(BaseModel):
    vectors: list[list[float]]


class RerankDocument(BaseModel):
    text: EncodeText


def _document_text(value: object) -> object:
    """A v1 document given as ``{"text": ...}``, read as its text: one check for both forms, so a
    bad one is one line naming its place (a union of the two would name pydantic's validators)."""
    if isinstance(value, dict) and "text" in value:
        return value["text"]
    if not isinstance(value, str):
        raise PydanticCustomError("document_type", 'a document is a string or {"text": "..."}')
    return value


DOCUMENT_FORMS = {"anyOf": [{"type": "string"}, {"$ref": "#/components/schemas/RerankDocument"}]}
ModelName = Annotated[
    str | None, Field(description="The served model's name, or left out (any other, even empty: 404).")
]


class RerankRequest(BaseModel):
    """Cohere's, Jina's and Infinity's rerank request: ``documents`` strings or ``{"text": ...}``;
    ``model`` names the served reranker (its folder's name or path) or is left out."""

    query: Query
    documents: list[
        Annotated[EncodeText, BeforeValidator(_document_text), WithJsonSchema(DOCUMENT_FORMS)]
    ] = Field(min_length=1, max_length=MAX_CANDIDATES)
    top_n: Count | None = Field(None, ge=1)
    return_documents: StrictBool = False
    model: ModelName = None


class RerankResult(BaseModel):
    index: int
    relevance_score: float  # the reranker's score, as CrossEncoder.predict gives it
    document: RerankDocument | None = None


class RerankUsage(BaseModel):
    total_tokens: int


class RerankAnswer(BaseModel):
    """Best first; ``index``: the document's position in the request."""

    results: list[RerankResult]
    model: str
    usage: RerankUsage


class RerankV2Request(BaseModel):
    """Cohere v2's rerank request (``cohere.ClientV2``): ``documents`` strings alone, ``model`` as
    /v1/rerank's. ``max_tokens_per_doc``: each document is read as its first so many tokens of the
    reranker's tokenizer, as Cohere cuts it; each pair is then cut at the reranker's max_length,
    as CrossEncoder cuts it."""

    model: ModelName = None
    query: Query
    documents: list[EncodeText] = Field(min_length=1, max_length=MAX_CANDIDATES)
    top_n: Count | None = Field(None, ge=1)
    max_tokens_per_doc: Count | None = Field(None, ge=1)


class RerankV2Result(BaseModel):
    index: int
    relevance_score: float


class ApiVersion(BaseModel):
    version: Literal["2"] = "2"


class BilledUnits(BaseModel):
    search_units: int  # as Cohere counts them: one a 100 documents


class MetaTokens(BaseModel):
    input_tokens: int  # the tokens the reranker read
    output_tokens: int = 0


class RerankV2Meta(BaseModel):
    api_version: ApiVersion
    billed_units: BilledUnits
    tokens: MetaTokens


class RerankV2Answer(BaseModel):
    """Cohere v2's rerank answer: ``results`` best first, the first ``top_n``; ``id`` new per answer."""

    id: str
    results: list[RerankV2Result]
    meta: RerankV2Meta


class TeiRerankRequest(BaseModel):
    """text-embeddings-inference's ``/rerank`` request. Pairs are always cut at the reranker's
    max_length, as CrossEncoder cuts them (``truncate`` is taken and changes nothing)."""

    query: Query
    texts: list[EncodeText] = Field(min_length=1, max_length=MAX_CANDIDATES)
    raw_scores: StrictBool = False
    return_text: StrictBool = False
    truncate: StrictBool | None = None


class TeiRank(BaseModel):
    """One text of a TEI rerank answer (a list of them, best first): ``score`` the sigmoid of the
    logit, or the logit itself with ``raw_scores``."""

    index: int
    score: float
    text: str | None = None


def answered(
    model: type[BaseModel], *codes: int, shape: type[BaseModel] = Error
) -> dict[int | str, dict[str, Any]]:
    """``answers(*codes, shape=shape)`` and the 200 answer's model, for a route that returns a
    ready response."""
    return {200: {"model": model, "description": "Successful Response"}, **answers(*codes, shape=shape)}


def install_openapi(app: FastAPI) -> None:
    """FastAPI's schema, less the 422 it documents for every route with input: this server
    answers bad input with 400 ``Error`` (``search.server.app``'s ``invalid_request``)."""

    def openapi() -> dict[str, Any]:
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
