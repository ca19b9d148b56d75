"""The graph an index's queries run, held in the index: copied or ``rsync``-ed with it, an index
answers its first query on a machine with an empty cache and no torch, as fast as at home.

Each version directory holds the graph (``<key>.onnx`` and its weights ``<key>.onnx.data``, the
names of the cache: content-addressed by the model's fingerprint, the layers and the backend) and
the model's ``HELD_FILES`` (config and tokenizer) with the Dense modules the strategy runs after
pooling (``indexer.embedding.modules.base.held_files``). The model's files are copies the index
owns: nothing done to the model's folder changes or breaks an index. The graph's two files are
hard links where the file system allows: of the cache's when a build writes the first version
(checked first against the sums its export wrote beside them, ``intact``), of the previous
version's when a change writes the next, so every index of one model and strategy kind on one
disk shares one copy of the weights. semsearch replaces the cache's files, never writes into
them. The meta records the key (``IndexMeta.graph``) and, like every file of a version, their
sizes and checksums (``FILES``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from indexer.embedding.graphs import HELD_FILES, GraphSpec, graph_spec, held_graph
from indexer.embedding.models import model_file
from indexer.embedding.modules.base import held_files
from indexer.embedding.strategy import Strategy
from indexer.store.integrity import records


def hold_graph(version: Path, strategy: Strategy, live: GraphSpec | None = None) -> str | None:
    """Put the graph of ``strategy``'s queries into ``version``: the live version's (``live``),
    else the cache's, if intact. Returns its key, or None where no graph is held (a model the
    exporter fails on is queried on torch, as before; a damaged cached graph is exported again
    by the next query)."""
    spec = live if live is not None and live.exported else graph_spec(strategy)
    if not spec.exported or (spec.home is None and not intact(spec)):
        return None
    for name in HELD_FILES:
        found = model_file(spec.location, name)
        if found is not None:
            shutil.copyfile(found, version / name)
    for found, name in held_files(spec.location, strategy.modules):
        shutil.copyfile(found, version / name)
    _link(spec.weights, version / spec.weights.name)
    _link(spec.path, version / spec.path.name)
    return spec.key()


def holds(version: Path, strategy: Strategy, key: str | None) -> GraphSpec | None:
    """The graph a version holds under ``key`` (its meta's ``graph``), or None."""
    return None if key is None else held_graph(strategy, version, key)


def held_bytes(version: Path, key: str | None) -> int:
    """Bytes of the graph and model files a version holds (part of what a copy of the index
    weighs; on one disk, the graph shared through hard links with the cache and the other versions)."""
    if key is None:
        return 0
    names = [f"{key}.onnx", f"{key}.onnx.data", *HELD_FILES]
    return sum((version / name).stat().st_size for name in names if (version / name).is_file())


def write_sums(spec: GraphSpec, made: Path) -> None:
    """Keep beside the cache's graph (``spec.sums``) the sizes and CRC-32 sums of its two files as
    exported into ``made``, before they move in: a graph in place always has its sums."""
    found = records(made, [spec.path.name, spec.weights.name])
    handle, temporary = tempfile.mkstemp(dir=spec.sums.parent, suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            json.dump(found, f)
        os.replace(temporary, spec.sums)
    finally:
        Path(temporary).unlink(missing_ok=True)


def intact(spec: GraphSpec) -> bool:
    """The cache's graph is in place with the sizes and sums its export wrote. One that is not
    (a file truncated, written into) is noted on stderr in one line and its sums dropped, so
    it is exported again, never loaded nor held by an index."""
    try:
        stats = tuple(_stat(path) for path in (spec.path, spec.weights, spec.sums))
    except OSError:
        return False
    if _matches(spec.sums, spec.path, spec.weights, stats):
        return True
    print(
        f"note: the cached graph {spec.weights} does not match the sums written when it was "
        "exported: exporting it again",
        file=sys.stderr,
    )
    with contextlib.suppress(OSError):  # a cache it cannot write: the export says why
        spec.sums.unlink(missing_ok=True)
    return False


def _stat(path: Path) -> tuple[int, ...]:
    """What no rewrite of a file keeps (``indexer.embedding.fingerprints``): a check of it holds
    as long as these do."""
    found = path.stat()
    return (found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns)


@functools.lru_cache(maxsize=32)
def _matches(sums: Path, graph: Path, weights: Path, stats: tuple[tuple[int, ...], ...]) -> bool:
    """The graph's files against their ``sums``, summed once a process while ``stats`` hold."""
    try:
        said = json.loads(sums.read_text(encoding="utf-8"))
        return said == records(graph.parent, [graph.name, weights.name])
    except (OSError, ValueError):
        return False


def _link(source: Path, target: Path) -> None:
    """``target`` as a hard link of ``source`` (no bytes copied) or, across file systems, a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
