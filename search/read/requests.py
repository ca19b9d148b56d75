"""What a search is asked and what it answers: the request (``SearchRequest``, the one object every
surface asks a search with) and its checks (its queries, the strategy it asks for), the embedding
step it is given, the entries its filter admits and a ``Hit``. Shared by the engine,
``search.read.similar`` and the server."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import numpy as np

from indexer.embedding.strategy import Strategy
from indexer.errors import BadInput, StrategyConflict
from indexer.reading.corpus import blank
from search.read.encoding import Encoding, Roles
from search.read.queries import check_text
from search.read.reranked import RerankOptions, rerank_depth

T = TypeVar("T")
R = TypeVar("R")

Embedding = Callable[[Encoding, list[str], Callable[[np.ndarray], T], Roles], R]
"""The embedding step of a search: ``step(encoding, texts, then, roles)`` gives ``then(vectors)``,
the vectors being ``encoding.embed(texts, role=roles)`` (a search's texts are queries). ``here``
runs it in the caller's thread (the CLI, Python); the server's is its micro-batcher
(``search.server.batching.MicroBatcher.run``)."""


@dataclass(frozen=True)
class Hit:
    """One result: its rank (from 1), the entry's id, score (one scale in every mode, ``search.read.hybrid``:
    dense, the cosine; keyword, its BM25 over the most the query's words could give, in [0, 1);
    hybrid, (1 - w) * cosine + w * the share of the query's words it holds, by rarity; reranked,
    the cross-encoder's fused with the first stage's at the reranker's weight, 1 unless ``tune``
    fitted another, both kept in ``rerank_score`` and ``first_score``), embedded text and stored fields."""

    rank: int
    id: str
    score: float
    text: str
    fields: dict[str, Any]
    answered: bool | None = None  # by the index's calibrated rule or a --min-score; None: neither
    confidence: float | None = None  # the calibrated rule's probability that this hit is right
    others: int | None = None  # grouped: entries of its group (the filter admits) below it; else None
    first_score: float | None = None  # reranked: the first stage's score
    rerank_score: float | None = None  # reranked: the reranker's own (``score``: fused at its weight)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


MOST_HITS = 2**63 - 1
"""The largest k a search takes: what SQLite, which keyword search asks for the k best, can count to."""


def check_k(k: int) -> int:
    """``k`` if a search can return that many hits (a whole number, at least 1, at most
    ``MOST_HITS``); else one line."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise BadInput(f"k must be a whole number, not {k!r}")
    k = int(k)
    if k < 1:
        raise BadInput(f"k must be at least 1, not {k}")
    if k > MOST_HITS:
        raise BadInput(f"k must be at most {MOST_HITS}, not {k}")
    return k


@dataclass(frozen=True)
class SearchRequest:
    """One search call, as the CLI, Python and the server ask it: its queries, how many hits
    (``k``), a filter on stored fields (``where``, ``search.read.filters``), a threshold on the
    score under which a hit is not answered (``min_score``, over the calibrated rule), a stored
    field to show the best hit per value of (``group_by``), the mode (dense, keyword or hybrid,
    ``search.read.hybrid``; None: the index's, ``Snapshot.mode``), and the rerank stage
    (``rerank``: ``search.read.reranked.RerankOptions``, a folder or Hub name standing for its
    options; None: the first stage's order). Checked by ``checked``; resolved on a snapshot by
    ``Snapshot.plan``."""

    queries: tuple[str, ...]
    k: int = 10
    where: str | None = None
    min_score: float | None = None
    group_by: str | None = None
    mode: str | None = None
    rerank: RerankOptions | None = None

    def __post_init__(self) -> None:
        if isinstance(self.queries, str) or not isinstance(self.queries, Iterable):  # one query as itself
            object.__setattr__(self, "queries", (self.queries,))
        elif not isinstance(self.queries, tuple):
            object.__setattr__(self, "queries", tuple(self.queries))
        if self.rerank is not None and not isinstance(self.rerank, RerankOptions):  # a folder or name
            object.__setattr__(self, "rerank", RerankOptions.asked(self.rerank))

    @property
    def reranked_by(self) -> str | None:
        """The reranker this request reranks with (its folder or name), or None."""
        return None if self.rerank is None else self.rerank.folder

    @property
    def depth(self) -> int:
        """The first stage's entries a reranker re-orders (``rerank_depth``)."""
        return rerank_depth(self.k, None if self.rerank is None else self.rerank.depth)

    def checked(self) -> SearchRequest:
        """This request if it can be searched, else one line: its queries, k, its rerank options
        (``RerankOptions.checked``), and a minimum score that is a number (its range is the
        score's: ``search.read.confidence.check_min_score``)."""
        check_queries(self.queries)
        check_k(self.k)
        if self.rerank is not None:
            self.rerank.checked(self.k)
        if self.min_score is not None:
            if isinstance(self.min_score, bool) or not isinstance(self.min_score, numbers.Real):
                raise BadInput(f"min score must be a number, not {self.min_score!r}")
            if not math.isfinite(self.min_score):
                raise BadInput(f"min score must be a finite number, not {self.min_score}")
        return self


def check_queries(queries: Sequence[str]) -> None:
    """An empty query has no meaning to embed: refuse it rather than return arbitrary hits; nor
    has text that is not valid UTF-8."""
    for query in queries:
        if not isinstance(query, str):
            raise BadInput(f"a query is text, not {type(query).__name__}")
        if blank(query):
            raise BadInput("empty query: give some text to search for")
        check_text(query, "the query")


def check_strategy(stored: Strategy, asked: dict[str, Any]) -> None:
    """Queries embed with the stored strategy; asking for another one is an error naming it.

    ``asked`` is a request (it may say ``auto``, or give the model by a relative path): it is
    resolved over the stored strategy and compared with it, the model by its identity.
    """
    if not asked:
        return
    from indexer.embedding.models import identified, resolve_strategy

    unidentified = {"model_fingerprint": None} if "model" in asked else {}
    request = resolve_strategy(Strategy.from_dict({**stored.to_dict(), **unidentified, **asked}))
    differing = identified(stored).differences(request)
    if differing:
        raise StrategyConflict(
            f"this index was built with {stored.describe()}; queries always use it "
            f"({', '.join(differing)} differ): rebuild the index to change the strategy"
        )


def here(encoding: Encoding, texts: list[str], then: Callable[[np.ndarray], T], roles: Roles = "query") -> T:
    """The embedding step run in the caller's thread."""
    return then(encoding.embed(texts, role=roles))


@dataclass(frozen=True)
class Allowed:
    """Row ids a filter admits and how many vectors they hold (chunked entries hold several)."""

    ids: np.ndarray
    vectors: int
