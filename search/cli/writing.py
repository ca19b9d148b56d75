"""The commands that write an index: build, update, compact, merge, calibrate, and export its
query encoder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from indexer.embedding.strategy import DEFAULT_CHUNK_OVERLAP
from search.cli.embedding import embedding_options
from search.cli.options import (
    WEIGHT,
    also_options,
    corpus_options,
    encoding_option,
    index_kind_option,
    json_option,
    judged_options,
    mode_option,
    output_option,
    progress_options,
    split,
    storage_option,
    strategy_from,
    strategy_options,
    wait_option,
)
from search.cli.printing import echo_notes, echo_rejections, note_delimiter
from search.cli.reranking import rerank_options
from search.cli.rules import rule_options

if TYPE_CHECKING:
    from indexer.encoders.options import EmbeddingOptions
    from indexer.reading.corpus import CorpusOptions
    from search.read.reranked import RerankOptions


@click.command("index")
@click.argument("corpus", type=click.Path(dir_okay=False, path_type=Path))
@output_option
@corpus_options(id_help="Field with the entry id (default: 'id' if present, else row number).")
@click.option("--chunk", is_flag=True, help="Split long documents into overlapping windows.")
@click.option(
    "--chunk-overlap",
    type=click.IntRange(min=0),
    help=f"Tokens shared by neighbouring windows (implies --chunk; default {DEFAULT_CHUNK_OVERLAP}).",
)
@index_kind_option
@storage_option
@wait_option
@also_options()
@rerank_options(tuning="none")
@strategy_options
@embedding_options("batch", "ray", "device", "code")
@progress_options
def index_command(
    corpus: Path,
    index_dir: Path,
    reading: CorpusOptions,
    chunk: bool,
    chunk_overlap: int | None,
    index_kind: str,
    storage: str,
    wait: float,
    also: Any,
    rerank: RerankOptions,
    asked: dict[str, Any],
    options: EmbeddingOptions,
    progress: bool,
) -> None:
    """Embed CORPUS (CSV, TSV, JSONL or text lines) into a FAISS + SQLite index; --rerank MODEL
    stores a cross-encoder as its default reranker (query and serve rerank with it).

    \b
    Example:
        semsearch index faq.csv -o faq-index --text-field question --also answer
    """
    from indexer.writing.build import build_index

    strategy = strategy_from(asked)
    if chunk or chunk_overlap is not None:
        strategy = strategy.chunked(chunk_overlap)
    report = build_index(
        corpus,
        index_dir,
        strategy,
        corpus_options=reading,
        options=options,
        progress=progress,
        index_kind=index_kind,
        storage=storage,
        wait=wait,
        also=also,
        reranker=rerank.model,
    )
    note_delimiter(corpus, reading)
    echo_notes(report.notes)
    rate = report.entries / report.embed_seconds if report.embed_seconds else 0.0
    click.echo(
        f"indexed {report.entries} entries ({report.vectors} vectors, dim {report.dimension}) into "
        f"{report.index_dir} in {report.seconds:.1f}s (embedding {rate:.0f} entries/s)",
        err=True,
    )
    click.echo(f"strategy: {report.strategy.describe()}", err=True)
    if report.export_failure:
        click.echo(
            f"note: the model cannot be exported to ONNX ({report.export_failure}): "
            "indexed on torch, queries run on torch (same vectors, slower)",
            err=True,
        )
    echo_rejections(report.rejected, report.rejection_summary)


@click.command("add")
@click.argument("index_dir", type=click.Path(path_type=Path))
@click.argument("corpus", type=click.Path(dir_okay=False, path_type=Path))
@corpus_options(
    text_default=None,
    id_help="Field with the entry id to upsert by (default: the index's own; an index built on row "
    "numbers appends the rows with new ids).",
)
@wait_option
@embedding_options("batch", "ray", "device", "code")
@progress_options
def add_command(
    index_dir: Path,
    corpus: Path,
    reading: CorpusOptions,
    wait: float,
    options: EmbeddingOptions,
    progress: bool,
) -> None:
    """Upsert CORPUS into INDEX_DIR by id: new and changed texts are embedded, unchanged ones skipped.

    \b
    Example:
        semsearch add faq-index new-questions.csv
    """
    from indexer.writing.update import add_to_index

    report = add_to_index(
        index_dir, corpus, corpus_options=reading, options=options, progress=progress, wait=wait
    )
    note_delimiter(corpus, reading)
    echo_notes(report.notes)
    click.echo(
        f"added {report.added}, updated {report.updated}, unchanged {report.unchanged}, "
        f"rejected {len(report.rejected)}: {report.count} entries in {index_dir} ({report.seconds:.1f}s)",
        err=True,
    )
    echo_rejections(report.rejected, report.rejection_summary)


@click.command("delete")
@click.argument("index_dir", type=click.Path(path_type=Path))
@click.option("--id", "ids", multiple=True, help="External id to delete (repeatable).")
@click.option("--ids-file", help="File of ids, one per line ('-' = stdin).")
@encoding_option
@wait_option
def delete_command(
    index_dir: Path, ids: tuple[str, ...], ids_file: str | None, encoding: str, wait: float
) -> None:
    """Delete entries by id from INDEX_DIR (rows and vectors).

    \b
    Example:
        semsearch delete faq-index --id q17 --id q18
    """
    from indexer.errors import BadInput
    from indexer.writing.update import delete_from_index, read_ids

    asked = [i for i in (*ids, *(read_ids(ids_file, encoding) if ids_file else [])) if i.strip()]
    if not asked:
        raise BadInput("no ids to delete: give --id ID or --ids-file FILE")
    report = delete_from_index(index_dir, asked, wait=wait)
    click.echo(f"deleted {report.deleted}: {report.count} entries left in {index_dir}", err=True)
    if report.not_found:
        shown = ", ".join(report.not_found[:10]) + (" ..." if len(report.not_found) > 10 else "")
        click.echo(f"not found ({len(report.not_found)}): {shown}", err=True)


@click.command("compact")
@click.argument("index_dir", type=click.Path(path_type=Path))
@wait_option
def compact_command(index_dir: Path, wait: float) -> None:
    """Merge INDEX_DIR's segments, drop its tombstones and vacuum its database after many updates
    (a new complete version).

    \b
    Example:
        semsearch compact faq-index
    """
    from indexer.writing.update import compact_index

    click.echo(f"compacted {index_dir}: {compact_index(index_dir, wait=wait)} bytes", err=True)


@click.command("merge")
@click.argument("shards", nargs=-1, required=True, type=click.Path(file_okay=False, path_type=Path))
@output_option
@index_kind_option
@storage_option
def merge_command(shards: tuple[Path, ...], index_dir: Path, index_kind: str, storage: str) -> None:
    """Merge shard directories written by workers (indexer.writing.shards.embed_shard) into one index.

    \b
    Example:
        semsearch merge shard-0 shard-1 shard-2 -o big-index
    """
    from indexer.writing.shards import merge_shards

    count = merge_shards(list(shards), index_dir, index_kind=index_kind, storage=storage)
    click.echo(f"merged {len(shards)} shards: {count} entries in {index_dir}", err=True)


@click.command("export-encoder")
@click.argument("index_dir", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--output",
    "target",
    required=True,
    type=click.Path(path_type=Path),
    help="Directory to write (created; an earlier export there is replaced).",
)
def export_encoder_command(index_dir: Path, target: Path) -> None:
    """Write INDEX_DIR's query encoder for other programs: one ONNX model from token ids to the
    index's vectors (layers, pooling, normalisation and fitted post-processing inside), its
    tokenizer.json and a README of inputs and outputs.

    \b
    Example:
        semsearch export-encoder faq-index -o faq-encoder
    """
    from indexer.writing.export import export_encoder

    done = export_encoder(index_dir, target)
    click.echo(
        f"exported the encoder of {index_dir} to {done.directory}: {', '.join(done.inputs)} -> "
        f"sentence_embedding [batch, {done.dimension}] ({done.size_bytes / 1e6:.1f} MB)",
        err=True,
    )


def _under_half(rule: Any) -> str | None:
    """What answers more than a promise that answers under half: a looser target (with the
    features it was measured with, so that calibrating as said gives what was said), more labels."""
    from search.studies.promise import HALF

    if rule.coverage >= HALF:
        return None
    looser = max(((t, c) for t, c in rule.costs if c >= HALF), default=None)
    more = (
        f"--min-precision {looser[0]:g} --features {','.join(rule.features)} answers {looser[1]:.2f} "
        "with the same guarantee"
        if looser
        else "no target from 0.5 answers half with the same guarantee"
    )
    labels = (
        f"{rule.target:g} would answer half with about {rule.labels_needed} labelled questions like these"
        if rule.labels_needed
        else f"more labels like these lift {rule.target:g} to at most {rule.unguarded_coverage:.2f} "
        "(its coverage without the guarantee)"
    )
    return f"{rule.coverage:.2f} answered; {more}; {labels} (an estimate: docs/abstention-guarantee.md)"


def _labels_share(rule: Any) -> str | None:
    """The labels' share of questions with no answer in the index beside the share the promise
    assumes, and ``--unanswerable`` where they differ beyond sampling noise (None: no labels)."""
    from search.studies.promise import share_differs

    if not rule.asked:
        return None
    assumed = f"the promise assumes {rule.unanswerable:.0%}"
    if not rule.asked_unanswerable:
        return (
            f"all {rule.asked} labelled questions have an answer in the index; {assumed} of the questions "
            "asked have none (--unanswerable sets the share yours hold)"
        )
    share = rule.asked_unanswerable / rule.asked
    held = f"{share:.0%} of the {rule.asked} labelled questions have no answer in the index"
    if not share_differs(share, rule.asked, rule.unanswerable):
        return f"{held}, near the {rule.unanswerable:.0%} the promise assumes"
    suggested = min(max(share, 0.01), 0.99)  # a share in (0, 1), as --unanswerable takes
    return f"{held}; {assumed}: if users ask like these, give --unanswerable {suggested:.2f}"


@click.command("calibrate")
@click.argument("index_dir", type=click.Path(path_type=Path))
@judged_options(required=False)
@click.option(
    "--self", "from_corpus", is_flag=True, help="No labelled questions: make them from the index's own texts."
)
@click.option(
    "--unanswerable-ids",
    metavar="FILE",
    help="File of the ids of questions with no answer in the index, one per line ('-' = stdin); the other "
    "questions without a relevant judgement are left out, as evaluate leaves them out. Default: those the "
    "qrels judge with none relevant; with qrels of relevant judgements alone (not TREC's layout, no 0), "
    "every question they do not name.",
)
@click.option(
    "--remove", is_flag=True, help="Remove the index's calibration, or with --mode that mode's rule only."
)
@click.option(
    "--hybrid-weight",
    type=WEIGHT,
    help="Store this keyword share (0..1) for hybrid search instead: the best weight `sweep retrieval` "
    "measures on your labels.",
)
@encoding_option
@rule_options
@mode_option(
    "The search mode the rule answers in, fitted on that mode's ranking and signals (keyword and hybrid: "
    "with the keyword evidence) and kept beside the other modes' rules. Default: hybrid (dense where the "
    "index has no keyword table)."
)
@json_option("the stored rule's threshold, precision, coverage and features")
@rerank_options()
@wait_option
@progress_options
def calibrate_command(
    index_dir: Path,
    queries_file: Path | None,
    qrels: Path | None,
    from_corpus: bool,
    unanswerable_ids: str | None,
    remove: bool,
    hybrid_weight: float | None,
    encoding: str,
    precision: float,
    guarantee: float | None,
    unanswerable: float | None,
    features: str | None,
    mode: str | None,
    as_json: bool,
    rerank: RerankOptions,
    wait: float,
    progress: bool,
) -> None:
    """Fit and store the rule that marks hits answered, with its promise: precision >= --min-precision
    with --guarantee confidence. Each answerable question is also asked with its answers hidden,
    so labels that are all answerable still teach it to abstain; questions without a relevant
    judgement count as unanswerable where you say so (--unanswerable-ids, judgements of 0, or
    qrels of relevant judgements alone), else they are left out, and it says how it read them.
    With --self, the questions are the index's own texts with words dropped.
    With --hybrid-weight, store the keyword share hybrid search fuses with instead.
    With --rerank, the rule is fitted on that cross-encoder's scores of the reranked candidates and
    the reranker is stored as the index's default: its searches are reranked and marked by it.

    \b
    Example:
        semsearch calibrate faq-index --queries questions.jsonl --qrels qrels.tsv --min-precision 0.9
    """
    from indexer.writing.update import read_ids
    from search.studies.calibrate import calibrate_index, reranking_of
    from search.studies.evaluate import read_retrieval_set

    if hybrid_weight is not None:
        if remove or from_corpus or queries_file or qrels or unanswerable_ids or rerank.model:
            raise click.UsageError("--hybrid-weight takes no questions, no --remove and no --rerank")
        return _store_hybrid_weight(index_dir, hybrid_weight, wait)
    if remove:
        if from_corpus or queries_file or qrels or unanswerable_ids:
            raise click.UsageError("--remove takes no questions")
        return _remove_calibration(index_dir, wait, mode, rerank.model)
    if from_corpus == bool(queries_file or qrels) or not from_corpus and not (queries_file and qrels):
        raise click.UsageError("give --queries and --qrels (labelled questions), or --self")
    if unanswerable_ids and from_corpus:
        raise click.UsageError("--unanswerable-ids names labelled questions: give --queries and --qrels")
    data = None if from_corpus else read_retrieval_set(queries_file, qrels, encoding)
    named = read_ids(unanswerable_ids, encoding) if unanswerable_ids else None
    rule = calibrate_index(
        index_dir,
        data.queries if data else None,
        data.qrels if data else None,
        precision=precision,
        features=split(features) if features else None,
        guarantee=guarantee,
        unanswerable=unanswerable,
        mode=mode,
        wait=wait,
        progress=progress,
        no_answer=data.without_answer(named) if data else None,
        reranking=reranking_of(rerank),
        report=lambda line: click.echo(line, err=True),
    )
    if as_json:
        click.echo(json.dumps(rule.to_dict()))
        return
    _print_rule(rule, data.unjudged(named) if data else None, rerank.model)


def _store_hybrid_weight(index_dir: Path, weight: float, wait: float) -> None:
    from search.studies.calibrate import store_hybrid_weight

    stored = store_hybrid_weight(index_dir, weight, wait)
    click.echo(f"hybrid weight {stored:g} stored: hybrid fuses {1 - stored:g} dense + {stored:g} keyword")


def _remove_calibration(index_dir: Path, wait: float, mode: str | None, rerank: str | None) -> None:
    from search.studies.calibrate import remove_calibration, reranker_score

    removed = remove_calibration(index_dir, wait, mode, reranker_score(rerank) if rerank else "")
    which = "calibration" if mode is None else f"calibration for {mode} search"
    which += f" reranked by {rerank}" if rerank else ""
    click.echo(f"{which} removed" if removed else f"not calibrated: nothing to remove ({which})")


def _print_rule(rule: Any, unjudged: str | None, rerank: str | None) -> None:
    """What calibrate prints of the rule it stored."""
    click.echo(
        f"promise:    precision >= {rule.target:g} with {rule.guarantee:.0%} confidence, "
        f"if up to {rule.unanswerable:.0%} of the questions asked have no answer in the index"
    )
    click.echo(
        f"coverage:   {rule.coverage:.2f} of the answerable calibration questions answered "
        f"({rule.unguarded_coverage:.2f} without the {rule.guarantee:.0%} guarantee)"
    )
    if rule.costs:
        costs = ", ".join(f"{target:g} -> {coverage:.2f}" for target, coverage in rule.costs)
        click.echo(
            f"trade-off:  coverage at each precision target, same guarantee and rule "
            f"(--features {','.join(rule.features)}): {costs}"
        )
    advice = _under_half(rule)
    if advice:
        click.echo(f"under half: {advice}")
    if unjudged:
        click.echo(f"unjudged:   {unjudged}")
    share = _labels_share(rule)
    if share:
        click.echo(f"labels:     {share}")
    click.echo(f"measured:   on {rule.measured_on}")
    searched = f"{rule.mode} search reranked by {rerank}" if rerank else f"{rule.mode} search"
    click.echo(f"rule:       {','.join(rule.features)}, threshold {rule.threshold:.4f} ({searched})")
    if rerank:
        click.echo(
            f"reranker:   {rerank} stored as the index's default (its searches rerank with it; "
            "query --no-rerank for the first stage, whose hits this rule does not mark)"
        )
    if rule.why:
        click.echo(f"chosen:     {rule.why}")
