"""corpus -> texts -> vectors -> index: the one function the ``index`` command is a shell over.

A build is a pipeline of four stages with bounded queues between them, so the slowest sets the
pace (``indexer.stages``): the corpus is read and every row checked and typed on one
thread, in parts of ``PART_ENTRIES``, while the model loads; each part is tokenised on a second
thread (one batch call of the Rust tokenizer, which releases the GIL) while the network embeds the
part before (its kernels release the GIL too); each embedded part is written on a fourth thread
(its vectors to the version's spool, its rows to SQLite). Peak memory is the model, a few parts
and the vector index, however large the corpus.

The corpus is read once. SQLite's columns are typed by the whole corpus, which only its end
knows: the version's catalog is made with the types its first part shows and, where a later row
retypes a column (a field empty in the first part, a number column with a word further on),
made again at the end from a second read of the file (``VersionWriter.settle``). What stays
sequential, and why: rows are written in file order (row ids follow it, and the vectors' spool
is appended in the same order), and the vector index is built once every row is in (an IVF
index is trained on a sample of all the vectors); the keyword table reads each part's rows as the
writer puts them (``KeywordTable.keep_up_keywords``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from indexer.catalog import keyword_fields
from indexer.embedding.fields import FieldScoring, embed_entries, entry_texts
from indexer.embedding.strategy import Strategy
from indexer.encoders.options import EmbeddingOptions
from indexer.encoders.options import given as given_options
from indexer.errors import BadInput
from indexer.progress import Progress
from indexer.reading.corpus import CorpusOptions, CorpusReader, Entry, Rejection, rejection_summary
from indexer.reading.field_types import TypeCounter
from indexer.reading.rows import CorpusSource, source_name
from indexer.stages import Ahead, Behind
from indexer.vectors.factory import KIND, STORAGE

if TYPE_CHECKING:
    from indexer.embedding.head import Tokenized
    from indexer.encoders.base import NetworkEncoder
    from indexer.store.writer import VersionWriter

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


READ_AHEAD = 4
"""Parts read ahead of the embedding (each ``PART_ENTRIES`` entries)."""
WRITE_BEHIND = 2
"""Embedded parts waiting to be written."""
TOKENISE_AHEAD = 2
"""Parts tokenised ahead of the one the network embeds."""


@dataclass(frozen=True)
class Part:
    """Entries read together, and the field types of the corpus up to them."""

    entries: tuple[Entry, ...]
    types: dict[str, str]


class CorpusParts:
    """A corpus read once, ``size`` entries at a time, counting its rejected rows and typing its
    fields as it goes (``TypeCounter``); iterated on the reading stage."""

    def __init__(self, reader: CorpusReader, size: int):
        self.reader, self.size = reader, size
        self.entries = 0
        self.rejected: list[Rejection] = []
        self.counter = TypeCounter()

    def __iter__(self) -> Iterator[Part]:
        part: list[Entry] = []
        add, rejected = self.counter.add, self.rejected
        for item in self.reader:
            if type(item) is Entry:
                add(item.fields)
                part.append(item)
                if len(part) == self.size:
                    self.entries += len(part)
                    yield Part(tuple(part), self.types())
                    part = []
            else:
                rejected.append(item)
        if part:
            self.entries += len(part)
            yield Part(tuple(part), self.types())

    def types(self) -> dict[str, str]:
        """The fields' types so far; the id field's is text whatever its values (ids are text:
        ``"01"`` is not ``"1"``)."""
        types = self.counter.types()
        ids = self.reader.id_field or self.reader.ids_from
        for name in types:
            if ids is not None and name.casefold() == ids.casefold():
                types[name] = "text"
        return types

    def again(self) -> Iterator[tuple[Entry, ...]]:
        """The entries read once more, ``size`` at a time; the file must not have changed since
        (same entry count), or the build stops with the live index untouched."""
        entries = (item for item in self.reader if isinstance(item, Entry))
        seen = 0
        while part := tuple(islice(entries, self.size)):
            seen += len(part)
            if seen > self.entries:
                break
            yield part
        if seen != self.entries:
            raise BadInput(f"{self.reader.path} changed while it was being indexed: index it again")


def grouped(parts: Iterable[Part], size: int) -> Iterator[Part]:
    """Parts joined to at least ``size`` entries (Ray's parts are larger than a read's)."""
    held: list[Part] = []
    for part in parts:
        held.append(part)
        if sum(len(p.entries) for p in held) >= size:
            yield Part(tuple(e for p in held for e in p.entries), held[0].types)
            held = []
    if held:
        yield Part(tuple(e for p in held for e in p.entries), held[0].types)


@dataclass
class Streamed:
    """What the pipeline leaves for the version's write: the encoder, the parts read, the time
    spent embedding."""

    encoder: Any
    parts: CorpusParts
    embed_seconds: float


def stream(
    reader: CorpusReader,
    version: VersionWriter,
    strategy: Strategy | None,
    options: EmbeddingOptions,
    also: FieldScoring | None,
    progress: bool,
) -> Streamed:
    """Read, embed and write the corpus into ``version`` (module docstring): the model loads
    while the first parts are read; the bar counts entries embedded and ends on the last written."""
    from indexer.encoders.factory import encoder_for
    from indexer.encoders.on_ray import RayEncoder

    parts = CorpusParts(reader, PART_ENTRIES)
    searched = also.also if also else ()

    def write(item: tuple[Part, Any, Any, Any]) -> None:
        part, vectors, owners, also_vectors = item
        chunks = version.add_vectors(len(part.entries), vectors, owners, also_vectors)
        if version.catalog is None:
            version.open_catalog(part.types, keyword_fields(reader.text_fields, searched, list(part.types)))
        version.put_entries(part.entries, chunks)

    embed_seconds = 0.0
    with Ahead(parts, READ_AHEAD, "read corpus") as read:
        # the graph the index's queries will run is exported now, if it can be (its export_failure)
        encoder = encoder_for(strategy, options, export_queries=True)
        on_ray = isinstance(encoder, RayEncoder)
        bar = Progress(None, "embedding", enabled=progress)
        writes = Behind(write, WRITE_BEHIND, "write version")
        ready: Iterable[tuple[Part, Tokenized | None]]
        if on_ray:  # one Ray session for every part; its workers tokenise parts larger than a read's
            ready, stage = ((p, None) for p in grouped(read, encoder.part_entries)), encoder.session()
        else:
            ready = stage = tokenised(read, encoder, also)
        with bar, writes, stage:
            for part, tokens in ready:
                if bar.total is None and not read.thread.is_alive():
                    bar.total_is(parts.entries)
                embed_started = time.perf_counter()
                step = bar.step(len(part.entries))
                vectors, owners, also_vectors = embed_entries(
                    encoder, part.entries, also, progress=step, tokens=tokens
                )
                embed_seconds += time.perf_counter() - embed_started
                writes.give((part, vectors, owners, also_vectors if also else None))
            writes.finish()
            bar.total_is(parts.entries)
    return Streamed(encoder, parts, embed_seconds)


def embed_parts(
    encoder: Any, entries: Sequence[Entry], also: FieldScoring | None, bar: Progress
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``embed_entries`` of many entries (an ``add``'s), ``PART_ENTRIES`` at a time, each part
    tokenised beside the network embedding the one before, as a build's stream does; the same
    vectors, owners and also-flags as one call (a Ray encoder, which tokenises on its workers,
    takes them in one)."""
    from indexer.encoders.on_ray import RayEncoder

    if isinstance(encoder, RayEncoder) or len(entries) <= PART_ENTRIES:
        return embed_entries(encoder, entries, also, progress=bar.step(len(entries)))
    cut = range(0, len(entries), PART_ENTRIES)
    parts = (Part(tuple(entries[start : start + PART_ENTRIES]), {}) for start in cut)
    vectors, owners, flags = [], [], []
    with tokenised(parts, encoder, also) as ready:
        for start, (part, tokens) in zip(cut, ready, strict=True):
            step = bar.step(len(part.entries))
            done = embed_entries(encoder, part.entries, also, progress=step, tokens=tokens)
            vectors.append(done[0])
            owners.append(done[1] + start)
            flags.append(done[2])
    return np.concatenate(vectors), np.concatenate(owners), np.concatenate(flags)


def tokenised(parts: Iterable[Part], encoder: NetworkEncoder, also: FieldScoring | None) -> Ahead:
    """Each part with its texts' tokens, made on a stage of their own: the Rust tokenizer's batch
    call releases the GIL, so the next part is tokenised while the network embeds this one."""

    def tokenise() -> Iterator[tuple[Part, Tokenized]]:
        for part in parts:
            yield part, encoder.tokens.documents(entry_texts(part.entries, also))

    return Ahead(tokenise(), TOKENISE_AHEAD, "tokenise")


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
    (``indexer.encoders.factory``). ``reranker``: a cross-encoder's folder (or Hub name) stored as the
    index's default reranker (``CrossFolder.stored``; its files read, not loaded, before anything
    is built). A failed first build leaves no directory behind."""
    from indexer.store import new_version

    started = time.perf_counter()
    options = given_options(options).checked()  # a GPU asked for and missing: said before anything
    also = FieldScoring.given(also)
    stored_reranker = None
    if reranker is not None:  # a folder that is no reranker: said before anything is built
        from indexer.embedding.cross_folder import read_cross_folder

        stored_reranker = read_cross_folder(reranker).stored()
    reader = CorpusReader(corpus, corpus_options, **given)
    with new_version(index_dir, None, wait=wait) as version:
        done = stream(reader, version, strategy, options, also, progress)
        parts, encoder = done.parts, done.encoder
        types = parts.types()
        searched = keyword_fields(reader.text_fields, also.also if also else (), list(types))
        version.settle(types, searched, parts.again)
        rows = parts.entries + len(parts.rejected)
        source = {
            "path": source_name(corpus),
            "text_fields": reader.text_fields,
            "id_field": reader.id_field,
            "rows": rows,
            "rejected": len(parts.rejected),
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
        entries=parts.entries,
        vectors=meta.vectors,
        dimension=meta.dimension,
        rejected=parts.rejected,
        rejection_summary=rejection_summary(parts.rejected),
        seconds=time.perf_counter() - started,
        embed_seconds=done.embed_seconds,
        export_failure=encoder.decision.export_failure,
        notes=tuple(reader.notes),
    )
