"""Texts -> vectors for other programs: what bert-as-service's ``BertClient().encode`` was for.

``encode(texts, strategy=...)`` gives the vectors of a strategy (model, layers, pooling...), as an
index built with it embeds its queries; ``encode(texts, index=IDX)`` gives exactly what that index
compares: its stored strategy and its fitted post-processing (centering, whitening). ``Encoding``
is the same thing kept loaded, for many calls (the server holds one); ``encode_file`` streams a
file of any size to ``.npy`` or JSON lines in bounded memory (``semsearch encode``).

The rules every surface shares (Python, CLI, HTTP) live here: a text is a non-blank string of
valid Unicode (``check_texts``; zero-width or control characters alone are blank), and a strategy
with post-processing needs an index's statistics.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

import numpy as np

from indexer.embedding.strategy import Strategy, check_role
from indexer.embedding.transform import Transform
from indexer.encoders.options import EmbeddingOptions, given
from indexer.errors import BadInput
from indexer.files import staged_file
from indexer.progress import Progress, Share
from indexer.reading.corpus import CorpusOptions, CorpusReader, Entry, blank
from indexer.reading.decoding import line_text, read_lines
from search.read.queries import check_text

if TYPE_CHECKING:  # an index's encoder runs its exported graph: no torch
    from indexer.encoders.base import Encoder, NetworkEncoder

Roles = str | Sequence[str]
"""Which prefix texts are read with: ``query`` or ``passage``, for all of them or one per text."""
PART_TEXTS = 256
"""Texts embedded at a time when streaming: memory holds one part and its vectors."""
OUTPUTS = ("npy", "jsonl")
"""What ``encode_file`` writes: a float32 ``.npy`` matrix, or one ``{"id", "vector"}`` per line."""
EXTENSIONS = {".npy": "npy", ".jsonl": "jsonl", ".ndjson": "jsonl"}
"""The output's extension (whatever its case) -> the format it names; any other names none."""


def check_texts(texts: Iterable[object], first: int = 1) -> list[str]:
    """``texts`` as a list, when each can be encoded: a string with some non-blank text, valid
    Unicode. The first that cannot is an error naming its position (counted from ``first``): a
    text is never dropped, so row i of the vectors is always text i."""
    if isinstance(texts, str | bytes):
        raise BadInput("texts: give a list of strings, not one string (wrap it: [text])")
    checked = list(texts)
    for position, text in enumerate(checked, first):
        if not isinstance(text, str):
            raise BadInput(f"text {position} is not a string but {type(text).__name__}")
        if blank(text):
            raise BadInput(f"text {position} is empty: every text is encoded, in order; give some text")
        check_text(text, f"text {position}")
    return checked


@dataclass(frozen=True)
class Encoding:
    """An encoder kept loaded with the post-processing its vectors get: ``encode`` many times.
    ``Encoding.load(strategy)`` or ``Encoding.load(index=IDX)``; an index's snapshot holds one
    (``search.read.engine.Snapshot.encoding``), which its queries embed with."""

    embedder: Encoder
    transform: Transform | None = None
    embeds: bool = True
    """False: for a search that reads no query vector (``vectorless``)."""

    @classmethod
    def load(
        cls,
        strategy: Strategy | None = None,
        *,
        index: str | Path | None = None,
        serving: bool = False,
        options: EmbeddingOptions | None = None,
    ) -> Encoding:
        """The encoder of ``strategy`` (default: the bundled model's), or of the index at
        ``index`` (its stored strategy and fitted transform; no FAISS vectors are read).
        ``serving``: the query encoder an index gives its queries (threads asleep between
        requests; ``auto`` is the CPU) rather than the bulk one (threads spinning, for
        throughput); same vectors. ``options``: where and how the network runs
        (``indexer.encoders.options``); a GPU asked for and missing is said before anything loads."""
        from indexer.encoders.factory import encoder_for

        options = given(options)
        options = (options.for_serving() if serving else options).checked()
        if index is not None:
            if strategy is not None:
                raise BadInput(
                    "give a strategy or an index, not both: an index encodes with its stored strategy"
                )
            from indexer.store import open_index

            stored = open_index(index, vectors=False)
            stored.catalog.close()
            encoder = encoder_for(stored.strategy, options, queries=True, held=stored.graph)
            return cls(encoder, stored.transform)
        strategy = strategy or Strategy()
        if strategy.postprocess != "none":
            raise BadInput(
                "post-processing needs statistics fitted on a corpus: encode with an index built with "
                "it (--index IDX, index=IDX, or serve IDX) or drop --postprocess"
            )
        if serving:
            from indexer.embedding.models import resolve_strategy

            return cls(encoder_for(resolve_strategy(strategy), options, queries=True))
        return cls(encoder_for(strategy, options))

    def vectorless(self) -> Encoding:
        """This encoding for a search that reads no query vector (a keyword search): ``embed``
        gives each text an empty vector and runs no model."""
        return replace(self, embeds=False)

    @property
    def strategy(self) -> Strategy:
        """The resolved strategy the vectors follow."""
        return self.embedder.strategy

    @functools.cached_property
    def dimension(self) -> int:
        """Width of a vector (after whitening, if it keeps fewer); embeds one word to know it."""
        return int(self.encode(["dimension"]).shape[1])

    def embed(
        self, texts: Sequence[str], *, progress: Share | None = None, role: Roles = "query"
    ) -> np.ndarray:
        """The final vectors of ``texts`` (checked already): the model's, each text read as its
        ``role`` (one for all, or one per text: a query and its candidates), then the index's fitted
        post-processing, if any. Texts whose roles share a prefix are embedded in one pass."""
        texts = list(texts)
        if not self.embeds:
            return np.zeros((len(texts), 0), dtype=np.float32)
        roles = [role] * len(texts) if isinstance(role, str) else list(role)
        by_prefix: dict[str, list[int]] = {}
        for i, each in enumerate(roles):
            by_prefix.setdefault(self.strategy.prefix(check_role(each)), []).append(i)
        if len(by_prefix) == 1:
            vectors = self.embedder.embed(texts, progress=progress, role=roles[0] if roles else "query")
        else:
            vectors = np.zeros((len(texts), 0), dtype=np.float32)
            for rows in by_prefix.values():
                part = self.embedder.embed([texts[i] for i in rows], role=roles[rows[0]])
                if vectors.shape[1] == 0:
                    vectors = np.zeros((len(texts), part.shape[1]), dtype=np.float32)
                vectors[rows] = part
        return Transform.apply_optional(self.transform, vectors)

    def tokenize(self, texts: Sequence[str], role: Roles = "query") -> list[list[int]]:
        """Each text's token ids as the model reads them in ``embed`` (its role's prefix before
        it, cut at max_length): what the server counts and batches by before the model runs. A
        served encoder runs in this process: a ``NetworkEncoder``, with its tokenizer."""
        tokens = cast("NetworkEncoder", self.embedder).tokens
        roles = [role] * len(texts) if isinstance(role, str) else list(role)
        found: list[list[int]] = [[] for _ in texts]
        by_role: dict[str, list[int]] = {}
        for i, each in enumerate(roles):
            by_role.setdefault(check_role(each), []).append(i)
        for each, rows in by_role.items():
            for i, ids in zip(rows, tokens.ids([texts[i] for i in rows], each), strict=True):
                found[i] = ids
        return found

    def embed_tokens(self, ids: Sequence[Sequence[int]]) -> np.ndarray:
        """The final vectors of texts tokenised by ``tokenize``: ``embed`` from its token ids, in the
        passes the one batching rule plans."""
        vectors = cast("NetworkEncoder", self.embedder).embed_ids(ids)
        return Transform.apply_optional(self.transform, vectors)

    def encode(self, texts: Iterable[str], *, progress: bool = False, as_: str = "query") -> np.ndarray:
        """A float32 matrix, row i the vector of text i (``check_texts``); any number of texts,
        embedded a part at a time. Texts longer than the strategy's max_length are cut there.
        ``as_``: ``query`` (what an index compares its questions by) or ``passage`` (as it embeds
        its entries): each with the strategy's prefix for it."""
        parts = list(self.parts(texts, progress=progress, as_=as_))
        if not parts:
            raise BadInput("no texts to encode")
        return np.concatenate(parts)

    def parts(
        self, texts: Iterable[str], *, progress: bool = False, size: int = PART_TEXTS, as_: str = "query"
    ) -> Iterator[np.ndarray]:
        """The vectors of ``texts``, ``size`` texts at a time, as they are read: an iterator of
        texts of any length is encoded in bounded memory."""
        if isinstance(texts, str | bytes):
            check_texts(texts)
        rows = (("", text) for text in texts)
        return (vectors for _, vectors in self.pieces(rows, progress=progress, size=size, as_=as_))

    def pieces(
        self,
        rows: Iterable[tuple[str, str]],
        *,
        progress: bool = False,
        size: int = PART_TEXTS,
        as_: str = "query",
    ) -> Iterator[tuple[list[str], np.ndarray]]:
        """``(ids, vectors)`` of ``(id, text)`` rows as ``as_`` texts, ``size`` rows at a time, in
        order. For a network in this process, each part is tokenised on a thread of its own while
        the network embeds the part before it (the Rust tokenizer's batch call releases the GIL).
        The rows are read here, one part ahead, not on that thread: a source that waits for its
        writer (stdin, a pipe) then waits where a stop (Ctrl-C, SIGTERM) reaches it."""
        check_role(as_)
        tokenising = self.embeds and hasattr(self.embedder, "embed_ids")
        source, done = iter(rows), 0
        waiting: tuple[list[str], list[str], Future[list[list[int]]] | None] | None = None
        with Progress(None, "encoding", enabled=progress) as bar, ThreadPoolExecutor(1, "tokenise") as pool:
            while True:
                part = list(islice(source, size))
                if part:
                    texts = check_texts([text for _, text in part], done + 1)
                    tokens = pool.submit(self.tokenize, texts, as_) if tokenising else None
                    done += len(part)
                if waiting is not None:
                    ids, before, tokenised = waiting
                    if tokenised is None:
                        vectors = self.embed(before, role=as_)
                    else:
                        vectors = self.embed_tokens(tokenised.result())
                    yield ids, vectors.astype(np.float32, copy=False)
                    bar.advance(len(ids))
                if not part:
                    return
                waiting = [i for i, _ in part], texts, tokens

    def info(self) -> dict[str, Any]:
        """What the encode-only server's ``/info`` shows."""
        return {
            "strategy": self.strategy.to_dict(),
            "description": self.strategy.describe(),
            "encoder": self.embedder.decision.status,
            "dimension": self.dimension,
            "index": None,
        }


def encode(
    texts: Iterable[str],
    strategy: Strategy | None = None,
    *,
    index: str | Path | None = None,
    progress: bool = False,
    as_: str = "query",
) -> np.ndarray:
    """Vectors of ``texts`` (a list or any iterable of strings) as a float32 matrix, row i for
    text i, with ``strategy`` (default: the bundled model's own) or with the index at ``index``
    (its stored strategy and fitted centering/whitening: exactly the vectors it compares).
    ``as_``: the texts are ``query`` texts (default) or ``passage`` ones, each read with the
    strategy's prefix for it (``--query-prefix`` / ``--passage-prefix``).

    For many calls, load once: ``Encoding.load(strategy).encode(texts)``.
    """
    check_role(as_)
    return Encoding.load(strategy, index=index).encode(texts, progress=progress, as_=as_)


@dataclass(frozen=True)
class EncodeReport:
    output: str
    texts: int
    dimension: int
    seconds: float
    strategy: Strategy


def read_texts(
    source: str, reading: CorpusOptions | None = None, **given: Any
) -> Iterator[tuple[str, str]]:
    """``(id, text)`` of each row of a corpus file (CSV/TSV/JSONL/text lines, read as ``index``
    reads one, with ``reading`` or its fields as keywords: ``CorpusOptions``), or of each line of
    stdin for ``-`` (its line number as id), in order and as read.
    A row that cannot be encoded is an error naming it (or, if the file's rejections say it was
    read the wrong way, naming that: ``indexer.reading.mismatch``): a row is never skipped."""
    reading = CorpusOptions.of(reading, **given)
    if source == "-":
        if sys.stdin is None:
            raise BadInput("stdin is closed: give a file of texts to encode")
        if reading.fmt not in (None, "text"):
            raise BadInput(
                f"stdin is read as text lines, one text each: give a file for --format {reading.fmt}"
            )
        for number, line in enumerate(read_lines("stdin", sys.stdin.buffer, reading.encoding), 1):
            yield str(number), line_text(line)
        return
    reader = CorpusReader(
        source,
        reading,
        columns=False,  # nothing is stored: any field names will do
    )
    items = iter(reader)
    for item in items:
        if not isinstance(item, Entry):
            for _ in items:  # the whole file's checks first: a file read the wrong way says so
                pass
            raise BadInput(f"{source} {item.place()}: {item.reason} (every row is encoded, in order: fix it)")
        yield item.id, item.text


class _NpyWriter:
    """A ``.npy`` float32 matrix written as its rows arrive: the header says 0 rows until
    ``close`` writes the count over it (NumPy's header leaves room for any row count)."""

    def __init__(self, handle: IO[bytes]):
        self.handle, self.rows, self.dimension, self.header = handle, 0, 0, 0

    def _header(self) -> None:
        shape = {"descr": "<f4", "fortran_order": False, "shape": (self.rows, self.dimension)}
        np.lib.format.write_array_header_1_0(self.handle, shape)

    def write(self, ids: Sequence[str], vectors: np.ndarray) -> None:
        if not self.dimension:
            self.dimension = vectors.shape[1]
            self._header()
            self.header = self.handle.tell()
        self.handle.write(np.ascontiguousarray(vectors, dtype="<f4").tobytes())
        self.rows += len(vectors)

    def close(self) -> None:
        self.handle.seek(0)
        self._header()
        if self.handle.tell() != self.header:  # never: NumPy pads the header for this
            raise RuntimeError("the .npy header changed length")


class _JsonLinesWriter:
    """One ``{"id": ..., "vector": [...]}`` line per text."""

    def __init__(self, handle: IO[bytes]):
        self.handle, self.rows = handle, 0

    def write(self, ids: Sequence[str], vectors: np.ndarray) -> None:
        lines = (
            json.dumps({"id": i, "vector": v}, ensure_ascii=False)
            for i, v in zip(ids, vectors.tolist(), strict=True)
        )
        self.handle.write("".join(line + "\n" for line in lines).encode("utf-8"))
        self.rows += len(vectors)

    def close(self) -> None:
        self.handle.flush()


def format_refusal(output: str | Path | None, to: str | None, *, cli: bool = False) -> str | None:
    """Why the file ``output`` and the format ``to`` (None: not given) name no one format, None
    where they do: the extension names it (``EXTENSIONS``), or ``to`` does where the extension
    names none; a ``to`` the extension contradicts, or neither, is refused. stdout (``output``
    None or ``-``) has no extension and takes JSON lines only (``to="npy"`` is refused).
    ``cli``: the options are spelt ``-o`` and ``--to``."""
    if output in (None, "-"):
        if to == "npy":  # stdout takes JSON lines only
            give = "-o FILE.npy" if cli else "an output file (FILE.npy)"
            return f"a .npy matrix needs a file: give {give} (stdout takes JSON lines)"
        return None
    path = Path(output)
    named = EXTENSIONS.get(path.suffix.lower())
    given = f"-o {output}" if cli else f"output {str(output)!r}"
    if to is not None:
        if named is None or named == to:
            return None
        asked = f"--to {to}" if cli else f"to={to!r}"
        return f"{asked} contradicts {given}, whose extension {path.suffix!r} names {named}"
    if named is not None:
        return None
    option = "--to npy|jsonl" if cli else "to='npy' or 'jsonl'"
    said = "no extension names its format"
    if path.suffix:
        said = f"its extension {path.suffix!r} names no output format"
    return f"{given}: {said}; use .npy (a float32 matrix) or .jsonl/.ndjson (JSON lines), or give {option}"


def output_format(output: str | Path | None, to: str | None) -> str:
    """What ``encode_file`` writes: ``to`` if given, else what the output's extension names
    (``format_refusal``: an extension naming none, or another than ``to``, is refused); to
    stdout (``None`` or ``-``) only JSON lines (a ``.npy`` needs a file)."""
    if to is not None and to not in OUTPUTS:
        raise BadInput(f"unknown output format {to!r}: use one of {', '.join(OUTPUTS)}")
    refusal = format_refusal(output, to)
    if refusal is not None:
        raise BadInput(refusal)
    stdout = output in (None, "-")
    fmt = to or ("jsonl" if stdout else EXTENSIONS[Path(cast("str | Path", output)).suffix.lower()])
    if stdout and sys.stdout is None:
        raise BadInput("stdout is closed: give -o FILE for the vectors")
    return fmt


def encode_file(
    source: str,
    output: str | Path | None,
    encoding: Encoding,
    *,
    to: str | None = None,
    reading: CorpusOptions | None = None,
    progress: bool = False,
    as_: str = "query",
) -> EncodeReport:
    """Encode every text of ``source`` (``read_texts``) into ``output``: a float32 ``.npy``
    (row i = text i) or JSON lines (``output_format``), streamed a part at a time. A file is
    written beside its place and renamed into it when complete (``indexer.files``): a failure
    or a stop leaves no half file. ``output`` None or ``-``: JSON lines on stdout.
    ``reading``: how the source is read (``CorpusOptions``). ``as_``: the texts are queries or
    passages."""
    check_role(as_)
    started = time.perf_counter()
    kind = output_format(output, to)
    rows = read_texts(source, reading)
    if output in (None, "-"):
        writer = _JsonLinesWriter(sys.stdout.buffer)
        dimension = _stream(rows, encoding, writer, progress, as_)
        return EncodeReport(
            "stdout", writer.rows, dimension, time.perf_counter() - started, encoding.strategy
        )
    with staged_file(output) as file:
        writer = _NpyWriter(file) if kind == "npy" else _JsonLinesWriter(file)
        dimension = _stream(rows, encoding, writer, progress, as_)
    return EncodeReport(str(output), writer.rows, dimension, time.perf_counter() - started, encoding.strategy)


def _stream(
    rows: Iterator[tuple[str, str]],
    encoding: Encoding,
    writer: _NpyWriter | _JsonLinesWriter,
    progress: bool,
    as_: str,
) -> int:
    """Each part of ``rows`` encoded as ``as_`` texts and written; the vectors' width. No rows:
    an error."""
    dimension = 0
    for ids, vectors in encoding.pieces(rows, progress=progress, as_=as_):
        writer.write(ids, vectors)
        dimension = vectors.shape[1]
    if not writer.rows:
        raise BadInput("no texts to encode: the input is empty")
    writer.close()
    return dimension
