"""The options of a calibrated "no answer" rule (``calibrate`` and ``evaluate abstention``): its
promised precision (``--min-precision``, once ``--precision``), guarantee, assumed unanswerable
share and features."""

from __future__ import annotations

import click
from click.core import ParameterSource

from search.cli.options import SHARE, FiniteRange, stacked

PRECISION = FiniteRange(0, 1, min_open=True)
"""A promised precision: a share of right hits, above 0, at most 1."""


def _old_precision(ctx: click.Context, param: click.Parameter, value: float | None) -> None:
    """``--precision X`` as a rule's precision, its former name: said once, then taken as
    ``--min-precision X`` (``--precision`` names fp16/bf16 in every embedding command)."""
    if value is None:
        return
    click.echo(
        "note: the promised precision is now --min-precision (--precision names the network's "
        "fp32/fp16/bf16); the old name will be removed",
        err=True,
    )
    ctx.meta["old_precision"] = value
    if "precision" in ctx.params and ctx.get_parameter_source("precision") is ParameterSource.DEFAULT:
        ctx.params["precision"] = value  # --min-precision was already given its default


def _min_precision(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """The old ``--precision`` wins over ``--min-precision``'s default, whichever click reads first."""
    if ctx.get_parameter_source("precision") is ParameterSource.DEFAULT:
        return ctx.meta.get("old_precision", value)
    return value


rule_options = stacked(
    click.option(
        "--min-precision",
        "precision",
        default=0.95,
        show_default=True,
        type=PRECISION,
        callback=_min_precision,
        help="Promised precision of answered hits: the share of them that are right.",
    ),
    click.option(
        "--precision",
        "old_precision",
        type=PRECISION,
        hidden=True,
        expose_value=False,
        callback=_old_precision,
        help="The former name of --min-precision.",
    ),
    click.option(
        "--guarantee", type=SHARE, help="Probability that the precision promise holds (default 0.9)."
    ),
    click.option(
        "--unanswerable",
        type=SHARE,
        help="Share of asked questions the index has no answer for, assumed by the promise (default 1/3).",
    ),
    click.option(
        "--features",
        help="Confidence features among score, margin, zscore, gap, text, and in keyword or hybrid mode "
        "keyword, agree (default: text, the cosine of an entry's own text, or text,gap, or in keyword "
        "and hybrid mode text,gap,keyword,agree, where it wins on held-out threads of the labels).",
    ),
)
"""The options of a calibrated "no answer" rule, shared by ``calibrate`` and its evaluation."""
