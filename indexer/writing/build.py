"""corpus -> texts -> vectors -> index: the one function the ``index`` command is a shell over.

The corpus is streamed: a first pass checks every row (rejections, duplicate ids across the whole
file) and types the fields, before any model loads; a second pass embeds it in parts of
``PART_ENTRIES`` and hands each part to the new version (``store.new_version``), so peak memory
is the model, one part and the vector index, however large the corpus. A corpus of one part is
read once: the first pass keeps its entries (no more than a part holds anyway).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from indexer.catalog import keyword_fields
from indexer.embedding.fields import FieldScoring, embed_entries
from indexer.embedding.strategy import Strategy
from indexer.encoders.options import EmbeddingOptions
from indexer.encoders.options import given as given_options
from indexer.errors import BadInput
from indexer.progress import Progress
from indexer.reading.corpus import CorpusOptions, CorpusReader, Entry, Rejection, rejection_summary
from indexer.reading.field_types import TypeCounter
from indexer.reading.rows import CorpusSource, source_name
from indexer.vectors.factory import KIND, STORAGE

PART_ENTRIES = 4096
"""Entries embedded and written at a time."""


@dataclass(frozen=True)
class BuildReport:
    """What a build did: entries and vectors written, the rows rejected (with their reasons)."""

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
    export_failure: str | None = None
    """Why the model could not be exported to ONNX: it was then indexed, and is queried, on torch."""
    notes: tuple[str, ...] = ()
    """What the reader said about how the corpus was read (a TSV's quoted fields of several lines)."""


@dataclass
class Survey:
    """What the first pass over a corpus learns: counts, rejected rows, field types."""

    entries: int
    rejected: list[Rejection]
    field_types: dict[str, str]
    kept: list[Entry] | None = None
    """Every entry, where there are no more than the survey's ``keep``; None where there are more."""


def survey_corpus(reader: CorpusReader, keep: int = 0) -> Survey:
    """Check every row of the corpus and type its fields, keeping its entries only while there
    are no more than ``keep`` (one part: the second pass then has nothing to read). The id
    field's column is text whatever its values: ids are text (``"01"`` is not ``"1"``)."""
    entries, rejected, counter = 0, [], TypeCounter()
    kept: list[Entry] | None = []
    for item in reader:
        if isinstance(item, Entry):
            entries += 1
            counter.add(item.fields)
            if kept is not None and entries <= keep:
                kept.append(item)
            else:
                kept = None
        else:
            rejected.append(item)
    types = counter.types()
    if reader.id_field in types:
        types[reader.id_field] = "text"
    return Survey(entries, rejected, types, kept)


def corpus_parts(
    reader: CorpusReader, survey: Survey, size: int = PART_ENTRIES
) -> Iterator[tuple[Entry, ...]]:
    """The corpus' entries, ``size`` at a time: those the survey kept, else the file read again,
    which must not have changed since the survey (same entry count), or the build stops with the
    live index untouched."""
    if survey.kept is not None:
        for start in range(0, len(survey.kept), size):
            yield tuple(survey.kept[start : start + size])
        return
    entries = (item for item in reader if isinstance(item, Entry))
    seen = 0
    while part := tuple(islice(entries, size)):
        seen += len(part)
        yield part
    if seen != survey.entries:
        raise BadInput(f"{reader.path} changed while it was being indexed: index it again")


def build_index(
    corpus: CorpusSource,
    index_dir: str | Path,
    strategy: Strategy | None = None,
    *,
    corpus_options: CorpusOptions | None = None,
    options: EmbeddingOptions | None = None,
    progress: bool = False,
    index_kind: str = KIND,
    storage: str = STORAGE,
    wait: float = 0,
    also: FieldScoring | str | Sequence[str] | None = None,
    reranker: str | Path | None = None,
    **given: Any,
) -> BuildReport:
    """Index a corpus into ``index_dir``, replacing any index there only once complete.
    ``corpus``: a file (CSV, TSV, JSON Lines, text), or rows: an iterable of dicts (or strings) or
    a pandas DataFrame (``indexer.reading.rows``); ``corpus_options``: how it is read (``CorpusOptions``:
    text and id fields, format, encoding, delimiter), or its fields as keywords
    (``text_fields=["question"]``). ``index_kind``: ``auto`` (exact below
    ``vectors.factory.EXACT_LIMIT`` vectors, IVF above), ``flat`` or ``ivf``; ``storage``:
    ``float32``, ``float16`` or ``sq8``; ``wait``: seconds to wait for another writer to finish;
    ``also``: a second vector per entry scored with the first
    (``indexer.embedding.fields``): its field names (``["question", "answer"]``) or a ``FieldScoring`` with
    a weight. ``options``: how the texts are embedded (``EmbeddingOptions``: device, precision,
    batch size, Ray; None: the defaults, ``auto`` taking a GPU torch sees); they decide the encoder
    (``indexer.encoders.factory``). ``reranker``: a cross-encoder's folder stored as the index's
    default reranker (its path and fingerprint; its files read, not loaded, before anything is
    built). A failed first build leaves no directory behind."""
    from indexer.encoders.factory import encoder_for
    from indexer.encoders.on_ray import RayEncoder
    from indexer.store import new_version

    started = time.perf_counter()
    options = given_options(options).checked()  # a GPU asked for and missing: said before anything
    also = FieldScoring.given(also)
    stored_reranker = None
    if reranker is not None:  # a folder that is no reranker: said before anything is built
        from indexer.embedding.cross_folder import read_cross_folder

        folder = read_cross_folder(reranker)
        stored_reranker = {"path": folder.path, "fingerprint": folder.fingerprint}
    reader = CorpusReader(corpus, corpus_options, **given)
    survey = survey_corpus(reader, keep=PART_ENTRIES)
    embed_seconds = 0.0
    searched = keyword_fields(reader.text_fields, also.also if also else (), list(survey.field_types))
    with new_version(index_dir, survey.field_types, wait=wait, keyword_fields=searched) as version:
        # the graph the index's queries will run is exported now, if it can be (its export_failure)
        encoder = encoder_for(strategy, options, export_queries=True)
        on_ray = isinstance(encoder, RayEncoder)  # one Ray session for every part, parts its size
        size = encoder.part_entries if on_ray else PART_ENTRIES
        bar = Progress(survey.entries, "embedding", enabled=progress)
        with bar, encoder.session() if on_ray else contextlib.nullcontext():
            done = 0
            for part in corpus_parts(reader, survey, size):
                embed_started = time.perf_counter()
                step = bar.step(len(part))
                vectors, owners, also_vectors = embed_entries(encoder, part, also, progress=step)
                embed_seconds += time.perf_counter() - embed_started
                version.add(part, vectors, owners, also_vectors if also else None)
                done += len(part)
                bar.reach(done)
        rows = survey.entries + len(survey.rejected)
        source = {
            "path": source_name(corpus),
            "text_fields": reader.text_fields,
            "id_field": reader.id_field,
            "rows": rows,
            "rejected": len(survey.rejected),
            # ids are row numbers: an add numbers its rows from here (indexer.writing.update)
            **({"next_row_id": rows + 1} if reader.id_field is None else {}),
            **({"also": also.to_dict()} if also else {}),
            "embedded": encoder.decision.record(),
        }
        meta = version.write(
            encoder.strategy, source=source, index_kind=index_kind, storage=storage, reranker=stored_reranker
        )
    return BuildReport(
        index_dir=Path(index_dir),
        strategy=encoder.strategy,
        entries=survey.entries,
        vectors=meta.vectors,
        dimension=meta.dimension,
        rejected=survey.rejected,
        rejection_summary=rejection_summary(survey.rejected),
        seconds=time.perf_counter() - started,
        embed_seconds=embed_seconds,
        export_failure=encoder.decision.export_failure,
        notes=tuple(reader.notes),
    )
