"""The commands that read an index (query, info, duplicates) or embed without one (similar, rerank,
encode); ``serve`` is ``search.cli.serving``'s."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from indexer.embedding.strategy import BACKENDS, ROLES
from search.cli.embedding import embedding_options
from search.cli.options import (
    FINITE,
    HITS,
    PREFIXES,
    SCORES,
    corpus_options,
    encoding_option,
    json_option,
    mode_option,
    progress_options,
    strategy_from,
    strategy_options,
    strategy_options_for,
)
from search.cli.printing import count, note_delimiter, print_hits, print_info, short
from search.cli.reranking import rerank_options, usable

if TYPE_CHECKING:
    from indexer.encoders.options import EmbeddingOptions
    from indexer.reading.corpus import CorpusOptions
    from search.read.reranked import RerankOptions


@click.command("query")
@click.argument("index_dir", type=click.Path(path_type=Path))
@click.argument("question", required=False)
@click.option(
    "--queries",
    "queries_file",
    help="File of queries: CSV/TSV (by extension) or JSONL with id and text, or plain lines ('-' = stdin).",
)
@click.option("-k", default=10, show_default=True, type=HITS, help="Hits per query.")
@click.option("--where", help="Filter on stored fields before the search: \"category = 'billing'\".")
@json_option("one line per query, with its hits")
@click.option(
    "--min-score",
    type=FINITE,
    help="Mark hits scoring below this not answered, in any mode (over a calibration): in [-1, 1], "
    "reranked in the range of the reranker's score (docs/rerank.md). " + SCORES,
)
@embedding_options("provider", "code", serving=True)
@encoding_option
@click.option(
    "--group-by",
    metavar="FIELD",
    help="The best hit per value of this stored field, k of them, each with the count of the rest "
    "(one FAQ question with several answers shown once).",
)
@mode_option(
    "dense (vectors), keyword (BM25) or hybrid (both fused; docs/hybrid.md). Default: hybrid (dense where "
    "the index has no keyword table), unless the index is calibrated only for other modes: then one of those."
)
@rerank_options(off=True)
def query_command(
    index_dir: Path,
    question: str | None,
    queries_file: str | None,
    k: int,
    where: str | None,
    as_json: bool,
    min_score: float | None,
    options: EmbeddingOptions,
    encoding: str,
    group_by: str | None,
    mode: str | None,
    rerank: RerankOptions,
) -> None:
    """Search INDEX_DIR for QUESTION (or for every query in --queries), with the strategy it was
    built with; reranked by --rerank MODEL, or by the index's default reranker unless --no-rerank.

    \b
    Example:
        semsearch query faq-index "how do I reset my password" -k 5
    """
    from search.read.engine import SearchEngine, configure_threads
    from search.read.queries import Query, read_queries
    from search.read.requests import check_queries

    if (question is None) == (queries_file is None):
        raise click.UsageError("give a QUESTION or --queries FILE (one of them)")
    queries = read_queries(queries_file, encoding) if queries_file else [Query("1", question)]
    check_queries([q.text for q in queries])
    configure_threads()
    engine = SearchEngine(index_dir, options=options, rerank=rerank)
    asked = usable(rerank.given(engine.reranking), k)  # a depth or weight where the index has no reranker
    texts = [q.text for q in queries]
    request = engine.request(
        texts, k=k, where=where, min_score=min_score, group_by=group_by, mode=mode, rerank=asked
    )
    refusal = None if min_score is None else engine.scale(request).refusal(min_score)
    if refusal is not None:  # the score's range is known once its reranker is
        raise click.UsageError(f"--min-score {refusal}")
    results = engine.answer(request)
    keyword_notes = engine.keyword_notes(texts, mode)
    note = engine.note(request)
    if note:
        click.echo(note, err=True)
    source = engine.index.meta.get("source", {})
    text_fields = source.get("text_fields") or []
    lead_field = text_fields[0] if text_fields else None
    hidden = {source.get("id_field") or "id"} | ({lead_field} if len(text_fields) == 1 else set())
    for query, hits, said in zip(queries, results, keyword_notes, strict=True):
        if as_json:
            record = {"query_id": query.id, "query": query.text, "hits": [h.to_dict() for h in hits]}
            click.echo(json.dumps({**record, **({"note": said} if said else {})}, ensure_ascii=False))
        else:
            print_hits(query.text, hits, lead_field, hidden, group_by, said)


@click.command("info")
@click.argument("index_dir", type=click.Path(path_type=Path))
@json_option("one object with every fact, the unset ones as null")
@click.option(
    "--check",
    is_flag=True,
    help="Also verify every file against the checksum written at commit (reads the whole index); "
    "damage: exit 5 naming the file.",
)
def info_command(index_dir: Path, as_json: bool, check: bool) -> None:
    """Strategy, model, size and source of an index.

    \b
    Example:
        semsearch info faq-index --check
    """
    from indexer.store import verify
    from search.read.confidence import stored_form, stored_rules
    from search.read.info import index_info

    checked = verify(index_dir) if check else None
    info = index_info(index_dir)
    rules = stored_rules(info["calibration"])  # by mode, an old index's single rule included
    info["calibration"] = stored_form(rules) or None
    if checked is not None:
        info["check"] = f"ok, {checked} files checked"
    if as_json:
        click.echo(json.dumps(info, ensure_ascii=False))
        return
    print_info(info, rules)


@click.command("duplicates")
@click.argument("index_dir", type=click.Path(path_type=Path))
@click.option(
    "--min-score", default=0.9, show_default=True, type=FINITE, help="Cosine of a duplicate pair, in (0, 1]."
)
@click.option("--limit", type=click.IntRange(min=0), help="List at most this many pairs (best first).")
@click.option("--exact", is_flag=True, help="Compare every pair, also past 30k vectors (slower).")
@json_option("the pairs and the groups they form")
@progress_options
def duplicates_command(
    index_dir: Path, min_score: float, limit: int | None, exact: bool, as_json: bool, progress: bool
) -> None:
    """Pairs of entries at least MIN_SCORE alike, and the groups they form.

    \b
    Example:
        semsearch duplicates faq-index --min-score 0.95 --limit 20
    """
    from indexer.store import open_index
    from search.read.duplicates import find_duplicates, min_score_refusal

    refusal = min_score_refusal(min_score)  # a cosine's range, known before the index opens
    if refusal is not None:
        raise click.UsageError(f"--min-score {refusal}")
    found = find_duplicates(open_index(index_dir), min_score, limit, exact=exact or None, progress=progress)
    if as_json:
        click.echo(json.dumps(found.to_dict(), ensure_ascii=False))
        return
    pairs, groups = count(found.total, "pair"), count(len(found.groups), "group")
    click.echo(f"{pairs} in {groups} at cosine >= {found.min_score}")
    for number, group in enumerate(found.groups, 1):
        click.echo(f"group {number}: {' '.join(group)}")
    for a, b, score in found.pairs:
        click.echo(f"{score:6.3f}  {a}  {short(found.texts.get(a, ''), 60)}")
        click.echo(f"{'':6}  {b}  {short(found.texts.get(b, ''), 60)}")
    if found.truncated:
        click.echo(f"... {count(found.total - len(found.pairs), 'more pair')} (--limit)")


@click.command("similar")
@click.argument("sentence")
@click.argument("file", default="-")
@click.option("-k", type=HITS, help="Show the top K (default: all).")
@json_option("one line with the ranked sentences")
@encoding_option
@click.option(
    "--index",
    "index_dir",
    type=click.Path(path_type=Path),
    help="Embed as this index's entries were: its strategy and fitted post-processing (centering, "
    "whitening); the strategy options must then match it.",
)
@embedding_options("device")
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
    options: EmbeddingOptions,
    asked: dict[str, Any],
) -> None:
    """Rank the lines of FILE (default: stdin) by similarity to SENTENCE; no index needed.

    \b
    Example:
        semsearch similar "a cat sits on the mat" sentences.txt -k 3
    """
    from search.read.queries import read_lines
    from search.read.similar import rank_similar, rank_similar_with_index

    lines = read_lines(file, encoding)
    if index_dir is not None:
        hits = rank_similar_with_index(index_dir, sentence, lines, k=k, strategy=asked, options=options)
    else:
        hits = rank_similar(sentence, lines, strategy_from(asked), k=k, options=options)
    if as_json:
        click.echo(json.dumps({"query": sentence, "hits": [h.to_dict() for h in hits]}, ensure_ascii=False))
    else:
        print_hits(sentence, hits)


@click.command("rerank")
@click.argument("question")
@click.argument("file", default="-")
@click.option(
    "--model",
    required=True,
    metavar="MODEL",
    help="The reranker: a cross-encoder folder as sentence-transformers saves one, or a Hugging "
    "Face name (docs/rerank.md).",
)
@click.option("-k", type=HITS, help="Show the top K (default: all).")
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    help="What runs it. Default: ONNX Runtime (the graph exported once, then cached), torch on a GPU; "
    "onnx-int8: int8 weights, faster on the CPU, scores slightly apart from CrossEncoder.predict.",
)
@json_option("one line with the ranked texts")
@encoding_option
@embedding_options("device", "batch")
def rerank_command(
    question: str,
    file: str,
    model: str,
    k: int | None,
    backend: str | None,
    as_json: bool,
    encoding: str,
    options: EmbeddingOptions,
) -> None:
    """Rank the lines of FILE (default: stdin) against QUESTION with a reranker (a cross-encoder
    reading the question and each line together); no index needed.

    \b
    Example:
        semsearch rerank "how do I reset my password" answers.txt --model models/ms-marco-MiniLM-L6-v2 -k 3
    """
    from search.read.queries import read_lines
    from search.read.reranking import rerank

    hits = rerank(question, read_lines(file, encoding), model, k=k, options=options, runtime=backend)
    if as_json:
        click.echo(json.dumps({"query": question, "hits": [h.to_dict() for h in hits]}, ensure_ascii=False))
    else:
        print_hits(question, hits)


@click.command("encode")
@click.argument("source", default="-")
@click.option(
    "-o",
    "--output",
    help="File to write: FILE.npy (float32, row i = text i) or FILE.jsonl (or .ndjson); another "
    "extension needs --to; default ('-'): JSON lines on stdout.",
)
@click.option(
    "--to",
    type=click.Choice(("npy", "jsonl")),
    help="Output format (default: the one the -o extension names; one it contradicts is refused).",
)
@corpus_options(id_help="Field giving each row's id in JSON lines output (default: id, else row number).")
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
@progress_options
@embedding_options("device", "code")
@strategy_options
def encode_command(
    source: str,
    output: str | None,
    to: str | None,
    reading: CorpusOptions,
    index_dir: Path | None,
    as_: str,
    progress: bool,
    options: EmbeddingOptions,
    asked: dict[str, Any],
) -> None:
    """Vectors of the texts of SOURCE (lines, CSV/TSV or JSONL with --text-field; default: stdin
    lines), in input order, to a .npy matrix or JSON lines {"id", "vector"}.

    \b
    Example:
        semsearch encode questions.csv --text-field question -o vectors.npy
    """
    from search.read.encoding import Encoding, encode_file, format_refusal, output_format

    if index_dir is not None and asked:
        raise click.UsageError("--index encodes with its stored strategy: drop the strategy options")
    refusal = format_refusal(output, to, cli=True)
    if refusal is not None:
        raise click.UsageError(refusal)
    output_format(output, to)  # a bad output is told before the model loads
    strategy = None if index_dir is not None else strategy_from(asked)
    model = Encoding.load(strategy, index=index_dir, options=options)
    report = encode_file(
        source,
        output,
        model,
        to=to,
        reading=reading,
        progress=progress,
        as_=as_,
    )
    note_delimiter(source, reading)
    click.echo(
        f"encoded {report.texts} texts (dim {report.dimension}) into {report.output} "
        f"in {report.seconds:.1f}s",
        err=True,
    )
    click.echo(f"strategy: {report.strategy.describe()}", err=True)
