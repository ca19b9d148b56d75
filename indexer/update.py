"""Keep an index alive without rebuilds: upsert a corpus by external id, delete ids, compact.

Entries are embedded with the index's stored strategy (and its fitted transform); an entry whose
text is unchanged (same content hash) is not embedded again.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from indexer.catalog import comparable, content_hash
from indexer.corpus import Rejection, read_corpus
from indexer.errors import BadInput
from indexer.fields import FieldScoring, embed_entries
from indexer.store import Change, apply_change, commit_change, live_meta, open_index, writer_lock


@dataclass(frozen=True)
class UpdateReport:
    added: int
    updated: int
    unchanged: int
    rejected: list[Rejection]
    rejection_summary: str
    deleted: int
    not_found: list[str]
    count: int
    seconds: float


def add_to_index(
    index_dir: str | Path,
    corpus_path: str | Path,
    *,
    text_fields: Sequence[str] | None = None,
    id_field: str | None = None,
    fmt: str | None = None,
    batch_size: int = 32,
    progress: bool = False,
    wait: float = 0,
    ray: str | None = None,
    ray_workers: int | None = None,
) -> UpdateReport:
    """Upsert every usable row of a corpus by id: an upserted entry's fields are replaced whole.
    Text and id fields default to the index's own; ``wait``: seconds to wait for another writer;
    ``ray``/``ray_workers``: embed on Ray, as ``build_index`` does."""
    from indexer.embedding import embedder_for

    started = time.perf_counter()
    index_dir = Path(index_dir)
    source = live_meta(index_dir).get("source", {})
    text_fields = list(text_fields or source.get("text_fields") or ["text"])
    id_field = id_field or source.get("id_field")
    also = FieldScoring.from_source(source)
    corpus = read_corpus(corpus_path, text_fields=text_fields, id_field=id_field, fmt=fmt)
    with writer_lock(index_dir, wait):
        live = open_index(index_dir, vectors=False)  # the live state under the lock is what we change
        stored = live.catalog.fingerprints([e.id for e in corpus.entries])
        types = live.catalog.types_for([e.fields for e in corpus.entries])
        live.catalog.close()
        added, changed, metadata_only = [], [], []
        for entry in corpus.entries:
            old = stored.get(entry.id)
            if old is None:
                added.append(entry)
            elif old[0] != content_hash(entry.text):
                changed.append(entry)
            elif old[1] != comparable(entry.fields, types):  # with also fields, they may be embedded
                (changed if also else metadata_only).append(entry)
        to_embed = added + changed
        vectors = owners = also_vectors = None
        if to_embed:
            if ray is None:
                embedder: Any = embedder_for(live.strategy, batch_size=batch_size)
            else:
                from indexer.distributed import RayEmbedder

                embedder = RayEmbedder(live.strategy, ray, workers=ray_workers, batch_size=batch_size)
            vectors, owners, also_vectors = embed_entries(embedder, to_embed, also, progress=progress)
            if live.transform is not None:
                vectors = live.transform.apply(vectors)
        if to_embed or metadata_only:
            change = Change(
                upserts=to_embed + metadata_only,
                vectors=vectors,
                owners=owners,
                also=also_vectors if also else None,
                reembed=frozenset(e.id for e in changed + added),
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
    )


def delete_from_index(index_dir: str | Path, ids: Sequence[str], *, wait: float = 0) -> UpdateReport:
    """Remove entries (rows and all their vectors) by external id; unknown ids are reported."""
    started = time.perf_counter()
    index_dir = Path(index_dir)
    ids = list(dict.fromkeys(str(i).strip() for i in ids if str(i).strip()))
    if not ids:
        raise BadInput("no ids to delete: give --id ID or --ids-file FILE")
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
    """Merge the segments and drop the tombstones of earlier updates (``indexer.segments``),
    VACUUM the database and refit the vector index to its size (the kind chosen again, IVF probes
    retuned: ``vector_index.refit``); returns the bytes on disk after."""
    index_dir = Path(index_dir)
    with writer_lock(index_dir, wait):
        apply_change(index_dir, Change(), compact=True)
    return open_index(index_dir).size_on_disk()


def _count(index_dir: Path) -> int:
    return int(live_meta(index_dir)["count"])


def read_ids(path: str | Path) -> list[str]:
    """One id per line (blank lines ignored), from a file or from stdin for "-"."""
    try:
        text = sys.stdin.read() if str(path) == "-" else Path(path).read_text(encoding="utf-8")
        return [line.strip() for line in text.splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"cannot read ids from {path}: {exc}") from None
