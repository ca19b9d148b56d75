"""What ``semsearch info`` shows of an index without loading it: the store's facts, and how its
queries will embed (the encoder decision, ``indexer.encoders.factory.encoder_status``, made
without loading anything). A served index tells its own (``search.snapshot.Snapshot.info``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def index_info(index_dir: str | Path) -> dict[str, Any]:
    """The index's facts (``StoredIndex.info``): meta and SQLite, no FAISS, no vectors."""
    from indexer.encoders.factory import encoder_status
    from indexer.store import open_index

    index = open_index(index_dir, vectors=False)
    return index.info(encoder_status(index.strategy, index.graph))
