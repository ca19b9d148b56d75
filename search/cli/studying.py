"""The commands that study a strategy or labels: evaluate one strategy, sweep a grid of them, and
look at word vectors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from indexer.embedding.strategy import SWEPT
from search.cli.embedding import embedding_options
from search.cli.options import (
    PREFIXES,
    SHARE,
    also_options,
    corpus_option,
    encoding_option,
    json_option,
    judged_options,
    mode_option,
    pair_options,
    progress_options,
    retrieval_options,
    split,
    stacked,
    strategy_from,
    strategy_options,
    strategy_options_for,
    text_field_option,
)
from search.cli.printing import echo_pair_rejections, echo_scores, report_modes, report_sweep
from search.cli.reranking import rerank_options
from search.cli.rules import rule_options

if TYPE_CHECKING:
    from indexer.encoders.options import EmbeddingOptions
    from search.read.reranked import RerankOptions


@click.group("evaluate")
def evaluate_group() -> None:
    """Score one strategy on sentence pairs (sts) or on queries with judgements (retrieval)."""


@evaluate_group.command("sts")
@pair_options
@json_option("the scores and the strategy")
@click.option(
    "--rerank",
    "reranker",
    metavar="MODEL",
    help="Score each pair with this cross-encoder (a folder as sentence-transformers saves one, "
    "or a Hugging Face name) "
    "instead of the cosine of two embeddings.",
)
@strategy_options
@embedding_options("device", "code")
@progress_options
def evaluate_sts_command(
    pairs: Path,
    sentence1: str,
    sentence2: str,
    score: str,
    encoding: str,
    as_json: bool,
    reranker: str | None,
    asked: dict[str, Any],
    options: EmbeddingOptions,
    progress: bool,
) -> None:
    """Spearman and Pearson (x100) of cosine vs gold score on PAIRS (STS Benchmark format accepted),
    or of a cross-encoder's score with --rerank.

    \b
    Example:
        semsearch evaluate sts sts-dev.csv --pooling mean --layers -2
    """
    from search.studies.evaluate import evaluate_sts, evaluate_sts_reranked, read_pairs

    if reranker and asked:
        raise click.UsageError(
            "--rerank scores pairs with the cross-encoder alone: drop the strategy options"
        )
    data = read_pairs(pairs, sentence1, sentence2, score, encoding=encoding)
    echo_pair_rejections(data.rejected)
    if reranker:
        scores = evaluate_sts_reranked(data, reranker, progress=progress, options=options)
    else:
        scores = evaluate_sts(data, strategy_from(asked), progress=progress, options=options)
    echo_scores(scores, as_json)


@evaluate_group.command("retrieval")
@retrieval_options
@click.option(
    "--index", "index_dir", type=click.Path(path_type=Path), help="Use this index instead of building one."
)
@json_option("the metrics and the strategy")
@rerank_options()
@also_options()
@strategy_options
@embedding_options("device", "code")
@progress_options
def evaluate_retrieval_command(
    corpus: Path | None,
    queries_file: Path,
    qrels: Path,
    text_field: str,
    k: int,
    encoding: str,
    index_dir: Path | None,
    as_json: bool,
    rerank: RerankOptions,
    also: Any,
    asked: dict[str, Any],
    options: EmbeddingOptions,
    progress: bool,
) -> None:
    """MRR@k, nDCG@k, Recall@1/@k and Success@1/@3 of the queries against the qrels, in each mode;
    with --rerank, the default mode reranked first, each mode's first stage beside it.

    \b
    Example:
        semsearch evaluate retrieval --corpus faq.csv --queries questions.jsonl --qrels qrels.tsv
    """
    from search.studies.evaluate import evaluate_retrieval, read_retrieval_set

    if (corpus is None) == (index_dir is None):
        raise click.UsageError("give --corpus (to build an index) or --index (one of them)")
    if index_dir is not None and (asked or also):
        raise click.UsageError("--index is queried with its stored strategy: drop the strategy options")
    data = read_retrieval_set(queries_file, qrels, encoding)
    fields = split(text_field)
    scores = evaluate_retrieval(
        data,
        index_dir=index_dir,
        corpus=corpus,
        strategy=strategy_from(asked),
        text_fields=fields,
        k=k,
        also=also,
        progress=progress,
        options=options,
        encoding=encoding,
        rerank=rerank,
    )
    echo_scores(scores, as_json)


@evaluate_group.command("abstention")
@corpus_option(required=True)
@judged_options(required=True)
@text_field_option()
@click.option(
    "--holdout", default=0.33, show_default=True, type=SHARE, help="Share of the test threads removed."
)
@click.option(
    "--seeds", default=20, show_default=True, type=click.IntRange(min=1), help="Splits tried, one per seed."
)
@click.option("--seed", default=0, show_default=True, type=int, help="The first seed.")
@rule_options
@mode_option("The search mode the rules answer in (default: hybrid).")
@json_option("the scores of each rule")
@rerank_options()
@also_options()
@strategy_options
@encoding_option
@progress_options
def evaluate_abstention_command(
    corpus: Path,
    queries_file: Path,
    qrels: Path,
    text_field: str,
    holdout: float,
    seeds: int,
    seed: int,
    precision: float,
    guarantee: float | None,
    unanswerable: float | None,
    features: str | None,
    mode: str | None,
    as_json: bool,
    rerank: RerankOptions,
    also: Any,
    asked: dict[str, Any],
    encoding: str,
    progress: bool,
) -> None:
    """How often the promise held on threads the rule never saw, over many splits: half the
    threads calibrate (answerable labels only), the other half test, with --holdout of them
    removed from the index. The learned rule (--features, default text,gap), the plain cosine
    threshold, and the default (the one calibrate picks on each calibration half). With --rerank,
    every rule is fitted and tested on the reranker's scores, as calibrate --rerank fits it.

    \b
    Example:
        semsearch evaluate abstention --corpus faq.csv --queries questions.jsonl --qrels qrels.tsv
    """
    from search.studies.abstention import evaluate_abstention
    from search.studies.evaluate import read_retrieval_set

    report = evaluate_abstention(
        corpus,
        read_retrieval_set(queries_file, qrels, encoding=encoding),
        holdout=holdout,
        seeds=range(seed, seed + seeds),
        precision=precision,
        guarantee=guarantee,
        unanswerable=unanswerable,
        features=split(features) if features else None,
        mode=mode,
        strategy=strategy_from(asked),
        text_fields=split(text_field),
        also=also,
        progress=progress,
        encoding=encoding,
        reranking=rerank.stage(),
    )
    shown = report.to_dict()
    if as_json:
        click.echo(json.dumps(shown))
        return
    del shown["per seed"]  # a table below
    echo_scores(shown, False)
    click.echo("seed  rule precision  coverage  plain precision  coverage  default precision  coverage")
    for run in report.per_seed:
        rule, plain, chosen = run.rule, run.plain, run.default
        click.echo(
            f"{run.seed:>4}  {rule.precision:>14.3f}  {rule.coverage:>8.3f}"
            f"  {plain.precision:>15.3f}  {plain.coverage:>8.3f}"
            f"  {chosen.precision:>17.3f}  {chosen.coverage:>8.3f}"
        )


sweep_options = stacked(
    strategy_options_for("model", "max_length", "skip_special", "whiten_dims", *PREFIXES),
    click.option("--poolings", default=",".join(SWEPT), show_default=True, help="Poolings to try."),
    click.option(
        "--postprocess",
        "postprocesses",
        default="none",
        show_default=True,
        help="Post-processings to try, e.g. none,center,whiten.",
    ),
    click.option(
        "--csv", "csv_path", type=click.Path(dir_okay=False, path_type=Path), help="Write all cells."
    ),
    click.option(
        "--heatmap",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Write a PNG heatmap (needs matplotlib: pip install 'semsearch[plot]').",
    ),
    click.option(
        "--top", default=15, show_default=True, type=click.IntRange(min=0), help="Rows of the printed table."
    ),
)
"""The grid a sweep scores (the strategy it varies from, the poolings and post-processings) and
what it writes."""


def plan(asked: dict[str, Any], poolings: str, postprocesses: str, options: EmbeddingOptions) -> Any:
    """The sweep grid, checked by the library before any model loads."""
    from search.studies.sweep import plan_sweep

    trusted = options.trust_remote_code
    return plan_sweep(poolings=split(poolings), postprocesses=split(postprocesses), trusted=trusted, **asked)


@click.group("sweep")
def sweep_group() -> None:
    """Score a grid of layer x pooling strategies from one forward pass per text."""


@sweep_group.command("sts")
@pair_options
@sweep_options
@embedding_options("device", "code")
@progress_options
def sweep_sts_command(
    pairs: Path,
    sentence1: str,
    sentence2: str,
    score: str,
    encoding: str,
    asked: dict[str, Any],
    poolings: str,
    postprocesses: str,
    csv_path: Path | None,
    heatmap: Path | None,
    top: int,
    options: EmbeddingOptions,
    progress: bool,
) -> None:
    """Every strategy of the grid on sentence pairs, ranked by Spearman.

    \b
    Example:
        semsearch sweep sts sts-dev.csv --postprocess none,whiten --csv sweep.csv
    """
    from search.studies.evaluate import read_pairs
    from search.studies.sweep import sweep_sts

    grid = plan(asked, poolings, postprocesses, options)
    data = read_pairs(pairs, sentence1, sentence2, score, encoding=encoding)
    echo_pair_rejections(data.rejected)
    cells = sweep_sts(
        data,
        grid.base,
        poolings=grid.poolings,
        postprocesses=grid.postprocesses,
        progress=progress,
        options=options,
    )
    report_sweep(cells, "spearman", csv_path, heatmap, top, pairs.name, "semsearch index CORPUS -o INDEX")


@sweep_group.command("retrieval")
@retrieval_options
@click.option(
    "--metric", help="Metric to rank by: mrr@K (default), ndcg@K, recall@1, recall@K, success@1, success@3."
)
@sweep_options
@rerank_options()
@embedding_options("device", "code")
@progress_options
def sweep_retrieval_command(
    corpus: Path | None,
    queries_file: Path,
    qrels: Path,
    text_field: str,
    k: int,
    encoding: str,
    metric: str | None,
    asked: dict[str, Any],
    poolings: str,
    postprocesses: str,
    csv_path: Path | None,
    heatmap: Path | None,
    top: int,
    rerank: RerankOptions,
    options: EmbeddingOptions,
    progress: bool,
) -> None:
    """Every strategy of the grid on a retrieval set, ranked by --metric; with --rerank, the best
    cell's index searched and reranked too.

    \b
    Example:
        semsearch sweep retrieval --corpus faq.csv --queries questions.jsonl --qrels qrels.tsv
    """
    from search.studies.evaluate import read_retrieval_set
    from search.studies.sweep import retrieval_sweep

    if corpus is None:
        raise click.UsageError("give --corpus")
    grid = plan(asked, poolings, postprocesses, options)
    data = read_retrieval_set(queries_file, qrels, encoding)
    fields = split(text_field)
    metric = metric or f"mrr@{k}"
    sweep = retrieval_sweep(
        data,
        corpus,
        grid.base,
        text_fields=fields,
        poolings=grid.poolings,
        postprocesses=grid.postprocesses,
        progress=progress,
        k=k,
        metric=metric,
        options=options,
        encoding=encoding,
        rerank=rerank,
    )
    built = f"semsearch index {corpus} -o INDEX --text-field {text_field}"
    report_sweep(sweep.cells, metric, csv_path, heatmap, top, corpus.name, built)
    report_modes(sweep.modes, metric, built)
    if sweep.reranked is not None:
        done = sweep.reranked
        mode = done["mode"].split()[0]
        click.echo(
            f"reranked:   the best cell's index in {mode} mode, its best {done['rerank depth']} reranked by "
            f"{done['reranker']}: {metric} {done[metric]:.4f} (first stage {done[f'{mode} {metric}']:.4f})"
        )


@click.command("words")
@click.argument("text")
@click.option("--word", help="Show every occurrence of this word and their cosine matrix.")
@click.option(
    "--merge",
    type=click.Choice(["mean", "sum", "first", "last"]),
    default="mean",
    show_default=True,
    help="How word pieces merge into a word vector.",
)
@json_option("the strategy, the words and their cosines")
@embedding_options("device", "code")
@strategy_options_for("model", "layers", "combine", "max_length", layers="-4,-3,-2,-1", combine="sum")
def words_command(
    text: str, word: str | None, merge: str, as_json: bool, options: EmbeddingOptions, asked: dict[str, Any]
) -> None:
    """Contextual word vectors of TEXT, read from the model's hidden states (on torch).

    \b
    Example:
        semsearch words "the bank of the river and the bank account" --word bank
    """
    from dataclasses import replace

    from indexer.encoders.words import WORD_STRATEGY, context, cosine_matrix, word_encoder, word_vectors

    embedder = word_encoder(replace(WORD_STRATEGY, **asked), options)
    words = word_vectors(text, word, merge=merge, embedder=embedder)
    matrix = cosine_matrix([w.vector for w in words])
    if as_json:
        click.echo(
            json.dumps(
                {
                    "strategy": embedder.strategy.describe(),
                    "words": [w.text for w in words],
                    "cosine": matrix.round(4).tolist(),
                }
            )
        )
        return
    click.echo(f"strategy: {embedder.strategy.describe()}, word pieces merged by {merge}")
    if word is None:
        click.echo(" ".join(f"{i}:{w.text}" for i, w in enumerate(words)))
        return
    for i, occurrence in enumerate(words):
        click.echo(f"  [{i}] {context(text, occurrence)}")
    click.echo("cosine " + " ".join(f"{f'[{j}]':>6}" for j in range(len(words))))
    for i, row in enumerate(matrix):
        click.echo(f"{f'[{i}]':>6} " + " ".join(f"{value:6.3f}" for value in row))
