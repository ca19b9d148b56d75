"""What ``semsearch info`` shows of an index without loading it: the store's facts, and how its
queries will embed (the encoder decision, ``indexer.encoders.factory.encoder_status``, made
without loading anything). A served index tells its own (``search.read.snapshot.Snapshot.info``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def index_info(index_dir: str | Path) -> dict[str, Any]:
    """The index's facts (``StoredIndex.info``): meta and SQLite, no FAISS, no vectors."""
    from indexer.encoders.factory import encoder_status
    from indexer.store import open_index

    index = open_index(index_dir, vectors=False)
    info = index.info(encoder_status(index.strategy, index.graph))
    said = model_says(index.strategy)
    return {k: v for key, value in info.items() for k, v in _after_model(key, value, said)}


def _after_model(key: str, value: Any, said: str | None) -> list[tuple[str, Any]]:
    """The info's ``model`` followed by what its folder says (``model_says``)."""
    return [(key, value), ("model_says", said)] if key == "model" else [(key, value)]


def model_says(strategy: Any) -> str | None:
    """What the model's sentence-transformers folder says of how to embed with it (pooling, Dense
    and Normalize modules, prompts, casing), where the model is on this machine; None if nothing."""
    from indexer.embedding.folder import read_folder
    from indexer.embedding.models import model_location
    from indexer.errors import SemsearchError

    try:
        says = read_folder(model_location(strategy.model))
    except (SemsearchError, OSError, ValueError):
        return None
    if says.refused:
        return f"refused: {says.refused}"
    return ", ".join(says.said) or None
