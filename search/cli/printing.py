"""What the commands print that more than one of them prints: rejected rows, ranked hits, scores,
a sweep's table. Results go to stdout, reports of what was done to stderr."""

from __future__ import annotations

import json
import shutil
import textwrap
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from indexer.reading.corpus import CorpusOptions


def note_delimiter(path: Path | str, reading: CorpusOptions) -> None:
    from indexer.reading.formats import delimiter_note

    note = str(path) != "-" and delimiter_note(Path(path), reading.fmt, reading.delimiter, reading.encoding)
    if note:
        click.echo(note, err=True)


def echo_notes(notes: Sequence[str]) -> None:
    """What the reader said about how a corpus was read, one line each."""
    for note in notes:
        click.echo(note, err=True)


def echo_rejections(rejected: list[Any], summary: str) -> None:
    """Every unusable row is counted; the first ten are listed with their reasons."""
    if rejected:
        click.echo(f"rejected {len(rejected)} rows: {summary}", err=True)
        for rejection in rejected[:10]:
            click.echo(f"  {rejection.place()}: {rejection.reason}", err=True)
        if len(rejected) > 10:
            click.echo(f"  ... and {len(rejected) - 10} more", err=True)


def echo_pair_rejections(rejected: Sequence[Any]) -> None:
    """A labels file's rows that gave no pair, as an index's rejected rows are printed."""
    from indexer.reading.corpus import rejection_summary

    echo_rejections(list(rejected), rejection_summary(rejected))


def count(number: int, noun: str) -> str:
    """``1 pair``, ``2 pairs``."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def short(value: Any, limit: int = 400) -> str:
    """``value`` on one line of at most ``limit`` characters; a list or object as its JSON."""
    shown = json.dumps(value, ensure_ascii=False) if isinstance(value, (dict, list)) else str(value)
    text = " ".join(shown.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def print_hits(
    query: str,
    hits: Sequence[Any],
    lead_field: str | None = None,
    hidden: Iterable[str] = (),
    group_by: str | None = None,
    note: str | None = None,
) -> None:
    """A ranked table: rank, score, id, then the lead text (e.g. the FAQ question) and other fields;
    grouped, how many more entries each hit's group holds. ``note``: one line on how to read the
    scores of this query's hits, under it."""
    indent = " " * 25
    width = max(40, shutil.get_terminal_size((100, 20)).columns - len(indent))
    click.echo(f"\nquery: {query}")
    if note:
        click.echo(note)
    if not hits:
        click.echo("no match")
        return
    if hits[0].answered is False:
        click.echo("no answer (the best hit is below the index's calibrated confidence or --min-score)")
    click.echo(f"{'rank':>4}  {'score':>6}  {'id':<10} text")
    for hit in hits:
        lead = hit.fields.get(lead_field) if lead_field else None
        lead = hit.text if lead in (None, "") else lead
        body = textwrap.wrap(short(lead), width) or [""]
        click.echo(f"{hit.rank:>4}  {hit.score:6.3f}  {hit.id:<10} {body[0]}")
        for line in body[1:]:
            click.echo(indent + line)
        if getattr(hit, "first_score", None) is not None:  # reranked: the first stage's score beside
            own = getattr(hit, "rerank_score", None)
            fused = "" if own is None or own == hit.score else f", reranker: {own:.3f}"
            click.echo(f"{indent}first stage: {hit.first_score:.3f}{fused}")
        if hit.answered is not None:
            sure = "" if hit.confidence is None else f" (confidence {hit.confidence:.2f})"
            click.echo(f"{indent}answered: {'yes' if hit.answered else 'no'}{sure}")
        if hit.others:
            click.echo(f"{indent}+{hit.others} more in this {group_by}")
        for name, value in hit.fields.items():
            if name in hidden or name == lead_field or value in (None, ""):
                continue
            lines = textwrap.wrap(f"{name}: {short(value)}", width, subsequent_indent="  ")
            for line in lines:
                click.echo(indent + line)


def echo_scores(scores: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(scores))
        return
    for key, value in scores.items():
        if isinstance(value, float):
            value = f"{value:.4f}" if abs(value) <= 1 else f"{value:.2f}"
        click.echo(f"{key + ':':<11} {value}")


def report_sweep(
    cells: list[Any],
    metric: str,
    csv_path: Path | None,
    heatmap: Path | None,
    top: int,
    title: str,
    reproduce_prefix: str,
) -> None:
    from search.studies.sweep import deciding, reproduce, saturated
    from search.studies.sweep_output import write_csv, write_heatmap

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
    if saturated([cell.scores for cell in cells], metric):
        click.echo(
            f"\n{metric} is {best.scores[metric]:.3f} in every cell (saturated: it tells no cell from "
            f"another); {broken_by(best.scores, metric)}"
        )
    by = deciding(best.scores, cells[1].scores, metric) if len(cells) > 1 else metric
    then = "" if by == metric else f", then {by}"
    click.echo(
        f"\nbest by {metric}{then}: {best.row}, {best.strategy.pooling}, {best.strategy.postprocess}: "
        f"{best.scores[metric]:.3f}" + ("" if by == metric else f", {by} {best.scores[by]:.3f}")
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


def broken_by(scores: dict[str, float], metric: str) -> str:
    """What ranks where ``metric`` ties: the other metrics, in the table's order."""
    from search.studies.sweep import tie_breakers

    first, *rest = tie_breakers(scores, metric)
    return f"ties broken by {first}" + (f" (then {', '.join(rest)})" if rest else "")


def report_modes(modes: Any, metric: str, index_prefix: str = "semsearch index CORPUS -o INDEX") -> None:
    """The best cell searched dense, by keywords and hybrid at each keyword share, and the advice:
    keyword search where it beats every other row (it holds for any index of the corpus), else
    dense or the best share, by ``metric``, ties broken by the next metrics (said where ``metric``
    is saturated), for an index built as the best cell (``index_prefix`` and its options)."""
    from search.studies.sweep import deciding, reproduce

    metrics = [m for m in modes.cell.scores if m != "queries"]
    click.echo("\nthe best cell in every mode (query --mode; docs/hybrid.md):")
    click.echo(f"{'mode':<12} " + " ".join(f"{m:>9}" for m in metrics))
    rows = {"dense": modes.cell.scores, "keyword": modes.keyword}
    rows.update({f"hybrid {weight:g}": scores for weight, scores in modes.hybrid.items()})
    for name, scores in rows.items():
        click.echo(f"{name:<12} " + " ".join(f"{scores[m]:9.3f}" for m in metrics))
    best = modes.best_weight(metric)
    if modes.saturated(metric):
        click.echo(
            f"\n{metric} is {modes.cell.scores[metric]:.3f} for dense and at every keyword weight "
            f"(saturated: it tells none of them apart); {broken_by(modes.cell.scores, metric)}"
        )
    if modes.keyword_wins(metric):
        by = deciding(modes.keyword, modes.hybrid[best], metric)
        click.echo(
            f"\nkeyword wins by {by}: keyword {modes.keyword[by]:.3f} beats dense in every cell (best "
            f"{modes.cell.scores[by]:.3f}) and the best cell's hybrid at every weight "
            f"(best {modes.hybrid[best][by]:.3f})"
        )
        click.echo(
            'use it: query with --mode keyword (HTTP: "mode": "keyword") on any index of this corpus; one '
            "calibrated for keyword search only searches by keyword by default: semsearch calibrate INDEX "
            "--mode keyword --queries ... --qrels ... (or --self)"
        )
        return
    built = f"for an index built as the best cell: {index_prefix} {reproduce(modes.cell.strategy)}, then"
    by = deciding(modes.hybrid[best], modes.cell.scores, metric)
    named, shown = (metric, "") if by == metric else (f"{metric}, then {by}", f" {by}")
    hybrid, dense = modes.hybrid[best][by], modes.cell.scores[by]
    if modes.dense_wins(metric):
        click.echo(
            f"\ndense wins by {named}: dense {dense:.3f}, the best keyword weight {best:g} {hybrid:.3f} "
            "(no weight scores above dense on these labels)"
        )
        click.echo(
            f'keep it, {built} query with --mode dense (HTTP: "mode": "dense"); an index calibrated for '
            "dense search only searches dense by default: semsearch calibrate INDEX --mode dense "
            "--queries ... --qrels ... (or --self)"
        )
        return
    click.echo(f"\nbest keyword weight by {named}: {best:g} (hybrid{shown} {hybrid:.3f}, dense {dense:.3f})")
    click.echo(f"store it, {built} semsearch calibrate INDEX --hybrid-weight {best:g}")


def print_info(info: dict[str, Any], rules: dict[str, Any]) -> None:
    """``info``'s facts one a line, as a person reads them (the index's calibrated ``rules`` by
    mode); an unset fact is left out."""
    shown = {
        **info,
        "strategy": info["description"],
        "index_kind": f"{info['index_kind']}, {info['storage']}"
        + (f", nprobe {info['nprobe']}" if "nprobe" in info else ""),
        "text_fields": ",".join(info["text_fields"]),
        "keyword_fields": ",".join(info["keyword_fields"]) or "none",
        "keyword_fields_pending": ",".join(info["keyword_fields_pending"]) or "none",
        "fields": ", ".join(f"{name} ({kind})" for name, kind in info["fields"].items()),
        "also": info["also"] and f"{','.join(info['also']['fields'])} (weight {info['also']['weight']:g})",
    }
    if not info["also"]:
        shown.pop("also")
    if info["embedded"]:  # what made the vectors, where, how batched (older indexes: unknown)
        from indexer.encoders.base import describe_record

        shown["embedded"] = describe_record(info["embedded"])
    shown["calibration"] = "\n".ljust(14).join(rule.describe() for rule in rules.values()) or "none"
    shown["keywords"] = (
        keywords_line(info["keyword_fields"], info["keyword_fields_pending"])
        if info["keywords"]
        else "none (written before keyword search): its next version (add, delete or compact) keeps them"
    )
    if info["keywords"]:
        from search.read.hybrid import DEFAULT_WEIGHT

        weight = info["hybrid_weight"]
        shown["hybrid_weight"] = (
            f"{DEFAULT_WEIGHT if weight is None else weight:g} ({'default' if weight is None else 'stored'};"
            " every query)"
        )
    if info.get("reranker"):  # its default reranker: its name at its commit or folder, the files' identity
        said = info["reranker"]
        shown["reranker"] = f"{said.get('name') or said.get('path')} ({said.get('fingerprint')})"
    for key in ("description", "storage", "nprobe"):
        shown.pop(key, None)
    for key, value in shown.items():
        if value is not None:  # an unset fact (never updated, no calibration) is left out
            click.echo(f"{key + ':':<12} {value}")


def keywords_line(fields: list[str], pending: list[str]) -> str:
    """What the keyword table reads: the text and which fields, and what waits for a new version."""
    read = f"the text and {', '.join(fields)}" if fields else "the text alone"
    later = f" ({', '.join(pending)} from its next version: add, delete or compact)" if pending else ""
    return f"FTS5 (BM25) over {read}{later}: --mode keyword and hybrid"
