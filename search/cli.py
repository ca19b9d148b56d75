"""``semsearch``: click commands that are thin shells over indexer.build_index, SearchEngine and
rank_similar. Every user mistake ends as one line on stderr and a non-zero exit."""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import click

from indexer.errors import SemsearchError
from indexer.strategy import AUTO, COMBINES, POOLINGS, Strategy

DEFAULT_CHUNK_OVERLAP = 32


class _Group(click.Group):
    """Turns library errors into click's one-line errors; never shows a traceback by default."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SemsearchError as exc:
            raise click.ClickException(str(exc)) from None
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


def strategy_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The embedding-strategy options, collected into ``asked``: only those the user gave."""
    options = [
        click.option("--model", help="Hugging Face name or local path (default: bundled all-MiniLM-L6-v2)."),
        click.option(
            "--layers",
            callback=_parse_layers,
            help="Hidden state(s) to read: -2, or -4,-3,-2,-1 (0 = embeddings). Default: auto.",
        ),
        click.option("--combine", type=click.Choice(COMBINES), help="How several layers combine."),
        click.option(
            "--pooling",
            type=click.Choice((AUTO, *POOLINGS)),
            help="Token pooling (auto: the model's own config, else mean).",
        ),
        click.option(
            "--skip-special/--keep-special", default=None, help="Leave [CLS]/[SEP] out of mean/max pooling."
        ),
        click.option(
            "--max-length", type=click.IntRange(min=4), help="Tokens per text (default: model limit)."
        ),
        click.option("--normalize/--no-normalize", default=None, help="L2-normalise vectors."),
    ]
    names = ("model", "layers", "combine", "pooling", "skip_special", "max_length", "normalize")

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        asked = {name: kwargs.pop(name) for name in names}
        if asked["layers"] is None:  # "auto" and "not given" mean the same: let the model decide
            asked.pop("layers")
        return command(asked={k: v for k, v in asked.items() if v is not None}, **kwargs)

    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


def _strategy(asked: dict[str, Any], **extra: Any) -> Strategy:
    return Strategy(**asked, **extra)


def _progress() -> bool:
    return sys.stderr.isatty()


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="semsearch")
def cli() -> None:
    """Semantic search for answered questions and similar sentences."""


@cli.command("index")
@click.argument("corpus", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    "index_dir",
    required=True,
    type=click.Path(path_type=Path),
    help="Index directory (replaced atomically when the new index is complete).",
)
@click.option(
    "--text-field",
    default="text",
    show_default=True,
    help="Field(s) to embed, comma-separated and joined: question,answer",
)
@click.option("--id-field", help="Field with the entry id (default: 'id' if present, else row number).")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["csv", "tsv", "jsonl", "text"]),
    help="Corpus format (default: from the file extension).",
)
@click.option("--chunk", is_flag=True, help="Split long documents into overlapping windows.")
@click.option(
    "--chunk-overlap",
    type=click.IntRange(min=0),
    help=f"Tokens shared by neighbouring windows (implies --chunk; default {DEFAULT_CHUNK_OVERLAP}).",
)
@click.option("--batch-size", default=32, show_default=True, type=click.IntRange(min=1))
@strategy_options
def index_command(
    corpus: Path,
    index_dir: Path,
    text_field: str,
    id_field: str | None,
    fmt: str | None,
    chunk: bool,
    chunk_overlap: int | None,
    batch_size: int,
    asked: dict[str, Any],
) -> None:
    """Embed CORPUS (CSV, TSV, JSONL or text lines) into a FAISS + SQLite index."""
    from indexer.build import build_index

    if chunk and chunk_overlap is None:
        chunk_overlap = DEFAULT_CHUNK_OVERLAP
    strategy = _strategy(asked, chunk_overlap=chunk_overlap)
    fields = [f.strip() for f in text_field.split(",") if f.strip()]
    report = build_index(
        corpus,
        index_dir,
        strategy,
        text_fields=fields,
        id_field=id_field,
        fmt=fmt,
        batch_size=batch_size,
        progress=_progress(),
    )
    rate = report.entries / report.embed_seconds if report.embed_seconds else 0.0
    click.echo(
        f"indexed {report.entries} entries ({report.vectors} vectors, dim {report.dimension}) into "
        f"{report.index_dir} in {report.seconds:.1f}s (embedding {rate:.0f} entries/s)",
        err=True,
    )
    click.echo(f"strategy: {report.strategy.describe()}", err=True)
    if report.rejected:
        click.echo(f"rejected {len(report.rejected)} rows: {report.rejection_summary}", err=True)
        for rejection in report.rejected[:10]:
            click.echo(f"  row {rejection.row}: {rejection.reason}", err=True)
        if len(report.rejected) > 10:
            click.echo(f"  ... and {len(report.rejected) - 10} more", err=True)


def _read_queries(path: str) -> list[tuple[Any, str]]:
    """(id, text) pairs from JSON Lines with id/text, or from plain lines (id = line number)."""
    stream = click.open_file(path, encoding="utf-8", errors="strict")
    try:
        lines = stream.read().splitlines()
    except UnicodeDecodeError:
        raise SemsearchError(f"{path} is not valid UTF-8") from None
    finally:
        stream.close()
    queries = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                row = json.loads(line)
                queries.append((row.get("id", number), str(row["text"])))
            except (ValueError, KeyError, AttributeError):
                raise SemsearchError(f"{path} line {number}: expected JSON with 'text' (and 'id')") from None
        else:
            queries.append((number, line))
    if not queries:
        raise SemsearchError(f"no queries in {path}")
    return queries


def _short(value: Any, limit: int = 400) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _print_hits(
    query: str, hits: Iterable[Any], lead_field: str | None = None, hidden: Iterable[str] = ()
) -> None:
    """A ranked table: rank, score, id, then the lead text (e.g. the FAQ question) and other fields."""
    indent = " " * 25
    width = max(40, shutil.get_terminal_size((100, 20)).columns - len(indent))
    click.echo(f"\nquery: {query}")
    click.echo(f"{'rank':>4}  {'score':>6}  {'id':<10} text")
    for hit in hits:
        lead = hit.fields.get(lead_field) if lead_field else None
        lead = hit.text if lead in (None, "") else lead
        body = textwrap.wrap(_short(lead), width) or [""]
        click.echo(f"{hit.rank:>4}  {hit.score:6.3f}  {hit.id:<10} {body[0]}")
        for line in body[1:]:
            click.echo(indent + line)
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
@click.option("--json", "as_json", is_flag=True, help="One JSON line per query.")
@strategy_options
def query_command(
    index_dir: Path,
    question: str | None,
    queries_file: str | None,
    k: int,
    as_json: bool,
    asked: dict[str, Any],
) -> None:
    """Search INDEX_DIR for QUESTION (or for every query in --queries)."""
    from search.engine import SearchEngine, check_queries

    if (question is None) == (queries_file is None):
        raise click.UsageError("give a QUESTION or --queries FILE (one of them)")
    queries = _read_queries(queries_file) if queries_file else [(None, question)]
    check_queries([text for _, text in queries])
    engine = SearchEngine(index_dir, strategy=asked)
    results = engine.search_many([text for _, text in queries], k)
    source = engine.index.meta.get("source", {})
    text_fields = source.get("text_fields") or []
    lead_field = text_fields[0] if text_fields else None
    hidden = {source.get("id_field") or "id"} | ({lead_field} if len(text_fields) == 1 else set())
    for (query_id, text), hits in zip(queries, results, strict=True):
        if as_json:
            record = {"query_id": query_id, "query": text, "hits": [h.to_dict() for h in hits]}
            click.echo(json.dumps(record, ensure_ascii=False))
        else:
            _print_hits(text, hits, lead_field, hidden)


@cli.command("similar")
@click.argument("sentence")
@click.argument("file", default="-")
@click.option("-k", type=click.IntRange(min=1), help="Show the top K (default: all).")
@click.option("--json", "as_json", is_flag=True, help="One JSON line with the ranked sentences.")
@strategy_options
def similar_command(sentence: str, file: str, k: int | None, as_json: bool, asked: dict[str, Any]) -> None:
    """Rank the lines of FILE (default: stdin) by similarity to SENTENCE; no index needed."""
    from search.similar import rank_similar

    if file != "-" and not Path(file).is_file():
        raise SemsearchError(f"no such file: {file}")
    stream = click.open_file(file, encoding="utf-8", errors="strict")
    try:
        candidates = stream.read().splitlines()
    except UnicodeDecodeError:
        raise SemsearchError(f"{file} is not valid UTF-8") from None
    finally:
        stream.close()
    hits = rank_similar(sentence, candidates, _strategy(asked), k=k)
    if as_json:
        click.echo(json.dumps({"query": sentence, "hits": [h.to_dict() for h in hits]}, ensure_ascii=False))
    else:
        _print_hits(sentence, hits)


@cli.command("info")
@click.argument("index_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True)
def info_command(index_dir: Path, as_json: bool) -> None:
    """Strategy, model, size and source of an index."""
    from indexer.store import open_index

    index = open_index(index_dir)
    meta = index.meta
    info = {
        "path": str(index.path),
        "strategy": index.strategy.describe(),
        "model": meta["model"],
        "entries": meta["count"],
        "vectors": meta["vectors"],
        "dimension": meta["dimension"],
        "size_bytes": index.size_on_disk(),
        "created": meta["created"],
        "source": meta.get("source", {}).get("path"),
        "text_fields": ",".join(meta.get("source", {}).get("text_fields") or []),
    }
    if as_json:
        click.echo(json.dumps({**info, "strategy": index.strategy.to_dict()}))
        return
    for key, value in info.items():
        click.echo(f"{key + ':':<12} {value}")


def main() -> None:
    cli(prog_name="semsearch")


if __name__ == "__main__":
    main()
