"""The rerank flags, given to a command as one ``rerank`` (``search.read.reranked.RerankOptions``),
built and checked once: a new rerank option is a field there and a flag here."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from indexer.errors import BadInput
from search.cli.options import Decorator, stacked
from search.read.hybrid import MAX_RERANK_DEPTH, RERANK_DEPTH

MODEL = click.option(
    "--rerank",
    metavar="MODEL",
    help="A cross-encoder (a folder as sentence-transformers saves one, or a Hugging Face name) "
    "that re-orders the first "
    "stage's best hits; each hit's score is then its score, the first stage's shown beside.",
)
DEPTH = click.option(
    "--rerank-depth",
    type=click.IntRange(1, MAX_RERANK_DEPTH),
    metavar="N",
    help=f"How many of the first stage's best the reranker re-orders, at least k. Default: {RERANK_DEPTH} "
    "(k if more).",
)
OFF = click.option(
    "--no-rerank", is_flag=True, help="Do not rerank with the index's default reranker (index --rerank)."
)


def rerank_options(*, depth: bool = True, off: bool = False) -> Decorator:
    """``--rerank`` (with ``--rerank-depth`` where ``depth``, ``--no-rerank`` where ``off``: the
    command has an index whose default reranker it may name), given to the command as one
    ``rerank``, checked against its ``-k`` (a mistake is a usage error)."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            from search.read.reranked import RerankOptions

            asked = RerankOptions(
                kwargs.pop("rerank"), kwargs.pop("rerank_depth", None), kwargs.pop("no_rerank", False)
            )
            try:
                asked.checked(kwargs.get("k") or 1, default=off)
            except BadInput as exc:
                raise click.UsageError(str(exc)) from None
            return command(rerank=asked, **kwargs)

        return stacked(MODEL, *([DEPTH] if depth else []), *([OFF] if off else []))(wrapper)

    return decorate
