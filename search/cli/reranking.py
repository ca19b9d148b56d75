"""The rerank flags, given to a command as one ``rerank`` (``search.read.reranked.RerankOptions``),
built and checked once: a new rerank option is a field there (and in ``TUNING``), a flag here and a
field of a search's body (``search.server.schema.Searching``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from indexer.errors import BadInput
from search.cli.options import Decorator, stacked
from search.read.hybrid import MAX_RERANK_DEPTH, RERANK_DEPTH

if TYPE_CHECKING:
    from search.read.reranked import RerankOptions

MODEL = click.option(
    "--rerank",
    metavar="MODEL",
    help="A cross-encoder (a folder as sentence-transformers saves one, or a Hugging Face name) "
    "that re-orders the first "
    "stage's best hits; each hit's score is then its score, the first stage's shown beside.",
)
DEPTH = click.option(
    "--rerank-depth",
    type=int,
    metavar="N",
    help=f"How many of the first stage's best the reranker re-orders, at least k, at most "
    f"{MAX_RERANK_DEPTH}. Default: {RERANK_DEPTH} (k if more).",
)
WEIGHT = click.option(
    "--rerank-weight",
    type=float,
    metavar="W",
    help="The weight the reranker's score is fused with the first stage's at, in [0, 1]: 0 keeps the "
    "first stage's order, 1 the reranker's. Default: the one calibrate or tune fitted, else 1.",
)
OFF = click.option(
    "--no-rerank", is_flag=True, help="Do not rerank with the index's default reranker (index --rerank)."
)


def rerank_options(*, depth: bool = True, off: bool = False) -> Decorator:
    """``--rerank`` (with ``--rerank-depth`` and ``--rerank-weight`` where ``depth``: the command
    searches; ``--no-rerank`` where ``off``: the command has an index whose default reranker it
    may name), given to the command as one ``rerank``, checked against its ``-k`` (a mistake is a
    usage error)."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            from search.read.reranked import TUNING, RerankOptions

            tuned = {name: kwargs.pop(f"rerank_{name}", None) for name in TUNING}
            asked = RerankOptions(kwargs.pop("rerank"), off=kwargs.pop("no_rerank", False), **tuned)
            return command(rerank=usable(asked, kwargs.get("k") or 1, default=off), **kwargs)

        tuning = [DEPTH, WEIGHT] if depth else []
        return stacked(MODEL, *tuning, *([OFF] if off else []))(wrapper)

    return decorate


def usable(rerank: RerankOptions, k: int, *, default: bool = False) -> RerankOptions:
    """``rerank`` checked at cutoff ``k`` (``RerankOptions.checked``), a mistake a usage error
    naming the flags; ``default``: the index may name the reranker."""
    try:
        return rerank.checked(k, default=default, cli=True)
    except BadInput as exc:
        raise click.UsageError(str(exc)) from None
