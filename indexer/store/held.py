"""The graph an index's queries run, held in the index: copied or ``rsync``-ed with it, an index
answers its first query on a machine with an empty cache and no torch, as fast as at home.

Each version directory holds the graph (``<key>.onnx`` and its weights ``<key>.onnx.data``, the
names of the cache: content-addressed by the model's fingerprint, the layers and the backend) and
the model's ``HELD_FILES`` (config and tokenizer) with the Dense modules the strategy runs after
pooling (``indexer.embedding.modules.base.held_files``). They are hard links where the file system
allows: of the cache's files when a build writes the first version, of the previous version's
when a change writes the next, so every index of one model and strategy kind on one disk shares
one copy of the weights. The meta records the key (``IndexMeta.graph``) and, like every file of
a version, their sizes and checksums (``FILES``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from indexer.embedding.graphs import HELD_FILES, GraphSpec, graph_spec, held_graph
from indexer.embedding.models import model_file
from indexer.embedding.modules.base import held_files
from indexer.embedding.strategy import Strategy


def hold_graph(version: Path, strategy: Strategy, live: GraphSpec | None = None) -> str | None:
    """Put the graph of ``strategy``'s queries into ``version``: the live version's (``live``),
    else the cache's. Returns its key, or None where no graph is exported (a model the exporter
    fails on is queried on torch, as before)."""
    spec = live if live is not None and live.exported else graph_spec(strategy)
    if not spec.exported:
        return None
    for name in HELD_FILES:
        found = model_file(spec.location, name)
        if found is not None:
            _link(found, version / name)
    for found, name in held_files(spec.location, strategy.modules):
        _link(found, version / name)
    _link(spec.weights, version / spec.weights.name)
    _link(spec.path, version / spec.path.name)
    return spec.key()


def holds(version: Path, strategy: Strategy, key: str | None) -> GraphSpec | None:
    """The graph a version holds under ``key`` (its meta's ``graph``), or None."""
    return None if key is None else held_graph(strategy, version, key)


def held_bytes(version: Path, key: str | None) -> int:
    """Bytes of the graph and model files a version holds (part of what a copy of the index
    weighs; on one disk, shared through hard links with the cache and the other versions)."""
    if key is None:
        return 0
    names = [f"{key}.onnx", f"{key}.onnx.data", *HELD_FILES]
    return sum((version / name).stat().st_size for name in names if (version / name).is_file())


def _link(source: Path, target: Path) -> None:
    """``target`` as a hard link of ``source`` (no bytes copied; the cache replaces its files,
    never writes into them) or, across file systems, a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
