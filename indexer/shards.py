"""Embedding on many machines: each worker writes a shard (its entries and their vectors, with the
strategy that made them); one merge step turns the shards into an ordinary index. The workers can
be any engine's (Ray tasks, Spark partitions, a batch queue): a shard is plain files.

    shard/entries.jsonl   one {"id", "text", "fields"} per entry (UTF-8)
    shard/vectors.npy     float32 vectors; shard/owners.npy: entry position of each vector
    shard/strategy.json   the resolved strategy (all shards of an index must agree; the model is
                          compared by its fingerprint, so each machine may keep it at its own path)
    shard/source.json     the corpus fields the texts were made of: {"text_fields", "id_field"}
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from indexer.corpus import Entry
from indexer.errors import BadInput
from indexer.strategy import Strategy


def embed_shard(
    entries: Sequence[Entry],
    out_dir: str | Path,
    strategy: Strategy | None = None,
    *,
    text_fields: Sequence[str] | None = None,
    id_field: str | None = None,
) -> Path:
    """Embed ``entries`` with ``strategy`` into a shard directory (a worker's whole job).
    ``text_fields``/``id_field``: what ``read_corpus`` was given, kept for the merged index."""
    from indexer.embedding import Embedder

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    embedder = Embedder(strategy)
    vectors, owners = embedder.embed_documents([e.text for e in entries])
    np.save(out / "vectors.npy", vectors)
    np.save(out / "owners.npy", owners)
    with (out / "entries.jsonl").open("w", encoding="utf-8") as f:
        for e in entries:
            f.write(json.dumps({"id": e.id, "text": e.text, "fields": e.fields}, ensure_ascii=False) + "\n")
    source = {"text_fields": list(text_fields or ["text"]), "id_field": id_field}
    (out / "source.json").write_text(json.dumps(source), encoding="utf-8")
    (out / "strategy.json").write_text(json.dumps(embedder.strategy.to_dict()), encoding="utf-8")
    return out


def _read_shard(shard: Path) -> tuple[Strategy, dict[str, Any], list[Entry], np.ndarray, np.ndarray]:
    from indexer.models import identified

    try:
        strategy = Strategy.from_dict(json.loads((shard / "strategy.json").read_text(encoding="utf-8")))
        if strategy.model_fingerprint is None:  # written before fingerprints: identify it here
            strategy = identified(strategy)
        source_file = shard / "source.json"
        source = (
            json.loads(source_file.read_text(encoding="utf-8"))
            if source_file.is_file()
            else {"text_fields": ["text"], "id_field": None}  # shards written before source.json
        )
        with (shard / "entries.jsonl").open(encoding="utf-8") as f:
            entries = [Entry(r["id"], r["text"], r["fields"]) for r in map(json.loads, f)]
        return strategy, source, entries, np.load(shard / "vectors.npy"), np.load(shard / "owners.npy")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadInput(f"not a readable shard: {shard}: {exc}") from None


def merge_shards(
    shards: Sequence[str | Path], index_dir: str | Path, *, index_kind: str = "auto", storage: str = "float32"
) -> int:
    """Merge shard directories into one index (atomic, like a build). Returns the entry count."""
    from indexer.store import building, write_index
    from indexer.transform import Transform

    if not shards:
        raise BadInput("no shards to merge")
    entries: list[Entry] = []
    vectors, owners = [], []
    strategy, source = None, None
    for shard in map(Path, shards):
        found, found_source, part, shard_vectors, shard_owners = _read_shard(shard)
        if strategy is not None and strategy.differences(found):
            raise BadInput(
                f"shard {shard} was embedded with another strategy: {found.describe()} "
                f"({', '.join(strategy.differences(found))} differ)"
            )
        if source is not None and found_source != source:
            raise BadInput(
                f"shard {shard} was made from other text fields or id field: {found_source} (not {source})"
            )
        strategy, source = strategy or found, found_source
        owners.append(shard_owners + len(entries))
        vectors.append(shard_vectors)
        entries += part
    ids = [e.id for e in entries]
    if len(set(ids)) != len(ids):
        raise BadInput("the shards share entry ids: each entry must be in one shard only")
    merged = np.concatenate(vectors)
    transform = Transform.for_strategy(strategy, merged)  # on the whole corpus, as a build would
    merged = Transform.apply_optional(transform, merged)
    with building(Path(index_dir)):
        write_index(
            index_dir,
            strategy,
            entries,
            merged,
            np.concatenate(owners),
            transform=transform,
            source={"shards": [str(Path(s).resolve()) for s in shards], **source},
            index_kind=index_kind,
            storage=storage,
        )
    return len(entries)
