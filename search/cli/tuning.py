"""``semsearch tune``: fine-tune a model on labels through a strategy (``search.studies.tuning``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from search.cli.embedding import embedding_options
from search.cli.options import (
    SHARE,
    FiniteRange,
    also_options,
    corpus_option,
    encoding_option,
    json_option,
    judged_options,
    pair_columns_options,
    progress_options,
    split,
    strategy_from,
    strategy_options,
    text_field_option,
)
from search.cli.printing import echo_pair_rejections

if TYPE_CHECKING:
    from indexer.encoders.options import EmbeddingOptions

CROSS_OPTIONS = {"model", "max_length"}
"""The strategy options that mean something to a cross-encoder: where it starts, its pair length."""


@click.command("tune")
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="New model directory (use it with --model).",
)
@click.option(
    "--pairs",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Scored sentence pairs (any file evaluate sts reads), or two text columns (positive pairs).",
)
@pair_columns_options
@judged_options(required=False)
@corpus_option(required=False)
@text_field_option()
@also_options(weighted=False)
@click.option(
    "--index",
    "index_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Train through this index's strategy (its model, layers, pooling...).",
)
@click.option(
    "--cross-encoder",
    "cross",
    is_flag=True,
    help="Train a cross-encoder (a reranker) from --model (default: the bundled model, a new head) "
    "instead of the bi-encoder; --index then names the first stage that mines hard negatives.",
)
@click.option(
    "--held-back",
    type=SHARE,
    help="Share of the labels measured, never trained. Default: 0.1; a reranker's 0.2, cut to fit "
    "--max-minutes.",
)
@click.option(
    "--epochs", default=4, show_default=True, type=click.IntRange(min=1), help="Passes over the labels."
)
@click.option("--max-minutes", type=FiniteRange(min=0, min_open=True), help="Stop training after this long.")
@click.option(
    "--seed", default=0, show_default=True, type=int, help="Seed of the held-back share and the batches."
)
@click.option(
    "--pairs-per-step",
    default=16,
    show_default=True,
    type=click.IntRange(min=2),
    help="Labelled pairs per training step.",
)
@click.option(
    "--batch-size",
    "old_pairs_per_step",
    type=click.IntRange(min=2),
    hidden=True,
    help="The former name of --pairs-per-step (--batch-size counts texts elsewhere).",
)
@click.option(
    "--learning-rate",
    type=SHARE,
    help="Peak learning rate (AdamW). Default: 2e-5; 6e-5 for a reranker given a new head.",
)
@json_option("the report (the metric before and after, the steps, the saved model)")
@encoding_option
@progress_options
@embedding_options("device", "code")
@strategy_options
def tune_command(
    output: Path,
    pairs: Path | None,
    sentence1: str,
    sentence2: str,
    score: str,
    queries_file: Path | None,
    qrels: Path | None,
    corpus: Path | None,
    text_field: str,
    also: Any,
    index_dir: Path | None,
    cross: bool,
    held_back: float | None,
    epochs: int,
    max_minutes: float | None,
    seed: int,
    pairs_per_step: int,
    old_pairs_per_step: int | None,
    learning_rate: float | None,
    as_json: bool,
    options: EmbeddingOptions,
    encoding: str,
    asked: dict[str, Any],
    progress: bool,
) -> None:
    """Fine-tune the model (default: the index's) on your labels through the index's strategy,
    holding a share back to measure; then index and query with --model OUTPUT. The labels: --pairs,
    --queries and --qrels with --corpus, or --corpus and --also alone (an FAQ without labels: each
    entry's text learns to find its --also text).

    \b
    Example:
        semsearch tune --pairs pairs.csv --index faq-index -o tuned-model
    """
    from search.studies.tuning import read_labels

    if old_pairs_per_step is not None:
        click.echo(
            "note: tune's --batch-size is now --pairs-per-step (--batch-size counts texts in every "
            "other command); the old name will be removed",
            err=True,
        )
        pairs_per_step = old_pairs_per_step
    _check_options(cross, index_dir, asked)
    labels = read_labels(
        pairs=pairs,
        columns=(sentence1, sentence2, score),
        queries=queries_file,
        qrels=qrels,
        corpus=corpus,
        text_fields=split(text_field),
        also=also,
        encoding=encoding,
    )
    echo_pair_rejections(labels.rejected)
    schedule = {
        **({} if held_back is None else {"held_back": held_back}),
        "epochs": epochs,
        "max_minutes": max_minutes,
        "seed": seed,
        "batch_size": pairs_per_step,
        "learning_rate": learning_rate,
        "progress": progress,
        "report": lambda line: click.echo(line, err=True),
        "options": options,
    }
    _print_report(_train(labels, output, cross, index_dir, asked, schedule), as_json)


def _check_options(cross: bool, index_dir: Path | None, asked: dict[str, Any]) -> None:
    """Options that make no sense together: a usage error before anything is read."""
    shaping = sorted(set(asked) - CROSS_OPTIONS)
    if cross and shaping:
        flag = "--" + shaping[0].replace("_", "-")
        raise click.UsageError(
            f"--cross-encoder trains a reranker from --model: {flag} shapes a bi-encoder's vectors; "
            "drop it (--index names the first stage)"
        )
    if index_dir is not None and asked and not cross:
        raise click.UsageError("--index trains through the index's strategy: drop the strategy options")


def _train(
    labels: Any,
    output: Path,
    cross: bool,
    index_dir: Path | None,
    asked: dict[str, Any],
    schedule: dict[str, Any],
) -> Any:
    """The library's tune: a reranker (``cross_tune``) or a bi-encoder (``tune``)."""
    from search.studies.cross_tuning import cross_tune
    from search.studies.tuning import index_strategy, tune

    if cross:
        first = index_strategy(index_dir) if index_dir is not None else None
        return cross_tune(
            labels, output, asked.get("model"), first, max_length=asked.get("max_length"), **schedule
        )
    strategy = index_strategy(index_dir) if index_dir is not None else strategy_from(asked)
    return tune(labels, output, strategy, **schedule)


def _print_report(done: Any, as_json: bool) -> None:
    """The report on stdout: one JSON line, or the held-back figures and what to do next."""
    from search.studies.cross_tuning import report_of

    if as_json:
        click.echo(json.dumps(done.to_dict()))
        return
    alone = "" if done.first_stage is None else f"first stage alone {done.first_stage:.2f}; "
    click.echo(
        f"held-back {done.metric} x100 on {done.held_back_pairs} {done.kind}: {alone}"
        f"{done.before:.2f} before, {done.after:.2f} after ({done.stopped}; best at step {done.best_step} "
        f"of {done.steps}, {done.epochs:.2f} epochs, {done.minutes:.1f} min)"
    )
    if done.reranker:
        for line in report_of(done):
            click.echo(line)
        return
    click.echo(
        f"saved {done.output}: semsearch index CORPUS -o INDEX {done.options or '--model ' + done.output}"
    )
