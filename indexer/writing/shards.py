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
from typing import TYPE_CHECKING, Any

import numpy as np

from indexer.embedding.strategy import Strategy
from indexer.errors import BadInput, SemsearchError, StrategyConflict
from indexer.reading.corpus import Entry, check_field_names
from indexer.vectors.factory import KIND, STORAGE

if TYPE_CHECKING:
    from indexer.encoders.options import EmbeddingOptions


def embed_shard(
    entries: Sequence[Entry],
    out_dir: str | Path,
    strategy: Strategy | None = None,
    *,
    text_fields: Sequence[str] | None = None,
    id_field: str | None = None,
    options: EmbeddingOptions | None = None,
) -> Path:
    """Embed ``entries`` with ``strategy`` into a shard directory (a worker's whole job).
    ``text_fields``/``id_field``: what ``read_corpus`` was given, kept for the merged index;
    ``options``: where and how the worker embeds (a model's own code runs only if they allow it)."""
    from indexer.encoders.factory import encoder_for

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    encoder = encoder_for(strategy, options)  # as a build embeds: no torch once the graph is cached
    vectors, owners = encoder.embed_documents([e.text for e in entries])
    np.save(out / "vectors.npy", vectors)
    np.save(out / "owners.npy", owners)
    with (out / "entries.jsonl").open("w", encoding="utf-8") as f:
        for e in entries:
            f.write(json.dumps({"id": e.id, "text": e.text, "fields": e.fields}, ensure_ascii=False) + "\n")
    source = {"text_fields": list(text_fields or ["text"]), "id_field": id_field}
    (out / "source.json").write_text(json.dumps(source), encoding="utf-8")
    (out / "strategy.json").write_text(json.dumps(encoder.strategy.to_dict()), encoding="utf-8")
    return out


def _read_shard(shard: Path) -> tuple[Strategy, dict[str, Any], list[Entry], np.ndarray, np.ndarray]:
    from indexer.embedding.models import identified

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
            entries = [_entry(record) for record in map(json.loads, f)]
        return strategy, source, entries, np.load(shard / "vectors.npy"), np.load(shard / "owners.npy")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadInput(f"not a readable shard: {shard}: {exc}") from None


def _entry(record: Any) -> Entry:
    """One line of ``entries.jsonl``: an id and a text (strings), and an object of fields."""
    if not isinstance(record, dict):
        raise ValueError("an entry that is not a JSON object")
    entry = Entry(record["id"], record["text"], record["fields"])
    if not isinstance(entry.id, str) or not entry.id.strip() or not isinstance(entry.text, str):
        raise ValueError(f"entry {entry.id!r}: the id must be a non-empty string and the text a string")
    if not isinstance(entry.fields, dict):
        raise ValueError(f"entry {entry.id!r}: fields must be a JSON object")
    return entry


def _check_part(name: str, entries: Sequence[Entry], vectors: Any, owners: Any, dimension: int) -> None:
    """What a merged index relies on, checked before anything is written: finite, non-zero float
    vectors of the index's dimension, one owner (an entry of this part) per vector, and every
    entry owning at least one vector (else it could never be found, or would answer for another)."""
    if not isinstance(vectors, np.ndarray) or vectors.ndim != 2 or vectors.dtype.kind != "f":
        raise BadInput(f"{name}: the vectors must be a 2-d array of floats, not {_shape(vectors)}")
    if vectors.shape[1] != dimension:
        raise BadInput(f"{name}: vectors of dimension {vectors.shape[1]}, expected {dimension}")
    if not isinstance(owners, np.ndarray) or owners.shape != (len(vectors),) or owners.dtype.kind not in "iu":
        raise BadInput(
            f"{name}: the owners must be {len(vectors)} integers (one per vector), not {_shape(owners)}"
        )
    if len(owners) and (owners.min() < 0 or owners.max() >= len(entries)):
        raise BadInput(f"{name}: a vector's owner is not one of its {len(entries)} entries")
    without = np.flatnonzero(np.bincount(owners, minlength=len(entries)) == 0)
    if len(without):
        raise BadInput(
            f"{name}: {len(without)} entries have no vector (the first: {entries[without[0]].id!r})"
        )
    try:
        check_field_names(dict.fromkeys(field for e in entries for field in e.fields))
    except BadInput as exc:
        raise BadInput(f"{name}: {exc}") from None
    norms = np.linalg.norm(np.asarray(vectors, dtype=np.float32), axis=1)
    if not np.isfinite(norms).all() or not norms.all():
        row = int(np.argmin(np.isfinite(norms) & (norms > 0)))
        raise BadInput(f"{name}: vector {row} is not finite or is all zeros")


def _shape(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype} of shape {value.shape}"
    return type(value).__name__


def combine(
    parts: Sequence[tuple[Strategy, Sequence[Entry], np.ndarray, np.ndarray]], where: Sequence[str]
) -> tuple[Strategy, list[Entry], np.ndarray, np.ndarray]:
    """Parts embedded apart (shards, Ray partitions), in order, as one set of entries and vectors:
    every part must have been embedded with the same strategy (``where`` names each part for the
    error), be consistent in itself (``_check_part``), and no entry may be in two parts."""
    if not parts:
        raise BadInput("no shards to merge")
    strategy = parts[0][0]
    dimension = _dimension(strategy, parts[0][2])
    entries: list[Entry] = []
    vectors, owners = [], []
    for (found, part, part_vectors, part_owners), name in zip(parts, where, strict=True):
        if strategy.differences(found):
            raise BadInput(
                f"{name} was embedded with another strategy: {found.describe()} "
                f"({', '.join(strategy.differences(found))} differ)"
            )
        _check_part(name, part, part_vectors, part_owners, dimension)
        owners.append(np.asarray(part_owners, dtype=np.int64) + len(entries))
        vectors.append(np.asarray(part_vectors, dtype=np.float32))
        entries += part
    ids = [e.id for e in entries]
    if len(set(ids)) != len(ids):
        raise BadInput("the shards share entry ids: each entry must be in one shard only")
    check_field_names(dict.fromkeys(field for e in entries for field in e.fields))  # across parts
    return strategy, entries, np.concatenate(vectors), np.concatenate(owners)


def _dimension(strategy: Strategy, first: Any) -> int:
    """The width the strategy's model makes (from its config file), else the first part's."""
    from indexer.embedding.models import model_facts_from_files

    try:  # the model may live at another path on the worker that embedded the shard
        facts = model_facts_from_files(strategy.model) if strategy.model else None
    except (SemsearchError, OSError, ValueError):
        facts = None
    if facts is not None:
        return strategy.dimension(facts.hidden_size)
    return first.shape[1] if isinstance(first, np.ndarray) and first.ndim == 2 else 0


def _check_model(model: str, shards: Sequence[tuple[str | Path, Strategy]]) -> None:
    """The index's queries run the model at ``model`` as it is now (its graph is held from it):
    it must be the model every shard was embedded with, by fingerprint, not just by path."""
    from indexer.embedding.models import is_local, model_fingerprint

    if not is_local(model):
        return
    found = model_fingerprint(model)
    for shard, strategy in shards:
        if strategy.model_fingerprint not in (None, found):
            raise StrategyConflict(
                f"shard {shard} was embedded with the model {strategy.model_fingerprint[:19]}, but the "
                f"model at {Path(model).resolve()} is now {found[:19]}: embed the shards again with it, "
                "or put the shards' model back"
            )


def merge_shards(
    shards: Sequence[str | Path], index_dir: str | Path, *, index_kind: str = KIND, storage: str = STORAGE
) -> int:
    """Merge shard directories into one index (atomic, like a build). Returns the entry count."""
    from indexer.embedding.transform import Transform
    from indexer.store import write_index

    if not shards:
        raise BadInput("no shards to merge")
    read = [_read_shard(Path(shard)) for shard in shards]
    source = read[0][1]
    for shard, (_, found_source, *_rest) in zip(shards, read, strict=True):
        if found_source != source:
            raise BadInput(
                f"shard {shard} was made from other text fields or id field: {found_source} (not {source})"
            )
    strategy, entries, merged, owners = combine(
        [(strategy, part, v, o) for strategy, _, part, v, o in read], [f"shard {s}" for s in shards]
    )
    _check_model(strategy.model, [(shard, found) for shard, (found, *_) in zip(shards, read, strict=True)])
    transform = Transform.for_strategy(strategy, merged)  # on the whole corpus, as a build would
    merged = Transform.apply_optional(transform, merged)
    write_index(
        index_dir,
        strategy,
        entries,
        merged,
        owners,
        transform=transform,
        source={"shards": [str(Path(s).resolve()) for s in shards], **source},
        index_kind=index_kind,
        storage=storage,
    )
    return len(entries)
