"""``semsearch serve``: the HTTP server over an index, or over an encoder alone
(``search.server``), with its connection bounds and the names its models go by."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from indexer.errors import BadInput
from search.cli.embedding import embedding_options
from search.cli.options import strategy_from, strategy_options
from search.cli.reranking import rerank_options

if TYPE_CHECKING:
    from indexer.encoders.options import EmbeddingOptions
    from search.read.reranked import RerankOptions


def _name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A served name clients can send back: not blank."""
    if value is not None and not value.strip():
        raise click.BadParameter("must not be empty")
    return value


@click.command("serve")
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
@click.option(
    "--max-client-connections",
    default=64,
    show_default=True,
    type=click.IntRange(min=1),
    help="Open connections of one client (IP address, IPv6 /64) at most; past that a new one gets a 503.",
)
@click.option("-q", "--quiet", is_flag=True, help="No access log (by default a line a request on stderr).")
@click.option(
    "--forwarded-allow-ips",
    metavar="IPS",
    help="Believe X-Forwarded-For/-Proto from these proxies (comma-separated addresses or networks, "
    "or *): the log then names the client a proxy forwards for. By default no one's is believed.",
)
@click.option(
    "--served-model-name",
    metavar="NAME",
    callback=_name,
    help="The embedding model's name in /v1/models, /info and the answers' model: a request naming "
    "another gets a 404 (default: the model as the index stores it, or its folder's name or path).",
)
@click.option(
    "--served-reranker-name",
    metavar="NAME",
    callback=_name,
    help="The reranker's name in /v1/models, /info and rerank answers, as --served-model-name "
    "(default: its folder's name or path).",
)
@rerank_options(tuning="loading", off=True)
@embedding_options("provider", "device", "code", serving=True)
@strategy_options
def serve_command(
    index_dir: Path | None,
    host: str,
    port: int,
    max_batch: int,
    request_timeout: float,
    keep_alive: float,
    max_connections: int,
    max_client_connections: int,
    quiet: bool,
    forwarded_allow_ips: str | None,
    served_model_name: str | None,
    served_reranker_name: str | None,
    rerank: RerankOptions,
    options: EmbeddingOptions,
    asked: dict[str, Any],
) -> None:
    """Serve INDEX_DIR over HTTP: a search page at /; POST /search, /search/batch, /similar,
    /v1/embeddings (OpenAI's shape), /encode, /reload (pick up a new version now); GET /duplicates,
    /info, /fields, /health, /v1/models; API docs at /docs. New versions written by index, add or delete are
    picked up within a second. With no INDEX_DIR and --model (or other strategy options): vectors
    alone (/v1/embeddings, /encode, /info). A reranker (--rerank MODEL, or the index's default
    unless --no-rerank) reranks the searches and answers POST /v1/rerank and /v2/rerank (Cohere's
    shapes) and /rerank (text-embeddings-inference's). Each request is a line on stderr (client, method,
    path, status, milliseconds) unless --quiet.

    \b
    Example:
        semsearch serve faq-index --port 8000
    """
    from search.read.loading import load_encoding, load_engine, load_reranker

    if index_dir is not None and asked:
        raise click.UsageError("an index is served with its stored strategy: drop the strategy options")
    if index_dir is None and not asked:
        raise click.UsageError(
            "give INDEX_DIR to search it, or --model (and strategy options) to serve vectors"
        )
    # the engine (or encoder) imports and loads while the web stack imports
    # a GPU asked for and missing: said before the server starts
    options.checked()
    loading = load_engine(index_dir, options, rerank) if index_dir is not None else None
    encoding = load_encoding(strategy_from(asked), options) if index_dir is None else None
    scoring = load_reranker(rerank, options) if index_dir is None and rerank.model else None
    try:
        from search.server import create_app, listen, serve
        from search.server.names import ServedNames
    except ImportError:
        raise BadInput("serving needs the 'serve' extra: pip install 'semsearch[serve]'") from None
    listening = listen(host, port)  # a port in use is told at once, not after the index loads
    names = ServedNames(served_model_name, served_reranker_name)
    app = create_app(
        index_dir, max_batch=max_batch, loading=loading, encoding=encoding, reranking=scoring, names=names
    )
    if index_dir is None:
        served = encoding.result().strategy.describe()
        click.echo(
            f"serving vectors of {served} on http://{host}:{port}/v1/embeddings (docs: /docs)", err=True
        )
    else:
        click.echo(f"serving {index_dir}: search page on http://{host}:{port}/ (API docs: /docs)", err=True)
        if loading is not None and loading.result().refused:
            click.echo(f"keyword searches only: {loading.result().refused}", err=True)
    serve(
        app,
        listening,
        request_timeout=request_timeout,
        keep_alive=keep_alive,
        max_connections=max_connections,
        max_client_connections=max_client_connections,
        access_log=not quiet,
        forwarded_allow_ips=forwarded_allow_ips,
    )
