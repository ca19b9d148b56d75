"""Every option the commands share, declared once with its help: a command takes the decorator,
never a ``click.option`` of its own for a flag another command has."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from indexer.embedding.strategy import (
    ALSO_WEIGHT,
    AUTO,
    BACKENDS,
    COMBINES,
    POOLINGS,
    POSTPROCESSES,
    Strategy,
)
from indexer.reading.formats import FORMATS
from indexer.reading.tsv import QUOTING, QUOTINGS
from indexer.vectors.factory import KIND, KINDS, STORAGE, STORAGES
from search.read.hybrid import MODES

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def stacked(*options: Decorator) -> Decorator:
    """The options as one decorator, shown in the order given."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def split(text: str) -> list[str]:
    """A comma-separated option as a list: "question, answer" -> ["question", "answer"]."""
    return [part.strip() for part in text.split(",") if part.strip()]


def _check_fields(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A comma-separated list of field names given with none in it is a mistake, not the default."""
    if value is not None and not split(value):
        raise click.BadParameter("name at least one field: text, or question,answer")
    return value


class _Finite(click.types.FloatParamType):
    """A float that is a number: ``nan`` and ``inf`` are no score or threshold."""

    name = "finite number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class FiniteRange(click.FloatRange):
    """A ``FloatRange`` whose value is a number: ``nan`` passes no bound's check, ``inf`` an open end."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


FINITE = _Finite()
SHARE = FiniteRange(0, 1, min_open=True, max_open=True)
"""A share, a probability or a learning rate: strictly between 0 and 1."""
WEIGHT = FiniteRange(0, 1)
"""A fused or hybrid weight: 0 and 1 included (one side alone)."""
HITS = click.IntRange(min=1, max=2**63 - 1)
"""``-k``: at least one hit, at most what a search can return (``search.read.requests.MOST_HITS``,
not imported here: it loads NumPy, which ``--help`` need not; a test holds the two equal)."""


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
    "dimensions": (
        ("--dimensions",),
        {
            "type": click.IntRange(min=1),
            "metavar": "N",
            "help": "Keep each vector's first N dimensions (Matryoshka models), cut before normalising. "
            "Default: {default}.",
        },
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
        {
            "metavar": "TEXT",
            "help": "Text put before every query, e.g. 'query: ' (e5), a BGE instruction; at most half "
            "of max_length in tokens.",
        },
    ),
    "passage_prefix": (
        ("--passage-prefix",),
        {
            "metavar": "TEXT",
            "help": "Text put before every indexed text, e.g. 'passage: ' (e5); at most half of max_length "
            "in tokens.",
        },
    ),
}
"""Every embedding-strategy option: its flags and click settings; ``{default}`` in a help text is
filled with the default of the command that shows it (``strategy_options_for``)."""
PREFIXES = ("query_prefix", "passage_prefix")

DEFAULTS = {
    "model": "the bundled all-MiniLM-L6-v2",
    "layers": "auto (a sentence-transformers model's last, else the second-to-last)",
    "combine": "mean",
    "pooling": AUTO,
    "max_length": "the model's limit",
    "dimensions": "all of them",
    "backend": "onnx",
}
"""What the library picks when a strategy option is not given (``indexer.embedding.strategy.Strategy``)."""


def strategy_options_for(*names: str, **defaults: str) -> Decorator:
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


def strategy_from(asked: dict[str, Any]) -> Strategy:
    """The strategy the options ask for; a tuned model's saved strategy fills in the rest, and a
    cut of a model not trained for it is noted (said on stderr)."""
    from indexer.embedding.folder import cut_note
    from indexer.embedding.models import model_location, strategy_request

    strategy, said = strategy_request(asked)
    for line in (said, cut_note(strategy, model_location(strategy.model))):
        if line:
            click.echo(line, err=True)
    return strategy


wait_option = click.option(
    "--wait",
    type=click.FloatRange(min=0),
    default=0,
    help="Seconds to wait for another writer of the index to finish. Default: 0, fail at once.",
)


def json_option(what: str) -> Decorator:
    """``--json``, saying what the one JSON document holds."""
    return click.option("--json", "as_json", is_flag=True, help=f"Print JSON: {what}.")


format_option = click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    help="Input file format (default: from the file extension).",
)
index_kind_option = click.option(
    "--index-kind",
    type=click.Choice(KINDS),
    default=KIND,
    show_default=True,
    help="Exact search, or IVF (approximate, tuned to recall@10 >= 0.97); auto: by size.",
)
storage_option = click.option(
    "--storage",
    type=click.Choice(STORAGES),
    default=STORAGE,
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
reading_options = stacked(
    encoding_option,
    click.option(
        "--delimiter", help="A CSV file's field separator: , ; | or tab (default: told from its header)."
    ),
    click.option(
        "--quoting",
        type=click.Choice(QUOTINGS),
        default=QUOTING,
        show_default=True,
        help="A TSV's or CSV's quotes: auto reads CSV quoting where the file shows a writer quoted "
        "(pandas, Python's csv) and typed quotes (27\") as text, never joining rows on a guess; csv: "
        "always CSV quoting; none: quotes are text.",
    ),
)
"""``--encoding``, ``--delimiter`` and ``--quoting``: how a corpus file's bytes are read
(``indexer.reading.formats``)."""


def text_field_option(default: str | None = "text") -> Decorator:
    """``--text-field``: the fields joined into the text embedded; with no default, the index's own."""
    return click.option(
        "--text-field",
        default=default,
        callback=_check_fields,
        show_default=default is not None,
        help="Field(s) of a row to embed, comma-separated and joined: question,answer"
        + ("" if default is not None else " (default: the ones the index was built with)"),
    )


def corpus_options(*, text_default: str | None = "text", id_help: str) -> Decorator:
    """How a corpus file is read (``--text-field``, ``--id-field``, ``--format``, ``--encoding``,
    ``--delimiter``, ``--quoting``), given to the command as one ``reading``
    (``indexer.reading.corpus.CorpusOptions``), as ``embedding_options`` gives ``options``."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            from indexer.reading.corpus import CorpusOptions

            text_field = kwargs.pop("text_field")
            fields = ("id_field", "fmt", "encoding", "delimiter", "quoting")
            reading = CorpusOptions(
                text_fields=split(text_field) if text_field else None, **{f: kwargs.pop(f) for f in fields}
            )
            return command(reading=reading, **kwargs)

        return stacked(
            text_field_option(text_default),
            click.option("--id-field", help=id_help),
            format_option,
            reading_options,
        )(wrapper)

    return decorate


output_option = click.option(
    "-o",
    "--output",
    "index_dir",
    required=True,
    type=click.Path(path_type=Path),
    help="Index directory (replaced atomically when the new index is complete).",
)


def corpus_option(*, required: bool) -> Decorator:
    return click.option(
        "--corpus",
        required=required,
        type=click.Path(dir_okay=False, path_type=Path),
        help="Corpus (JSONL with id, text, ...; or CSV/TSV/text lines): the entries the judgements name.",
    )


def judged_options(*, required: bool) -> Decorator:
    """``--queries`` and ``--qrels``: questions and which entries answer them."""
    return stacked(
        click.option(
            "--queries",
            "queries_file",
            required=required,
            type=click.Path(dir_okay=False, path_type=Path),
            help="Questions, each with an id and a text: JSONL, or CSV/TSV (by extension) with columns "
            "id and text.",
        ),
        click.option(
            "--qrels",
            required=required,
            type=click.Path(dir_okay=False, path_type=Path),
            help="Judgements: query_id, doc_id, relevance per line (TSV, header optional); doc_id is "
            "an entry id of the corpus.",
        ),
    )


pair_columns_options = stacked(
    click.option("--sentence1", default="sentence1", show_default=True, help="Column of the first sentence."),
    click.option(
        "--sentence2", default="sentence2", show_default=True, help="Column of the second sentence."
    ),
    click.option("--score", default="score", show_default=True, help="Column of the gold score."),
)
"""The columns of a scored sentence-pairs file (``search.studies.evaluate.read_pairs``)."""

pair_options = stacked(
    click.argument("pairs", type=click.Path(dir_okay=False, path_type=Path)),
    pair_columns_options,
    encoding_option,
)
"""A pairs file to score on: PAIRS, its columns and its encoding."""

retrieval_options = stacked(
    corpus_option(required=False),
    judged_options(required=True),
    text_field_option(),
    click.option("-k", default=10, show_default=True, type=HITS, help="Metric cutoff."),
    encoding_option,
)
"""A retrieval set to score on: the corpus, the judged queries, the fields embedded, the cutoff."""

SCORES = (
    "A score is on one scale in every mode: dense, the cosine; keyword, the entry's BM25 over the most "
    "the query's words could give, 0..1; hybrid, (1 - w) * cosine + w * the share of the query's words "
    "(weighted by rarity) an entry holds (w: the index's keyword weight, 0.15 by default; docs/hybrid.md)."
)
"""What a hit's score is, said by every option that takes one."""


def mode_option(help: str) -> Decorator:
    """``--mode``: the search modes, named in one place (``search.read.hybrid.MODES``)."""
    return click.option("--mode", type=click.Choice(MODES), help=help)


def also_options(*, weighted: bool = True) -> Decorator:
    """``--also`` (and, ``weighted``, ``--also-weight``): a second text per entry
    (``indexer.embedding.fields``), given to the command as ``also`` (a ``FieldScoring`` or None)."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def wrapper(also_fields: str | None, also_weight: float | None = None, **kwargs: Any) -> Any:
            from indexer.embedding.fields import FieldScoring

            return command(also=FieldScoring.asked(split(also_fields or ""), also_weight), **kwargs)

        weight = click.option(
            "--also-weight",
            type=WEIGHT,
            help=f"Share of the --also text's cosine in an entry's score. Default: {ALSO_WEIGHT}.",
        )
        also = click.option(
            "--also",
            "also_fields",
            help="Each entry's second text, from these fields (e.g. answer): a second vector scored with "
            "the first; tune trains the first text to find it.",
        )
        return stacked(also, weight)(wrapper) if weighted else also(wrapper)

    return decorate


def progress_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``-q/--quiet`` for a command that runs long, given to it as ``progress``: whether the
    library shows its progress (``indexer.progress``: a bar on a terminal, a line every 30 s in a
    file or a pipe), unless ``--quiet``. A new long command takes this decorator and passes
    ``progress`` on."""

    @functools.wraps(command)
    def wrapper(quiet: bool, **kwargs: Any) -> Any:
        return command(progress=not quiet, **kwargs)

    return click.option(
        "-q",
        "--quiet",
        is_flag=True,
        help="No progress (else a bar on a terminal, a line every 30 s in a file or a pipe).",
    )(wrapper)
