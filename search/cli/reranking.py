"""The rerank flags, given to a command as one ``rerank`` (``search.read.reranked.RerankOptions``),
built and checked once: each ``--rerank-NAME`` flag is built from its option's ``Tuning``
(``search.read.reranked.TUNING``), so a new rerank option is its field there and the code that
reads it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal

import click

from indexer.errors import BadInput
from search.cli.options import Decorator, stacked
from search.read.reranked import TUNING, RerankOptions, Tuning

MODEL = click.option(
    "--rerank",
    metavar="MODEL",
    help="A cross-encoder (a folder as sentence-transformers saves one, or a Hugging Face name) "
    "that re-orders the first "
    "stage's best hits; each hit's score is then its score, the first stage's shown beside.",
)
OFF = click.option(
    "--no-rerank", is_flag=True, help="Do not rerank with the index's default reranker (index --rerank)."
)


def flag(name: str, said: Tuning) -> Decorator:
    """The ``--rerank-NAME`` flag of the rerank option ``name``, as its ``Tuning`` says."""
    kind = click.Choice(said.choices) if said.choices else said.kind
    return click.option(
        f"--rerank-{name}", type=kind, metavar=said.metavar, help=f"{said.says} Default: {said.default}."
    )


FLAGS = {name: flag(name, said) for name, said in TUNING.items()}


def rerank_options(*, tuning: Literal["all", "loading", "none"] = "all", off: bool = False) -> Decorator:
    """``--rerank`` with the flags of its options (``tuning``: all of them where the command
    searches; ``loading``, those that say how the reranker loads, where each search says the rest
    itself, as a server's requests do; ``none``, where the command only names the reranker;
    ``--no-rerank`` where ``off``: the command has an index whose default reranker it may name),
    given to the command as one ``rerank``, checked against its ``-k`` (a mistake is a usage
    error)."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            tuned = {name: kwargs.pop(f"rerank_{name}", None) for name in TUNING}
            asked = RerankOptions(kwargs.pop("rerank"), off=kwargs.pop("no_rerank", False), **tuned)
            return command(rerank=usable(asked, kwargs.get("k") or 1, default=off), **kwargs)

        flags = [
            FLAGS[name]
            for name, said in TUNING.items()
            if tuning == "all" or (tuning == "loading" and said.loads)
        ]
        return stacked(MODEL, *flags, *([OFF] if off else []))(wrapper)

    return decorate


def usable(rerank: RerankOptions, k: int, *, default: bool = False) -> RerankOptions:
    """``rerank`` checked at cutoff ``k`` (``RerankOptions.checked``), a mistake a usage error
    naming the flags; ``default``: the index may name the reranker."""
    try:
        return rerank.checked(k, default=default, cli=True)
    except BadInput as exc:
        raise click.UsageError(str(exc)) from None
