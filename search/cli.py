"""``semsearch``: click commands that are thin shells over indexer.build_index, SearchEngine and
rank_similar. Every user mistake ends as one line on stderr and a non-zero exit."""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import textwrap
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import click

from indexer.embedding.strategy import (
    AUTO,
    BACKENDS,
    COMBINES,
    DEFAULT_CHUNK_OVERLAP,
    DEFAULT_WEIGHT,
    POOLINGS,
    POSTPROCESSES,
    ROLES,
    Strategy,
)
from indexer.errors import BadInput, SemsearchError
from indexer.reading.formats import FORMATS
from indexer.vectors.factory import KINDS, STORAGES


class _UserError(click.ClickException):
    def __init__(self, error: SemsearchError):
        super().__init__(str(error))
        self.exit_code = error.exit_code


class _Group(click.Group):
    """Turns library errors into click's one-line errors; never shows a traceback by default."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SemsearchError as exc:
            raise _UserError(exc) from None
        except KeyboardInterrupt:
            click.echo("Interrupted: nothing was changed.", err=True)
            ctx.exit(130)
        except BrokenPipeError:
            sys.stderr.close()  # a reader like `head` went away: not an error worth a message
            ctx.exit(0)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:
            if os.environ.get("SEMSEARCH_DEBUG"):
                raise
            raise click.ClickException(
                f"unexpected {type(exc).__name__}: {exc} (SEMSEARCH_DEBUG=1 shows a traceback)"
            ) from None


def _parse_layers(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    if value is None or value == AUTO:
        return None
    try:
        return tuple(int(part) for part in value.split(","))
    except ValueError:
        raise click.BadParameter("give layer indices like -2 or -4,-3,-2,-1") from None


STRATEGY_OPTIONS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "model": (("--model",), {"help": "Hugging Face name or local path. Default: {default}."}),
    "layers": (
        ("--layers",),
        {
            "callback": _parse_layers,
            "help": "Hidden state(s) to read, e.g. -2 or -3,-2,-1 (0 = embeddings). Default: {default}.",
        },
    ),
    "combine": (
        ("--combine",),
        {"type": click.Choice(COMBINES), "help": "How several layers combine. Default: {default}."},
    ),
    "pooling": (
        ("--pooling",),
        {
            "type": click.Choice((AUTO, *POOLINGS)),
            "help": "Token pooling (auto: the model's own config, else mean). Default: {default}.",
        },
    ),
    "skip_special": (
        ("--skip-special/--keep-special",),
        {"default": None, "help": "Leave [CLS]/[SEP] out of mean/max pooling."},
    ),
    "max_length": (
        ("--max-length",),
        {"type": click.IntRange(min=4), "help": "Tokens per text. Default: {default}."},
    ),
    "normalize": (("--normalize/--no-normalize",), {"default": None, "help": "L2-normalise vectors."}),
    "postprocess": (
        ("--postprocess",),
        {
            "type": click.Choice(POSTPROCESSES),
            "help": "Anisotropy correction fitted on the indexed texts: center or whiten.",
        },
    ),
    "whiten_dims": (
        ("--whiten-dims",),
        {"type": click.IntRange(min=1), "help": "Dimensions kept by whitening."},
    ),
    "backend": (
        ("--backend",),
        {
            "type": click.Choice(BACKENDS),
            "help": "Inference: onnx (fast), torch (same vectors), onnx-int8 (other vectors). "
            "Default: {default}.",
        },
    ),
    "query_prefix": (
        ("--query-prefix",),
        {"metavar": "TEXT", "help": "Text put before every query, e.g. 'query: ' (e5), a BGE instruction."},
    ),
    "passage_prefix": (
        ("--passage-prefix",),
        {"metavar": "TEXT", "help": "Text put before every indexed text, e.g. 'passage: ' (e5)."},
    ),
}
"""Every embedding-strategy option: its flags and click settings; ``{default}`` in a help text is
filled with the default of the command that shows it (``strategy_options_for``)."""
PREFIXES = ("query_prefix", "passage_prefix")

DEFAULTS = {
    "model": "the bundled all-MiniLM-L6-v2",
    "layers": "auto (a sentence-transformers model's last, else the second-to-last)",
    "combine": "mean",
    "pooling": "auto",
    "max_length": "the model's limit",
    "backend": "onnx",
}
"""What the library picks when a strategy option is not given (``indexer.embedding.strategy.Strategy``)."""


def strategy_options_for(*names: str, **defaults: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator with the strategy options ``names`` (all of them when none is named) that
    collects them into ``asked`` (only those the user gave). A command shows only the options
    that can change its vectors; ``defaults`` overrides ``DEFAULTS`` where it picks others."""
    chosen = names or tuple(STRATEGY_OPTIONS)
    said = {**DEFAULTS, **defaults}

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            asked = {name: kwargs.pop(name) for name in chosen}
            if asked.get("layers", 0) is None:  # "auto" and "not given" mean the same: the model decides
                asked.pop("layers")
            return command(asked={k: v for k, v in asked.items() if v is not None}, **kwargs)

        for name in reversed(chosen):
            flags, settings = STRATEGY_OPTIONS[name]
            text = settings["help"].format(default=said.get(name, ""))
            wrapper = click.option(*flags, **{**settings, "help": text})(wrapper)
        return wrapper

    return decorate


strategy_options = strategy_options_for()
"""All the strategy options: for the commands that embed with a strategy of their own."""


wait_option = click.option(
    "--wait",
    type=click.FloatRange(min=0),
    default=0,
    help="Seconds to wait for another writer of the index to finish. Default: 0, fail at once.",
)


def json_option(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--json``, saying what the one JSON document holds."""
    return click.option("--json", "as_json", is_flag=True, help=f"Print JSON: {what}.")


batch_size_option = click.option(
    "--batch-size",
    default=32,
    show_default=True,
    type=click.IntRange(min=1),
    help="Texts per forward pass of the model (larger: more memory, rarely faster on a CPU).",
)
format_option = click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    help="Corpus format (default: from the file extension).",
)
index_kind_option = click.option(
    "--index-kind",
    type=click.Choice(KINDS),
    default="auto",
    show_default=True,
    help="Exact search, or IVF (approximate, tuned to recall@10 >= 0.97); auto: by size.",
)
storage_option = click.option(
    "--storage",
    type=click.Choice(STORAGES),
    default="float32",
    show_default=True,
    help="Vector storage: float16 halves the memory, sq8 quarters it (ranking nearly unchanged); pq "
    "keeps a 48-byte code a vector in memory (about 57 bytes resident with its id) and re-ranks from full "
    "vectors memory-mapped on disk (100M scale).",
)


encoding_option = click.option(
    "--encoding",
    default="utf-8",
    show_default=True,
    help="The text encoding of the files read (corpus, queries, labels, ids): cp1252, latin-1, utf-16, ...",
)


def reading_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--encoding`` and ``--delimiter``: how a corpus file's bytes are read
    (``indexer.reading.formats``)."""
    command = click.option(
        "--delimiter",
        help="A CSV file's field separator: , ; | or tab (default: told from its header).",
    )(command)
    return encoding_option(command)


def _note_delimiter(path: Path | str, fmt: str | None, delimiter: str | None, encoding: str) -> None:
    from indexer.reading.formats import delimiter_note

    if str(path) != "-" and (note := delimiter_note(Path(path), fmt, delimiter, encoding)):
        click.echo(note, err=True)


def output_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "-o",
        "--output",
        "index_dir",
        required=True,
        type=click.Path(path_type=Path),
        help="Index directory (replaced atomically when the new index is complete).",
    )(command)


def corpus_option(*, required: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option(
        "--corpus",
        required=required,
        type=click.Path(dir_okay=False, path_type=Path),
        help="Corpus to index (JSONL with id, text, ...; or CSV/TSV/text lines).",
    )


def judged_options(*, required: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--queries`` and ``--qrels``: questions and which entries answer them."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        command = click.option(
            "--qrels",
            required=required,
            type=click.Path(dir_okay=False, path_type=Path),
            help="Judgements: query_id, doc_id, relevance per line (TSV, header optional); doc_id is "
            "an entry id of the corpus.",
        )(command)
        return click.option(
            "--queries",
            "queries_file",
            required=required,
            type=click.Path(dir_okay=False, path_type=Path),
            help="Questions: JSONL, each with id and text.",
        )(command)

    return decorate


def ray_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--ray [ADDRESS]`` and ``--ray-workers N``: embed on Ray (``indexer.writing.distributed``)."""
    command = click.option(
        "--ray-workers",
        type=click.IntRange(min=1),
        help="Ray actors embedding at once (default: one per CPU of the Ray cluster).",
    )(command)
    return click.option(
        "--ray",
        "ray_address",
        is_flag=False,
        flag_value="local",
        metavar="[ADDRESS]",
        help="Embed on Ray (pip install 'semsearch[ray]'): alone, a local runtime on 127.0.0.1; "
        "with an address (auto, ray://HOST:10001), that cluster.",
    )(command)


def rule_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options of a calibrated "no answer" rule, shared by ``calibrate`` and its evaluation."""
    command = click.option(
        "--features",
        help="Confidence features among score, margin, zscore, gap, text (default: text, the cosine of "
        "an entry's own text, or text,gap where it wins on held-out threads of the labels).",
    )(command)
    command = click.option(
        "--unanswerable",
        type=float,
        help="Share of asked questions the index has no answer for, assumed by the promise (default 1/3).",
    )(command)
    command = click.option(
        "--guarantee",
        type=float,
        help="Probability that the precision promise holds (default 0.9).",
    )(command)
    return click.option(
        "--precision",
        default=0.95,
        show_default=True,
        type=float,
        help="Promised precision of answered hits.",
    )(command)


def device_options(default: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--device`` and ``--precision``: where the network runs (``indexer.encoders.devices``)."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        command = click.option(
            "--precision",
            type=click.Choice(("auto", "fp32", "fp16", "bf16")),
            default="auto",
            show_default=True,
            help="Network precision: auto is fp16 on a GPU, fp32 on the CPU.",
        )(command)
        return click.option(
            "--device",
            default=default,
            show_default=True,
            metavar="auto|cpu|cuda|cuda:N",
            help="Where the model runs: auto takes a GPU when torch sees one.",
        )(command)

    return decorate


def provider_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """Where an index's queries run: ONNX Runtime's execution provider (the vectors are the same)."""
    return click.option(
        "--provider",
        help="ONNX Runtime execution provider the queries run on, e.g. CUDAExecutionProvider "
        "(default: CPUExecutionProvider); the vectors are the same.",
    )(command)


def also_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--also``/``--also-weight``: a second vector per entry (``indexer.embedding.fields``), given to the
    command as ``also`` (a ``FieldScoring`` or None)."""

    @functools.wraps(command)
    def wrapper(also_fields: str | None, also_weight: float | None, **kwargs: Any) -> Any:
        from indexer.embedding.fields import FieldScoring

        return command(also=FieldScoring.asked(_split(also_fields or ""), also_weight), **kwargs)

    wrapper = click.option(
        "--also-weight",
        type=float,
        help=f"Share of the --also text's cosine in an entry's score. Default: {DEFAULT_WEIGHT}.",
    )(wrapper)
    return click.option(
        "--also",
        "also_fields",
        help="Embed these fields too, as a second vector per entry scored with the first: question,answer",
    )(wrapper)


def _split(text: str) -> list[str]:
    """A comma-separated option as a list: "question, answer" -> ["question", "answer"]."""
    return [part.strip() for part in text.split(",") if part.strip()]


def _strategy(asked: dict[str, Any]) -> Strategy:
    """The strategy the options ask for; a tuned model's saved strategy fills in the rest (said on stderr)."""
    from indexer.embedding.models import strategy_request

    strategy, said = strategy_request(asked)
    if said:
        click.echo(said, err=True)
    return strategy


def progress_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``-q/--quiet`` for a command that runs long, given to it as ``progress``: whether the
    library shows its bars (``indexer.progress``): on a terminal, unless ``--quiet``; never in a
    pipe. A new long command takes this decorator and passes ``progress`` on."""

    @functools.wraps(command)
    def wrapper(quiet: bool, **kwargs: Any) -> Any:
        return command(progress=not quiet and sys.stderr.isatty(), **kwargs)

    return click.option(
        "-q", "--quiet", is_flag=True, help="No progress bar (a pipe or a file never gets one)."
    )(wrapper)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="semsearch")
def cli() -> None:
    """Semantic search for answered questions and similar sentences."""


@cli.command("index")
@click.argument("corpus", type=click.Path(dir_okay=False, path_type=Path))
@output_option
@click.option(
    "--text-field",
    default="text",
    show_default=True,
    help="Field(s) to embed, comma-separated and joined: question,answer",
)
@click.option("--id-field", help="Field with the entry id (default: 'id' if present, else row number).")
@format_option
@reading_options
@click.option("--chunk", is_flag=True, help="Split long documents into overlapping windows.")
@click.option(
    "--chunk-overlap",
    type=click.IntRange(min=0),
    help=f"Tokens shared by neighbouring windows (implies --chunk; default {DEFAULT_CHUNK_OVERLAP}).",
)
@batch_size_option
@index_kind_option
@storage_option
@wait_option
@ray_options
@also_options
@strategy_options
@device_options("auto")
@progress_options
def index_command(
    corpus: Path,
    index_dir: Path,
    text_field: str,
    id_field: str | None,
    fmt: str | None,
    encoding: str,
    delimiter: str | None,
    chunk: bool,
    chunk_overlap: int | None,
    batch_size: int,
    index_kind: str,
    storage: str,
    wait: float,
    ray_address: str | None,
    ray_workers: int | None,
    also: Any,
    asked: dict[str, Any],
    device: str,
    precision: str,
    progress: bool,
) -> None:
    """Embed CORPUS (CSV, TSV, JSONL or text lines) into a FAISS + SQLite index."""
    from indexer.writing.build import build_index

    strategy = _strategy(asked)
    if chunk or chunk_overlap is not None:
        strategy = strategy.chunked(chunk_overlap)
    fields = _split(text_field)
    report = build_index(
        corpus,
        index_dir,
        strategy,
        text_fields=fields,
        id_field=id_field,
        fmt=fmt,
        encoding=encoding,
        delimiter=delimiter,
        batch_size=batch_size,
        progress=progress,
        index_kind=index_kind,
        storage=storage,
        wait=wait,
        ray=ray_address,
        ray_workers=ray_workers,
        also=also,
        device=device,
        precision=precision,
    )
    _note_delimiter(corpus, fmt, delimiter, encoding)
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
    _echo_rejections(report.rejected, report.rejection_summary)


def _echo_rejections(rejected: list[Any], summary: str) -> None:
    """Every unusable row is counted; the first ten are listed with their reasons."""
    if rejected:
        click.echo(f"rejected {len(rejected)} rows: {summary}", err=True)
        for rejection in rejected[:10]:
            click.echo(f"  row {rejection.row}: {rejection.reason}", err=True)
        if len(rejected) > 10:
            click.echo(f"  ... and {len(rejected) - 10} more", err=True)


def _echo_pair_rejections(rejected: Sequence[Any]) -> None:
    """A labels file's rows that gave no pair, as an index's rejected rows are printed."""
    from indexer.reading.corpus import rejection_summary

    _echo_rejections(list(rejected), rejection_summary(rejected))


def _count(number: int, noun: str) -> str:
    """``1 pair``, ``2 pairs``."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _short(value: Any, limit: int = 400) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _print_hits(
    query: str,
    hits: Sequence[Any],
    lead_field: str | None = None,
    hidden: Iterable[str] = (),
    group_by: str | None = None,
) -> None:
    """A ranked table: rank, score, id, then the lead text (e.g. the FAQ question) and other fields;
    grouped, how many more entries each hit's group holds."""
    indent = " " * 25
    width = max(40, shutil.get_terminal_size((100, 20)).columns - len(indent))
    click.echo(f"\nquery: {query}")
    if not hits:
        click.echo("no match")
        return
    if hits[0].answered is False:
        click.echo("no answer (the best hit is below the index's calibrated confidence or --min-score)")
    click.echo(f"{'rank':>4}  {'score':>6}  {'id':<10} text")
    for hit in hits:
        lead = hit.fields.get(lead_field) if lead_field else None
        lead = hit.text if lead in (None, "") else lead
        body = textwrap.wrap(_short(lead), width) or [""]
        click.echo(f"{hit.rank:>4}  {hit.score:6.3f}  {hit.id:<10} {body[0]}")
        if hit.answered is not None:
            sure = "" if hit.confidence is None else f" (confidence {hit.confidence:.2f})"
            click.echo(f"{indent}answered: {'yes' if hit.answered else 'no'}{sure}")
        for line in body[1:]:
            click.echo(indent + line)
        if hit.others:
            click.echo(f"{indent}+{hit.others} more in this {group_by}")
        for name, value in hit.fields.items():
            if name in hidden or name == lead_field or value in (None, ""):
                continue
            lines = textwrap.wrap(f"{name}: {_short(value)}", width, subsequent_indent="  ")
            for line in lines:
                click.echo(indent + line)


@cli.command("query")
@click.argument("index_dir", type=click.Path(path_type=Path))
@click.argument("question", required=False)
@click.option(
    "--queries", "queries_file", help="File of queries: JSONL with id and text, or plain lines ('-' = stdin)."
)
@click.option("-k", default=10, show_default=True, type=click.IntRange(min=1), help="Hits per query.")
@click.option("--where", help="Filter on stored fields before the search: \"category = 'billing'\".")
@click.option("--json", "as_json", is_flag=True, help="One JSON line per query.")
@click.option(
    "--min-score", type=float, help="Mark hits with a cosine below this not answered (over a calibration)."
)
@provider_option
@encoding_option
@click.option(
    "--group-by",
    metavar="FIELD",
    help="The best hit per value of this stored field, k of them, each with the count of the rest "
    "(one FAQ question with several answers shown once).",
)
@click.option(
    "--mode",
    type=click.Choice(["dense", "keyword", "hybrid"]),
    help="dense (vectors), keyword (BM25) or hybrid (both fused; docs/hybrid.md). Default: hybrid, "
    "or dense where the index has a calibrated rule, --min-score or no keyword table.",
)
def query_command(
    index_dir: Path,
    question: str | None,
    queries_file: str | None,
    k: int,
    where: str | None,
    as_json: bool,
    min_score: float | None,
    provider: str | None,
    encoding: str,
    group_by: str | None,
    mode: str | None,
) -> None:
    """Search INDEX_DIR for QUESTION (or for every query in --queries), with the strategy it was
    built with."""
    from search.engine import SearchEngine, check_queries, configure_threads
    from search.queries import Query, read_queries

    if (question is None) == (queries_file is None):
        raise click.UsageError("give a QUESTION or --queries FILE (one of them)")
    queries = read_queries(queries_file, encoding) if queries_file else [Query("1", question)]
    check_queries([q.text for q in queries])
    configure_threads()
    engine = SearchEngine(index_dir, provider=provider)
    results = engine.search_many([q.text for q in queries], k, where, min_score, group_by, mode)
    source = engine.index.meta.get("source", {})
    text_fields = source.get("text_fields") or []
    lead_field = text_fields[0] if text_fields else None
    hidden = {source.get("id_field") or "id"} | ({lead_field} if len(text_fields) == 1 else set())
    for query, hits in zip(queries, results, strict=True):
        if as_json:
            record = {"query_id": query.id, "query": query.text, "hits": [h.to_dict() for h in hits]}
            click.echo(json.dumps(record, ensure_ascii=False))
        else:
            _print_hits(query.text, hits, lead_field, hidden, group_by)


def _under_half(rule: Any) -> str | None:
    """What answers more than a promise that answers under half: a looser target, more labels."""
    from search.promise import HALF

    if rule.coverage >= HALF:
        return None
    looser = max(((t, c) for t, c in rule.costs if c >= HALF), default=None)
    more = (
        f"--precision {looser[0]:g} answers {looser[1]:.2f} with the same guarantee"
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


@cli.command("calibrate")
@click.argument("index_dir", type=click.Path(path_type=Path))
@judged_options(required=False)
@click.option(
    "--self", "from_corpus", is_flag=True, help="No labelled questions: make them from the index's own texts."
)
@click.option("--remove", is_flag=True, help="Remove the index's calibration (hits are no longer marked).")
@click.option(
    "--hybrid-weight",
    type=float,
    help="Store this keyword share (0..1) for hybrid search instead: the best weight `sweep retrieval` "
    "measures on your labels.",
)
@encoding_option
@rule_options
@json_option("the stored rule's threshold, precision, coverage and features")
@wait_option
@progress_options
def calibrate_command(
    index_dir: Path,
    queries_file: Path | None,
    qrels: Path | None,
    from_corpus: bool,
    remove: bool,
    hybrid_weight: float | None,
    encoding: str,
    precision: float,
    guarantee: float | None,
    unanswerable: float | None,
    features: str | None,
    as_json: bool,
    wait: float,
    progress: bool,
) -> None:
    """Fit and store the rule that marks hits answered, with its promise: precision >= --precision
    with --guarantee confidence. Each answerable question is also asked with its answers hidden,
    so labels that are all answerable still teach it to abstain; unjudged questions are
    unanswerable ones. With --self, the questions are the index's own texts with words dropped.
    With --hybrid-weight, store the keyword share hybrid search fuses with instead."""
    from search.calibration import calibrate_index, remove_calibration
    from search.evaluate import read_retrieval_set
    from search.hybrid import store_hybrid_weight

    if hybrid_weight is not None:
        if remove or from_corpus or queries_file or qrels:
            raise click.UsageError("--hybrid-weight takes no questions and no --remove")
        stored = store_hybrid_weight(index_dir, hybrid_weight, wait)
        click.echo(f"hybrid weight {stored:g} stored: hybrid fuses {1 - stored:g} dense + {stored:g} keyword")
        return
    if remove:
        if from_corpus or queries_file or qrels:
            raise click.UsageError("--remove takes no questions")
        removed = remove_calibration(index_dir, wait)
        click.echo("calibration removed" if removed else "not calibrated: nothing to remove")
        return
    if from_corpus == bool(queries_file or qrels) or not from_corpus and not (queries_file and qrels):
        raise click.UsageError("give --queries and --qrels (labelled questions), or --self")
    data = None if from_corpus else read_retrieval_set(queries_file, qrels, encoding)
    rule = calibrate_index(
        index_dir,
        data.queries if data else None,
        data.qrels if data else None,
        precision=precision,
        features=_split(features) if features else None,
        guarantee=guarantee,
        unanswerable=unanswerable,
        wait=wait,
        progress=progress,
    )
    if as_json:
        click.echo(json.dumps(rule.to_dict()))
        return
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
        click.echo(f"trade-off:  coverage at each precision target, same guarantee: {costs}")
    advice = _under_half(rule)
    if advice:
        click.echo(f"under half: {advice}")
    click.echo(f"measured:   on {rule.measured_on}")
    click.echo(f"rule:       {','.join(rule.features)}, threshold {rule.threshold:.4f}")
    if rule.why:
        click.echo(f"chosen:     {rule.why}")


@cli.command("duplicates")
@click.argument("index_dir", type=click.Path(path_type=Path))
@click.option("--min-score", default=0.9, show_default=True, type=float, help="Cosine of a duplicate pair.")
@click.option("--limit", type=click.IntRange(min=0), help="List at most this many pairs (best first).")
@click.option("--exact", is_flag=True, help="Compare every pair, also past 30k vectors (slower).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: pairs and groups.")
@progress_options
def duplicates_command(
    index_dir: Path, min_score: float, limit: int | None, exact: bool, as_json: bool, progress: bool
) -> None:
    """Pairs of entries at least MIN_SCORE alike, and the groups they form."""
    from indexer.store import open_index
    from search.duplicates import find_duplicates

    found = find_duplicates(
        open_index(index_dir), min_score, limit, exact=exact or None, progress=progress
    )
    if as_json:
        click.echo(json.dumps(found.to_dict(), ensure_ascii=False))
        return
    pairs, groups = _count(found.total, "pair"), _count(len(found.groups), "group")
    click.echo(f"{pairs} in {groups} at cosine >= {found.min_score}")
    for number, group in enumerate(found.groups, 1):
        click.echo(f"group {number}: {' '.join(group)}")
    for a, b, score in found.pairs:
        click.echo(f"{score:6.3f}  {a}  {_short(found.texts.get(a, ''), 60)}")
        click.echo(f"{'':6}  {b}  {_short(found.texts.get(b, ''), 60)}")
    if found.truncated:
        click.echo(f"... {_count(found.total - len(found.pairs), 'more pair')} (--limit)")


@cli.command("add")
@click.argument("index_dir", type=click.Path(path_type=Path))
@click.argument("corpus", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--text-field", help="Field(s) to embed (default: the ones the index was built with).")
@click.option(
    "--id-field",
    help="Field with the entry id to upsert by (default: the index's own; an index built on row "
    "numbers appends the rows with new ids).",
)
@format_option
@reading_options
@batch_size_option
@wait_option
@ray_options
@device_options("auto")
@progress_options
def add_command(
    index_dir: Path,
    corpus: Path,
    text_field: str | None,
    id_field: str | None,
    fmt: str | None,
    encoding: str,
    delimiter: str | None,
    batch_size: int,
    wait: float,
    ray_address: str | None,
    ray_workers: int | None,
    device: str,
    precision: str,
    progress: bool,
) -> None:
    """Upsert CORPUS into INDEX_DIR by id: new and changed texts are embedded, unchanged ones skipped."""
    from indexer.writing.update import add_to_index

    fields = _split(text_field) if text_field else None
    report = add_to_index(
        index_dir,
        corpus,
        text_fields=fields,
        id_field=id_field,
        fmt=fmt,
        encoding=encoding,
        delimiter=delimiter,
        batch_size=batch_size,
        progress=progress,
        wait=wait,
        ray=ray_address,
        ray_workers=ray_workers,
        device=device,
        precision=precision,
    )
    _note_delimiter(corpus, fmt, delimiter, encoding)
    click.echo(
        f"added {report.added}, updated {report.updated}, unchanged {report.unchanged}, "
        f"rejected {len(report.rejected)}: {report.count} entries in {index_dir} ({report.seconds:.1f}s)",
        err=True,
    )
    _echo_rejections(report.rejected, report.rejection_summary)


@cli.command("delete")
@click.argument("index_dir", type=click.Path(path_type=Path))
@click.option("--id", "ids", multiple=True, help="External id to delete (repeatable).")
@click.option("--ids-file", help="File of ids, one per line ('-' = stdin).")
@encoding_option
@wait_option
def delete_command(
    index_dir: Path, ids: tuple[str, ...], ids_file: str | None, encoding: str, wait: float
) -> None:
    """Delete entries by id from INDEX_DIR (rows and vectors)."""
    from indexer.writing.update import delete_from_index, read_ids

    listed = read_ids(ids_file, encoding) if ids_file else []
    report = delete_from_index(index_dir, [*ids, *listed], wait=wait)
    click.echo(f"deleted {report.deleted}: {report.count} entries left in {index_dir}", err=True)
    if report.not_found:
        shown = ", ".join(report.not_found[:10]) + (" ..." if len(report.not_found) > 10 else "")
        click.echo(f"not found ({len(report.not_found)}): {shown}", err=True)


@cli.command("compact")
@click.argument("index_dir", type=click.Path(path_type=Path))
@wait_option
def compact_command(index_dir: Path, wait: float) -> None:
    """Merge INDEX_DIR's segments, drop its tombstones and vacuum its database after many updates
    (a new complete version)."""
    from indexer.writing.update import compact_index

    click.echo(f"compacted {index_dir}: {compact_index(index_dir, wait=wait)} bytes", err=True)


@cli.command("merge")
@click.argument("shards", nargs=-1, required=True, type=click.Path(file_okay=False, path_type=Path))
@output_option
@index_kind_option
@storage_option
def merge_command(shards: tuple[Path, ...], index_dir: Path, index_kind: str, storage: str) -> None:
    """Merge shard directories written by workers (indexer.writing.shards.embed_shard) into one index."""
    from indexer.writing.shards import merge_shards

    count = merge_shards(list(shards), index_dir, index_kind=index_kind, storage=storage)
    click.echo(f"merged {len(shards)} shards: {count} entries in {index_dir}", err=True)


@cli.command("export-encoder")
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
    tokenizer.json and a README of inputs and outputs."""
    from indexer.writing.export import export_encoder

    done = export_encoder(index_dir, target)
    click.echo(
        f"exported the encoder of {index_dir} to {done.directory}: {', '.join(done.inputs)} -> "
        f"sentence_embedding [batch, {done.dimension}] ({done.size_bytes / 1e6:.1f} MB)",
        err=True,
    )


@cli.command("serve")
@click.argument("index_dir", required=False, type=click.Path(path_type=Path))
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Interface to bind (127.0.0.1: this machine only)."
)
@click.option(
    "--port", default=8000, show_default=True, type=click.IntRange(1, 65535), help="TCP port to listen on."
)
@click.option(
    "--max-batch",
    default=64,
    show_default=True,
    type=click.IntRange(1, 256),
    help="Most queries embedded in one micro-batch (1 turns batching off).",
)
@click.option(
    "--request-timeout",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds a client has to send a whole request (from connecting or its previous answer).",
)
@click.option(
    "--keep-alive",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds an idle connection is kept open after an answer.",
)
@click.option(
    "--max-connections",
    default=256,
    show_default=True,
    type=click.IntRange(min=1),
    help="Open connections at most; past that a new one gets a 503.",
)
@click.option("-q", "--quiet", is_flag=True, help="No access log (by default a line a request on stderr).")
@provider_option
@device_options("cpu")
@strategy_options
def serve_command(
    index_dir: Path | None,
    host: str,
    port: int,
    max_batch: int,
    request_timeout: float,
    keep_alive: float,
    max_connections: int,
    quiet: bool,
    provider: str | None,
    device: str,
    precision: str,
    asked: dict[str, Any],
) -> None:
    """Serve INDEX_DIR over HTTP: a search page at /; POST /search, /search/batch, /similar,
    /v1/embeddings (OpenAI's shape), /encode, /reload (pick up a new version now); GET /duplicates,
    /info, /fields, /health; API docs at /docs. New versions written by index, add or delete are
    picked up within a second. With no INDEX_DIR and --model (or other strategy options): vectors
    alone (/v1/embeddings, /encode, /info). Each request is a line on stderr (client, method,
    path, status, milliseconds) unless --quiet."""
    from indexer.encoders.devices import placement
    from search.loading import load_encoding, load_engine

    if index_dir is not None and asked:
        raise click.UsageError("an index is served with its stored strategy: drop the strategy options")
    if index_dir is None and not asked:
        raise click.UsageError(
            "give INDEX_DIR to search it, or --model (and strategy options) to serve vectors"
        )
    # the engine (or encoder) imports and loads while the web stack imports
    placement(device, precision)  # a GPU asked for and missing: said before the server starts
    loading = load_engine(index_dir, provider, device, precision) if index_dir is not None else None
    encoding = load_encoding(_strategy(asked), device, precision) if index_dir is None else None
    try:
        from search.server import create_app, listen, serve
    except ImportError:
        raise BadInput("serving needs the 'serve' extra: pip install 'semsearch[serve]'") from None
    listening = listen(host, port)  # a port in use is told at once, not after the index loads
    app = create_app(index_dir, max_batch=max_batch, loading=loading, encoding=encoding)
    if index_dir is None:
        served = encoding.result().strategy.describe()
        click.echo(
            f"serving vectors of {served} on http://{host}:{port}/v1/embeddings (docs: /docs)", err=True
        )
    else:
        click.echo(f"serving {index_dir}: search page on http://{host}:{port}/ (API docs: /docs)", err=True)
    serve(
        app,
        listening,
        request_timeout=request_timeout,
        keep_alive=keep_alive,
        max_connections=max_connections,
        access_log=not quiet,
    )


@cli.command("similar")
@click.argument("sentence")
@click.argument("file", default="-")
@click.option("-k", type=click.IntRange(min=1), help="Show the top K (default: all).")
@click.option("--json", "as_json", is_flag=True, help="One JSON line with the ranked sentences.")
@encoding_option
@click.option(
    "--index",
    "index_dir",
    type=click.Path(path_type=Path),
    help="Embed as this index's entries were: its strategy and fitted post-processing (centering, "
    "whitening); the strategy options must then match it.",
)
@strategy_options_for(
    "model",
    "layers",
    "combine",
    "pooling",
    "skip_special",
    "max_length",
    "backend",
    *PREFIXES,
)
def similar_command(
    sentence: str,
    file: str,
    k: int | None,
    as_json: bool,
    encoding: str,
    index_dir: Path | None,
    asked: dict[str, Any],
) -> None:
    """Rank the lines of FILE (default: stdin) by similarity to SENTENCE; no index needed."""
    from search.queries import read_lines
    from search.similar import rank_similar, rank_similar_with_index

    lines = read_lines(file, encoding)
    if index_dir is not None:
        hits = rank_similar_with_index(index_dir, sentence, lines, k=k, strategy=asked)
    else:
        hits = rank_similar(sentence, lines, _strategy(asked), k=k)
    if as_json:
        click.echo(json.dumps({"query": sentence, "hits": [h.to_dict() for h in hits]}, ensure_ascii=False))
    else:
        _print_hits(sentence, hits)


@cli.command("encode")
@click.argument("source", default="-")
@click.option(
    "-o",
    "--output",
    help="File to write: FILE.npy (float32, row i = text i) or FILE.jsonl; default: JSON lines on stdout.",
)
@click.option(
    "--to", type=click.Choice(("npy", "jsonl")), help="Output format (default: from the -o extension)."
)
@click.option(
    "--text-field", default="text", show_default=True, help="Field(s) of a CSV/JSONL row to encode, joined."
)
@click.option(
    "--id-field", help="Field giving each row's id in JSON lines output (default: id, else row number)."
)
@click.option(
    "--format", "fmt", type=click.Choice(FORMATS), help="Input format (default: from the extension)."
)
@click.option(
    "--index",
    "index_dir",
    type=click.Path(path_type=Path),
    help="Encode as this index does (its strategy and fitted post-processing): the vectors it compares.",
)
@click.option(
    "--as",
    "as_",
    type=click.Choice(ROLES),
    default="query",
    show_default=True,
    help="Encode the texts as queries or as passages (entries): each gets its prefix.",
)
@reading_options
@progress_options
@device_options("auto")
@strategy_options
def encode_command(
    source: str,
    output: str | None,
    to: str | None,
    text_field: str,
    id_field: str | None,
    fmt: str | None,
    index_dir: Path | None,
    as_: str,
    encoding: str,
    delimiter: str | None,
    progress: bool,
    device: str,
    precision: str,
    asked: dict[str, Any],
) -> None:
    """Vectors of the texts of SOURCE (lines, CSV/TSV or JSONL with --text-field; default: stdin
    lines), in input order, to a .npy matrix or JSON lines {"id", "vector"}."""
    from search.encoding import Encoding, encode_file, output_format

    if index_dir is not None and asked:
        raise click.UsageError("--index encodes with its stored strategy: drop the strategy options")
    output_format(output, to)  # a bad output is told before the model loads
    strategy = None if index_dir is not None else _strategy(asked)
    model = Encoding.load(strategy, index=index_dir, device=device, precision=precision)
    report = encode_file(
        source,
        output,
        model,
        to=to,
        text_fields=_split(text_field),
        id_field=id_field,
        fmt=fmt,
        source_encoding=encoding,
        delimiter=delimiter,
        progress=progress,
        as_=as_,
    )
    _note_delimiter(source, fmt, delimiter, encoding)
    click.echo(
        f"encoded {report.texts} texts (dim {report.dimension}) into {report.output} "
        f"in {report.seconds:.1f}s",
        err=True,
    )
    click.echo(f"strategy: {report.strategy.describe()}", err=True)


@cli.command("info")
@click.argument("index_dir", type=click.Path(path_type=Path))
@json_option("one object with every fact, the unset ones as null")
@click.option(
    "--check",
    is_flag=True,
    help="Also verify every file against the checksum written at commit (reads the whole index); "
    "damage: exit 5 naming the file.",
)
def info_command(index_dir: Path, as_json: bool, check: bool) -> None:
    """Strategy, model, size and source of an index."""
    from indexer.store import open_index, verify

    checked = verify(index_dir) if check else None
    info = open_index(index_dir, vectors=False).info()  # meta and SQLite: no FAISS, no vectors
    if checked is not None:
        info["check"] = f"ok, {checked} files checked"
    if as_json:
        click.echo(json.dumps(info, ensure_ascii=False))
        return
    shown = {
        **info,
        "strategy": info["description"],
        "index_kind": f"{info['index_kind']}, {info['storage']}"
        + (f", nprobe {info['nprobe']}" if "nprobe" in info else ""),
        "text_fields": ",".join(info["text_fields"]),
        "fields": ", ".join(f"{name} ({kind})" for name, kind in info["fields"].items()),
        "also": info["also"] and f"{','.join(info['also']['fields'])} (weight {info['also']['weight']:g})",
    }
    if not info["also"]:
        shown.pop("also")
    if info["embedded"]:  # where and at what precision the vectors were made (older indexes: unknown)
        shown["embedded"] = f"{info['embedded']['device']}, {info['embedded']['precision']}"
    from search.confidence import Rule

    shown["calibration"] = Rule.from_dict(info["calibration"]).describe() if info["calibration"] else "none"
    shown["keywords"] = (
        "FTS5 (BM25): --mode keyword and hybrid"
        if info["keywords"]
        else "none (written before keyword search): its next version (add, delete or compact) keeps them"
    )
    if info["keywords"]:
        from search.hybrid import DEFAULT_WEIGHT, IDENTIFIER_WEIGHT

        weight = info["hybrid_weight"]
        shown["hybrid_weight"] = (
            f"{DEFAULT_WEIGHT if weight is None else weight:g} ({'default' if weight is None else 'stored'}; "
            f"at least {IDENTIFIER_WEIGHT:g} for a query holding a code)"
        )
    for key in ("description", "storage", "nprobe"):
        shown.pop(key, None)
    for key, value in shown.items():
        if value is not None:  # an unset fact (never updated, no calibration) is left out
            click.echo(f"{key + ':':<12} {value}")


def _echo_scores(scores: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(scores))
        return
    for key, value in scores.items():
        if isinstance(value, float):
            value = f"{value:.4f}" if abs(value) <= 1 else f"{value:.2f}"
        click.echo(f"{key + ':':<11} {value}")


def pair_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(
        [
            click.argument("pairs", type=click.Path(dir_okay=False, path_type=Path)),
            click.option(
                "--sentence1", default="sentence1", show_default=True, help="Column of the first sentence."
            ),
            click.option(
                "--sentence2", default="sentence2", show_default=True, help="Column of the second sentence."
            ),
            click.option("--score", default="score", show_default=True, help="Column of the gold score."),
            encoding_option,
        ]
    ):
        command = option(command)
    return command


def retrieval_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(
        [
            corpus_option(required=False),
            judged_options(required=True),
            click.option("--text-field", default="text", show_default=True, help="Corpus field(s) to embed."),
            click.option(
                "-k", default=10, show_default=True, type=click.IntRange(min=1), help="Metric cutoff."
            ),
            encoding_option,
        ]
    ):
        command = option(command)
    return command


@cli.group("evaluate")
def evaluate_group() -> None:
    """Score one strategy on sentence pairs (sts) or on queries with judgements (retrieval)."""


@evaluate_group.command("sts")
@pair_options
@json_option("the scores and the strategy")
@strategy_options
@device_options("auto")
@progress_options
def evaluate_sts_command(
    pairs: Path,
    sentence1: str,
    sentence2: str,
    score: str,
    encoding: str,
    as_json: bool,
    asked: dict[str, Any],
    device: str,
    precision: str,
    progress: bool,
) -> None:
    """Spearman and Pearson (x100) of cosine vs gold score on PAIRS (STS Benchmark format accepted)."""
    from search.evaluate import evaluate_sts, read_pairs

    data = read_pairs(pairs, sentence1, sentence2, score, encoding=encoding)
    _echo_pair_rejections(data.rejected)
    scores = evaluate_sts(data, _strategy(asked), progress=progress, device=device, precision=precision)
    _echo_scores(scores, as_json)


@evaluate_group.command("retrieval")
@retrieval_options
@click.option(
    "--index", "index_dir", type=click.Path(path_type=Path), help="Use this index instead of building one."
)
@json_option("the metrics and the strategy")
@also_options
@strategy_options
@device_options("auto")
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
    also: Any,
    asked: dict[str, Any],
    device: str,
    precision: str,
    progress: bool,
) -> None:
    """MRR@k, nDCG@k, Recall@1/@k and Success@1/@3 of the queries against the qrels."""
    from search.evaluate import evaluate_retrieval, read_retrieval_set

    if (corpus is None) == (index_dir is None):
        raise click.UsageError("give --corpus (to build an index) or --index (one of them)")
    if index_dir is not None and (asked or also):
        raise click.UsageError("--index is queried with its stored strategy: drop the strategy options")
    data = read_retrieval_set(queries_file, qrels, encoding)
    fields = _split(text_field)
    scores = evaluate_retrieval(
        data,
        index_dir=index_dir,
        corpus=corpus,
        strategy=_strategy(asked),
        text_fields=fields,
        k=k,
        also=also,
        progress=progress,
        device=device,
        precision=precision,
        encoding=encoding,
    )
    _echo_scores(scores, as_json)


@evaluate_group.command("abstention")
@corpus_option(required=True)
@judged_options(required=True)
@click.option("--text-field", default="text", show_default=True, help="Corpus field(s) to embed.")
@click.option(
    "--holdout", default=0.33, show_default=True, type=float, help="Share of the test threads removed."
)
@click.option(
    "--seeds", default=20, show_default=True, type=click.IntRange(min=1), help="Splits tried, one per seed."
)
@click.option("--seed", default=0, show_default=True, type=int, help="The first seed.")
@rule_options
@json_option("the scores of each rule")
@also_options
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
    as_json: bool,
    also: Any,
    asked: dict[str, Any],
    encoding: str,
    progress: bool,
) -> None:
    """How often the promise held on threads the rule never saw, over many splits: half the
    threads calibrate (answerable labels only), the other half test, with --holdout of them
    removed from the index. The learned rule (--features, default text,gap), the plain cosine
    threshold, and the default (the one calibrate picks on each calibration half)."""
    from search.abstention import evaluate_abstention
    from search.evaluate import read_retrieval_set

    report = evaluate_abstention(
        corpus,
        read_retrieval_set(queries_file, qrels, encoding=encoding),
        holdout=holdout,
        seeds=range(seed, seed + seeds),
        precision=precision,
        guarantee=guarantee,
        unanswerable=unanswerable,
        features=_split(features) if features else None,
        strategy=_strategy(asked),
        text_fields=_split(text_field),
        also=also,
        progress=progress,
        encoding=encoding,
    )
    if as_json:
        click.echo(json.dumps(report))
        return
    runs = report.pop("per seed")
    _echo_scores(report, False)
    click.echo("seed  rule precision  coverage  plain precision  coverage  default precision  coverage")
    for run in runs:
        rule, plain, chosen = run["rule"], run["plain"], run["default"]
        click.echo(
            f"{run['seed']:>4}  {rule['precision']:>14.3f}  {rule['coverage']:>8.3f}"
            f"  {plain['precision']:>15.3f}  {plain['coverage']:>8.3f}"
            f"  {chosen['precision']:>17.3f}  {chosen['coverage']:>8.3f}"
        )


def sweep_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(
        [
            click.option(
                "--model", help="Hugging Face name or local path (default: bundled all-MiniLM-L6-v2)."
            ),
            click.option(
                "--max-length", type=click.IntRange(min=4), help="Tokens per text (default: model limit)."
            ),
            click.option("--skip-special", is_flag=True, help="Leave [CLS]/[SEP] out of mean/max pooling."),
            click.option(
                "--poolings", default=",".join(POOLINGS), show_default=True, help="Poolings to try."
            ),
            click.option(
                "--postprocess",
                "postprocesses",
                default="none",
                show_default=True,
                help="Post-processings to try, e.g. none,center,whiten.",
            ),
            click.option("--whiten-dims", type=click.IntRange(min=1), help="Dimensions kept by whitening."),
            *(click.option(*STRATEGY_OPTIONS[name][0], **STRATEGY_OPTIONS[name][1]) for name in PREFIXES),
            click.option(
                "--csv", "csv_path", type=click.Path(dir_okay=False, path_type=Path), help="Write all cells."
            ),
            click.option(
                "--heatmap",
                type=click.Path(dir_okay=False, path_type=Path),
                help="Write a PNG heatmap (needs matplotlib: pip install 'semsearch[plot]').",
            ),
            click.option("--top", default=15, show_default=True, help="Rows of the printed table."),
        ]
    ):
        command = option(command)
    return command


def _plan(
    model: str | None,
    max_length: int | None,
    skip_special: bool,
    poolings: str,
    postprocesses: str,
    whiten_dims: int | None,
    query_prefix: str | None,
    passage_prefix: str | None,
) -> Any:
    """The sweep grid, checked by the library before any model loads."""
    from search.sweep import plan_sweep

    return plan_sweep(
        model=model,
        max_length=max_length,
        skip_special=skip_special,
        poolings=_split(poolings),
        postprocesses=_split(postprocesses),
        whiten_dims=whiten_dims,
        query_prefix=query_prefix or "",
        passage_prefix=passage_prefix or "",
    )


def _report_sweep(
    cells: list[Any],
    metric: str,
    csv_path: Path | None,
    heatmap: Path | None,
    top: int,
    title: str,
    reproduce_prefix: str,
) -> None:
    from search.sweep import reproduce, write_csv, write_heatmap

    metrics = [m for m in cells[0].scores if m not in ("pairs", "queries")]
    click.echo(f"{'#':>3}  {'layers':<26} {'pooling':<9} {'post':<7} " + " ".join(f"{m:>9}" for m in metrics))
    for rank, cell in enumerate(cells[:top], 1):
        values = " ".join(
            f"{cell.scores[m]:9.3f}" if cell.scores[m] < 2 else f"{cell.scores[m]:9.2f}" for m in metrics
        )
        click.echo(
            f"{rank:>3}  {cell.row:<26} {cell.strategy.pooling:<9} {cell.strategy.postprocess:<7} {values}"
        )
    best = cells[0]
    click.echo(
        f"\nbest by {metric}: {best.row}, {best.strategy.pooling}, {best.strategy.postprocess}: "
        f"{best.scores[metric]:.3f}"
    )
    click.echo(f"reproduce: {reproduce_prefix} {reproduce(best.strategy)}")
    if csv_path:
        write_csv(cells, csv_path)
        click.echo(f"wrote {csv_path}", err=True)
    if heatmap:
        try:
            write_heatmap(cells, metric, heatmap, title)
            click.echo(f"wrote {heatmap}", err=True)
        except ImportError:
            click.echo("no heatmap: matplotlib is not installed (pip install 'semsearch[plot]')", err=True)


@cli.group("sweep")
def sweep_group() -> None:
    """Score a grid of layer x pooling strategies from one forward pass per text."""


@sweep_group.command("sts")
@pair_options
@sweep_options
@device_options("auto")
@progress_options
def sweep_sts_command(
    pairs: Path,
    sentence1: str,
    sentence2: str,
    score: str,
    encoding: str,
    model: str | None,
    max_length: int | None,
    skip_special: bool,
    poolings: str,
    postprocesses: str,
    whiten_dims: int | None,
    query_prefix: str | None,
    passage_prefix: str | None,
    csv_path: Path | None,
    heatmap: Path | None,
    top: int,
    device: str,
    precision: str,
    progress: bool,
) -> None:
    """Every strategy of the grid on sentence pairs, ranked by Spearman."""
    from search.evaluate import read_pairs
    from search.sweep import sweep_sts

    plan = _plan(
        model, max_length, skip_special, poolings, postprocesses, whiten_dims, query_prefix, passage_prefix
    )
    data = read_pairs(pairs, sentence1, sentence2, score, encoding=encoding)
    _echo_pair_rejections(data.rejected)
    cells = sweep_sts(
        data,
        plan.base,
        poolings=plan.poolings,
        postprocesses=plan.postprocesses,
        progress=progress,
        device=device,
        precision=precision,
    )
    _report_sweep(cells, "spearman", csv_path, heatmap, top, pairs.name, "semsearch index CORPUS -o INDEX")


@sweep_group.command("retrieval")
@retrieval_options
@click.option(
    "--metric", help="Metric to rank by: mrr@K (default), ndcg@K, recall@1, recall@K, success@1, success@3."
)
@sweep_options
@device_options("auto")
@progress_options
def sweep_retrieval_command(
    corpus: Path | None,
    queries_file: Path,
    qrels: Path,
    text_field: str,
    k: int,
    encoding: str,
    metric: str | None,
    model: str | None,
    max_length: int | None,
    skip_special: bool,
    poolings: str,
    postprocesses: str,
    whiten_dims: int | None,
    query_prefix: str | None,
    passage_prefix: str | None,
    csv_path: Path | None,
    heatmap: Path | None,
    top: int,
    device: str,
    precision: str,
    progress: bool,
) -> None:
    """Every strategy of the grid on a retrieval set, ranked by --metric."""
    from search.evaluate import read_retrieval_set
    from search.sweep import retrieval_sweep

    if corpus is None:
        raise click.UsageError("give --corpus")
    plan = _plan(
        model, max_length, skip_special, poolings, postprocesses, whiten_dims, query_prefix, passage_prefix
    )
    data = read_retrieval_set(queries_file, qrels, encoding)
    fields = _split(text_field)
    metric = metric or f"mrr@{k}"
    sweep = retrieval_sweep(
        data,
        corpus,
        plan.base,
        text_fields=fields,
        poolings=plan.poolings,
        postprocesses=plan.postprocesses,
        progress=progress,
        k=k,
        metric=metric,
        device=device,
        precision=precision,
        encoding=encoding,
    )
    _report_sweep(
        sweep.cells,
        metric,
        csv_path,
        heatmap,
        top,
        corpus.name,
        f"semsearch index {corpus} -o INDEX --text-field {text_field}",
    )
    _report_modes(sweep.modes, metric)


def _report_modes(modes: Any, metric: str) -> None:
    """The best cell searched dense, by keywords and hybrid at each keyword share, and the best share."""
    metrics = [m for m in modes.cell.scores if m != "queries"]
    click.echo("\nthe best cell in every mode (query --mode; docs/hybrid.md):")
    click.echo(f"{'mode':<12} " + " ".join(f"{m:>9}" for m in metrics))
    rows = {"dense": modes.cell.scores, "keyword": modes.keyword}
    rows.update({f"hybrid {weight:g}": scores for weight, scores in modes.hybrid.items()})
    for name, scores in rows.items():
        click.echo(f"{name:<12} " + " ".join(f"{scores[m]:9.3f}" for m in metrics))
    best = modes.best_weight(metric)
    click.echo(
        f"\nbest keyword weight by {metric}: {best:g} (hybrid {modes.hybrid[best][metric]:.3f}, "
        f"dense {modes.cell.scores[metric]:.3f})"
    )
    click.echo(f"store it: semsearch calibrate INDEX --hybrid-weight {best:g}")


@cli.command("tune")
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
@click.option("--sentence1", default="sentence1", show_default=True, help="Column of the first sentence.")
@click.option("--sentence2", default="sentence2", show_default=True, help="Column of the second sentence.")
@click.option("--score", default="score", show_default=True, help="Column of the gold score.")
@click.option(
    "--queries", "queries_file", type=click.Path(dir_okay=False, path_type=Path), help="Queries (JSONL)."
)
@click.option("--qrels", type=click.Path(dir_okay=False, path_type=Path), help="Judgements of the queries.")
@click.option(
    "--corpus",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Corpus the judgements name; alone with --also: an FAQ without labels.",
)
@click.option("--text-field", default="text", show_default=True, help="Corpus field(s) of an entry's text.")
@click.option("--also", "also_fields", help="FAQ without labels: the field(s) each entry's text should find.")
@click.option(
    "--index",
    "index_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Train through this index's strategy (its model, layers, pooling...).",
)
@click.option(
    "--held-back",
    default=0.1,
    show_default=True,
    type=float,
    help="Share of the labels measured, never trained.",
)
@click.option(
    "--epochs", default=4, show_default=True, type=click.IntRange(min=1), help="Passes over the labels."
)
@click.option(
    "--max-minutes", type=click.FloatRange(min=0, min_open=True), help="Stop training after this long."
)
@click.option(
    "--seed", default=0, show_default=True, type=int, help="Seed of the held-back share and the batches."
)
@click.option(
    "--batch-size", default=16, show_default=True, type=click.IntRange(min=2), help="Pairs per training step."
)
@click.option(
    "--learning-rate", default=2e-5, show_default=True, type=float, help="Peak learning rate (AdamW)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@encoding_option
@progress_options
@device_options("auto")
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
    also_fields: str | None,
    index_dir: Path | None,
    held_back: float,
    epochs: int,
    max_minutes: float | None,
    seed: int,
    batch_size: int,
    learning_rate: float,
    as_json: bool,
    device: str,
    precision: str,
    encoding: str,
    asked: dict[str, Any],
    progress: bool,
) -> None:
    """Fine-tune the model (default: the index's) on your labels through the index's strategy,
    holding a share back to measure; then index and query with --model OUTPUT."""
    from indexer.embedding.fields import FieldScoring
    from search.tuning import index_strategy, read_labels, tune

    if index_dir is not None and asked:
        raise click.UsageError("--index trains through the index's strategy: drop the strategy options")
    labels = read_labels(
        pairs=pairs,
        columns=(sentence1, sentence2, score),
        queries=queries_file,
        qrels=qrels,
        corpus=corpus,
        text_fields=_split(text_field),
        also=FieldScoring.asked(_split(also_fields or "")),
        encoding=encoding,
    )
    _echo_pair_rejections(labels.rejected)
    done = tune(
        labels,
        output,
        index_strategy(index_dir) if index_dir is not None else _strategy(asked),
        held_back=held_back,
        epochs=epochs,
        max_minutes=max_minutes,
        seed=seed,
        batch_size=batch_size,
        learning_rate=learning_rate,
        progress=progress,
        report=lambda line: click.echo(line, err=True),
        device=device,
        precision=precision,
    )
    if as_json:
        click.echo(json.dumps(done.to_dict()))
        return
    click.echo(
        f"held-back {done.metric} x100 on {done.held_back_pairs} {done.kind}: "
        f"{done.before:.2f} before, {done.after:.2f} after ({done.stopped}; best at step {done.best_step} "
        f"of {done.steps}, {done.epochs:.2f} epochs, {done.minutes:.1f} min)"
    )
    click.echo(
        f"saved {done.output}: semsearch index CORPUS -o INDEX {done.options or '--model ' + done.output}"
    )


@cli.command("words")
@click.argument("text")
@click.option("--word", help="Show every occurrence of this word and their cosine matrix.")
@click.option(
    "--merge",
    type=click.Choice(["mean", "sum", "first", "last"]),
    default="mean",
    show_default=True,
    help="How word pieces merge into a word vector.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object: the words and their cosines.")
@strategy_options_for("model", "layers", "combine", "max_length", layers="-4,-3,-2,-1", combine="sum")
def words_command(text: str, word: str | None, merge: str, as_json: bool, asked: dict[str, Any]) -> None:
    """Contextual word vectors of TEXT, read from the model's hidden states (on torch)."""
    from dataclasses import replace

    from indexer.embedding.words import WORD_STRATEGY, context, cosine_matrix, word_vectors
    from indexer.encoders.torch_encoder import TorchEncoder

    embedder = TorchEncoder(replace(WORD_STRATEGY, **asked))
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


def main() -> None:
    from indexer.writing.outputs import stop_on_sigterm

    stop_on_sigterm()  # a stopped run cleans up as after an error: no half-written output
    cli(prog_name="semsearch")


if __name__ == "__main__":
    main()
