"""Keep an index alive without rebuilds: upsert a corpus by external id, delete ids, compact.

Entries are embedded with the index's stored strategy (and its fitted transform); an entry whose
text is unchanged (same content hash) is not embedded again.

An index built on row numbers (no id field) gives its ids itself: its source meta keeps
``next_row_id``, one past every id it has given, and an ``add`` without an id field numbers the
rows of the added file from there (rejected rows use up their numbers too, as in a build), so an
added row never takes the id of an entry, nor of a deleted one. An ``add`` naming an id field
upserts by it, and moves the counter past the integer ids it brings.

An add does not stream as a build does (``indexer.writing.build``), and why: its rows are compared
with the stored ones before anything is embedded (only new and changed texts are), the model is
loaded only when some are, and the whole change is one transaction of the live version, committed
at once. So the added corpus is read whole first (an add is held in memory; a corpus too large for
that is a build). Its new and changed texts are then embedded a part at a time, each part tokenised
beside the network embedding the one before (``build.embed_parts``), and a put of many rows keeps
the keyword table by two statements rather than row by row (``KeywordTable.keywords_aside``).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from indexer.catalog import Catalog, content_hash
from indexer.embedding.fields import FieldScoring
from indexer.encoders.options import EmbeddingOptions
from indexer.encoders.options import given as given_options
from indexer.errors import BadInput
from indexer.progress import Progress
from indexer.reading.corpus import (
    Corpus,
    CorpusOptions,
    Entry,
    Rejection,
    check_field_count,
    entry_id,
    read_corpus,
)
from indexer.reading.decoding import lines_of
from indexer.reading.field_types import comparable, misfit
from indexer.reading.rows import ROWS_NAME, CorpusSource, is_path
from indexer.store import Change, apply_change, commit_change, live_meta, open_index, writer_lock
from indexer.writing.build import embed_parts

_ROW_ID = re.compile(r"[1-9][0-9]*")
"""An id a row number could be."""


@dataclass(frozen=True)
class UpdateReport:
    """What an add or delete did: entries added, updated, unchanged, rejected, deleted, not found."""

    added: int
    updated: int
    unchanged: int
    rejected: list[Rejection]
    rejection_summary: str
    deleted: int
    not_found: list[str]
    count: int
    seconds: float
    notes: tuple[str, ...] = ()
    """What the reader said about how the corpus was read (a TSV's quoted fields of several lines)."""


def add_to_index(
    index_dir: str | Path,
    corpus_path: CorpusSource,
    *,
    corpus_options: CorpusOptions | None = None,
    options: EmbeddingOptions | None = None,
    progress: bool = False,
    wait: float = 0,
    **given: Any,
) -> UpdateReport:
    """Upsert every usable row of a corpus (a file, or rows as ``build_index`` takes them) by id:
    an upserted entry's fields are replaced whole.
    ``corpus_options`` (or its fields as keywords): how the corpus is read, as ``build_index``
    takes them; text and id fields default to the index's own; to an index built on row numbers
    the rows are added with new ids (the module docstring) unless ``id_field`` is given. A row whose
    value cannot be stored in its column as written is rejected (``field_types.misfit``). ``wait``:
    seconds to wait for another writer; ``options``: how the texts are embedded, as
    ``build_index`` takes them."""
    from indexer.encoders.factory import encoder_for

    started = time.perf_counter()
    index_dir = Path(index_dir)
    embedding = given_options(options).checked()  # a GPU asked for and missing: said before anything
    reading = CorpusOptions.of(corpus_options, **given)
    live_meta(index_dir)  # not an index: say so before taking its lock
    with writer_lock(index_dir, wait):
        live = open_index(index_dir, vectors=False)  # the live state under the lock is what we change
        source = dict(live.meta.get("source", {}))
        next_row_id = _next_row_id(source, live.catalog)
        first_row_id = next_row_id if reading.id_field is None else None
        reading = dataclasses.replace(
            reading,
            text_fields=reading.text_fields or source.get("text_fields") or ["text"],
            id_field=reading.id_field or source.get("id_field"),
        )
        also = FieldScoring.from_source(source)
        columns = {name.casefold(): t for name, t in live.catalog.field_types().items()}
        corpus = read_corpus(
            corpus_path, reading, first_row_id=first_row_id, check=lambda row: misfit(row, columns)
        )
        _check_columns(corpus, columns, corpus_path if is_path(corpus_path) else ROWS_NAME)
        added, changed, metadata_only = _by_change(live.catalog, corpus.entries, also is not None)
        live.catalog.close()
        if next_row_id is not None:
            source["next_row_id"] = _after(corpus, next_row_id, first_row_id)
        to_embed = added + changed
        vectors = owners = also_vectors = None
        if to_embed:
            encoder = encoder_for(live.strategy, embedding, held=live.graph)
            with Progress(len(to_embed), "embedding", enabled=progress) as bar:
                vectors, owners, also_vectors = embed_parts(encoder, to_embed, also, bar)
            if live.transform is not None:
                vectors = live.transform.apply(vectors)
        if to_embed or metadata_only:
            change = Change(
                upserts=to_embed + metadata_only,
                vectors=vectors,
                owners=owners,
                also=also_vectors if also else None,
                reembed=frozenset(e.id for e in changed + added),
                meta={"source": source},
            )
            commit_change(index_dir, change)
    unchanged = len(corpus.entries) - len(to_embed) - len(metadata_only)
    return UpdateReport(
        len(added),
        len(changed) + len(metadata_only),
        unchanged,
        corpus.rejected,
        corpus.rejection_summary(),
        0,
        [],
        _count(index_dir),
        time.perf_counter() - started,
        tuple(corpus.notes),
    )


def _by_change(catalog: Catalog, entries: list[Entry], also: bool) -> tuple[list[Entry], ...]:
    """The entries new to the index, those whose text changed (or, ``also``: whose fields, which
    may be embedded too), and those whose fields alone changed; unchanged ones are in none."""
    stored = catalog.fingerprints([e.id for e in entries])
    types = catalog.types_for([e.fields for e in entries])
    added, changed, metadata_only = [], [], []
    for entry in entries:
        old = stored.get(entry.id)
        if old is None:
            added.append(entry)
        elif old[0] != content_hash(entry.text):
            changed.append(entry)
        elif old[1] != comparable(entry.fields, types):  # with also fields, they may be embedded
            (changed if also else metadata_only).append(entry)
    return added, changed, metadata_only


def delete_from_index(index_dir: str | Path, ids: Sequence[str], *, wait: float = 0) -> UpdateReport:
    """Remove entries (rows and all their vectors) by external id (a string or an integer, as
    ``corpus.entry_id`` reads it); unknown ids are reported."""
    started = time.perf_counter()
    index_dir = Path(index_dir)
    if isinstance(ids, str | bytes):  # not its characters
        raise BadInput("ids: give a list of ids, not one string (wrap it: [id])")
    if not isinstance(ids, Iterable):
        raise BadInput(f"ids: give a list of ids, not {type(ids).__name__}")
    ids = list(ids)
    given = [entry_id(i) for i in ids]
    if None in given:
        bad = ids[given.index(None)]
        raise BadInput(f"an id is a string or an integer, not {bad!r}")
    ids = list(dict.fromkeys(i for i in given if i))
    if not ids:
        raise BadInput("no ids given to delete")
    with writer_lock(index_dir, wait):
        live = open_index(index_dir, vectors=False)
        found = set(live.catalog.rowids(ids))
        live.catalog.close()
        if found:
            commit_change(index_dir, Change(deletes=[i for i in ids if i in found]))
    return UpdateReport(
        0,
        0,
        0,
        [],
        "",
        len(found),
        [i for i in ids if i not in found],
        _count(index_dir),
        time.perf_counter() - started,
    )


def compact_index(index_dir: str | Path, *, wait: float = 0) -> int:
    """Merge the segments and drop the tombstones of earlier updates (``indexer.vectors.segments``),
    VACUUM the database and refit the vector index to its size (the kind chosen again, IVF probes
    retuned: ``vectors.factory.refit``); returns the bytes on disk after."""
    index_dir = Path(index_dir)
    with writer_lock(index_dir, wait):
        apply_change(index_dir, Change(), compact=True)
    return open_index(index_dir).size_on_disk()


def _next_row_id(source: dict[str, Any], catalog: Catalog) -> int | None:
    """The id the next row added without an id field gets, for an index built on row numbers;
    None for one whose ids came from a field. An index built before the counter was kept
    (``id_field`` None, from a corpus file) continues past its rows and its largest number id."""
    if "next_row_id" in source:
        return int(source["next_row_id"])
    if "id_field" in source and source["id_field"] is None and "path" in source:
        return max(int(source.get("rows", 0)), catalog.largest_number_id()) + 1
    return None


def _after(corpus: Corpus, next_row_id: int, first_row_id: int | None) -> int:
    """The counter after an add: past the rows numbered, or past the integer ids given."""
    if first_row_id is not None:
        return first_row_id + corpus.rows
    given = (int(e.id) for e in corpus.entries if _ROW_ID.fullmatch(e.id))
    return max(next_row_id, max(given, default=0) + 1)


def _check_columns(corpus: Corpus, columns: dict[str, str], path: str | Path) -> None:
    """The index's fields and the new ones of the added rows must fit SQLite's table."""
    new = {name.casefold() for e in corpus.entries for name in e.fields} - set(columns)
    check_field_count(len(columns) + len(new), f"{path} adds {len(new)} fields to the index's {len(columns)}")


def _count(index_dir: Path) -> int:
    return live_meta(index_dir).count


def read_ids(path: str | Path, encoding: str = "utf-8") -> list[str]:
    """One id per line (blank lines ignored), from a file or from stdin for "-"."""
    return [line.strip() for line in lines_of(path, encoding) if line.strip()]
