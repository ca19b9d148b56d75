"""corpus -> texts -> vectors -> index: the one function the ``index`` command is a shell over."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from indexer.corpus import Rejection, read_corpus
from indexer.strategy import Strategy
from indexer.transform import Transform


@dataclass(frozen=True)
class BuildReport:
    index_dir: Path
    strategy: Strategy
    entries: int
    vectors: int
    dimension: int
    rejected: list[Rejection]
    rejection_summary: str
    seconds: float
    embed_seconds: float
    """Time spent embedding alone (no model load, no writing): the throughput figure."""


def build_index(
    corpus_path: str | Path,
    index_dir: str | Path,
    strategy: Strategy | None = None,
    *,
    text_fields: Sequence[str] | None = None,
    id_field: str | None = None,
    fmt: str | None = None,
    batch_size: int = 32,
    progress: bool = False,
    index_kind: str = "auto",
    storage: str = "float32",
    wait: float = 0,
) -> BuildReport:
    """Index a corpus file into ``index_dir``, replacing any index there only once complete.
    ``index_kind``: ``auto`` (exact below ``vector_index.EXACT_LIMIT`` vectors, IVF above),
    ``flat`` or ``ivf``; ``storage``: ``float32``, ``float16`` or ``sq8``; ``wait``: seconds to
    wait for another writer to finish. A failed first build leaves no directory behind."""
    from indexer.embedding import embedder_for
    from indexer.store import building, write_index

    started = time.perf_counter()
    corpus = read_corpus(corpus_path, text_fields=text_fields, id_field=id_field, fmt=fmt)
    with building(Path(index_dir), wait):
        embedder = embedder_for(strategy, batch_size=batch_size)
        embed_started = time.perf_counter()
        vectors, owners = embedder.embed_documents([e.text for e in corpus.entries], progress=progress)
        embed_seconds = time.perf_counter() - embed_started
        embedder.export_for_queries()  # once per model and strategy: queries then need no torch
        transform = Transform.for_strategy(embedder.strategy, vectors)
        vectors = Transform.apply_optional(transform, vectors)
        source = {
            "path": str(Path(corpus_path).resolve()),
            "text_fields": list(text_fields or ["text"]),
            "id_field": corpus.id_field,
            "rows": corpus.rows,
            "rejected": len(corpus.rejected),
        }
        write_index(
            index_dir,
            embedder.strategy,
            corpus.entries,
            vectors,
            owners,
            source=source,
            transform=transform,
            index_kind=index_kind,
            storage=storage,
        )
    return BuildReport(
        index_dir=Path(index_dir),
        strategy=embedder.strategy,
        entries=len(corpus.entries),
        vectors=len(vectors),
        dimension=vectors.shape[1],
        rejected=corpus.rejected,
        rejection_summary=corpus.rejection_summary(),
        seconds=time.perf_counter() - started,
        embed_seconds=embed_seconds,
    )
