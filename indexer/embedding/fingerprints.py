"""A local model's identity: a fingerprint of the files that decide its vectors (``FINGERPRINTED``),
not of where they lie, so the same model at another path is the same and a model changed in place
is another (``indexer.embedding.models.identified`` refuses it).

Hashing a model's weights (hundreds of MB) on every load would cost seconds, so a weights or
tokenizer file's sha256 is kept in the cache under what ``stat`` says of it: its path, size,
modification time, inode and change time, as git's index keeps its files. A user can set a file's
modification time back (``os.utime``, ``touch -d``) but not its change time, which every write and
``utime`` moves, so no rewrite keeps its key. A model's own code (``*.py``, small) is hashed on
every load: what ``--trust-remote-code`` runs is never vouched for by a cache. The file hashes of
each fingerprint made here are kept too, so a changed model is refused naming what changed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from indexer.embedding.model_files import read_json
from indexer.embedding.modules.base import module_files
from indexer.errors import BadInput

FINGERPRINTED = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "*.model",
    "*.safetensors",
    "*.bin",
    "*.py",
)
"""The files of a model's folder that decide its vectors: its config, its tokenizer and its
weights, and the code of a model that has its own. Beside them, the files of each module its
``modules.json`` lists with files of its own (a Dense module's, whatever its folder is named:
``indexer.embedding.modules.base.module_files``)."""

CODE = ".py"
"""The files hashed on every load, never taken from the cache: a model's own code."""
KEPT_FINGERPRINTS = 64
"""How many fingerprints' file hashes the cache keeps (the newest), to name what changed."""


def cache_root() -> Path:
    """Where derived files are kept (ONNX exports, file hashes): ``$SEMSEARCH_CACHE``."""
    return Path(os.environ.get("SEMSEARCH_CACHE", Path.home() / ".cache" / "semsearch"))


def model_fingerprint(directory: str | Path) -> str:
    """``sha256:...`` over the names and bytes of a local model's config, tokenizer, weights and code."""
    hashes = file_hashes(directory)
    digest = hashlib.sha256()
    for name, hashed in hashes.items():
        digest.update(f"{name}\0{hashed}\n".encode())
    found = "sha256:" + digest.hexdigest()
    _remember(cache_root(), found, tuple(hashes.items()))
    return found


def file_hashes(directory: str | Path) -> dict[str, str]:
    """The sha256 of each of a model's ``FINGERPRINTED`` files and its modules' own, by its name in
    the folder, sorted."""
    root = Path(directory).resolve()
    files = _listed(root)
    if not files:
        raise BadInput(f"{directory} holds no model files (config.json, weights)")
    return {path.relative_to(root).as_posix(): _file_hash(path) for path in files}


_LISTINGS: dict[Path, tuple[tuple[tuple[Path, tuple[int, ...] | None], ...], list[Path]]] = {}
"""Each model folder's ``FINGERPRINTED`` files, with the stamps of what decides the list: a build
asks for its model's fingerprint dozens of times, and each glob costs more than the hashes the
cache keeps."""


def _listed(root: Path) -> list[Path]:
    """The files of ``root`` a fingerprint covers, listed again only where a folder they lie in or
    ``modules.json`` changed (a file added, removed or renamed moves its folder's times)."""
    known = _LISTINGS.get(root)
    if known is not None and all(_stamp(path) == stamp for path, stamp in known[0]):
        return known[1]
    watched = [root, root / "modules.json"]
    stamps = [(path, _stamp(path)) for path in watched]  # before listing: a change during it is seen
    found = {p for pattern in FINGERPRINTED for p in root.glob(pattern) if p.is_file()}
    files = sorted(found | set(module_files(str(root))))
    stamps += [(folder, _stamp(folder)) for folder in sorted({f.parent for f in files} - {root})]
    _LISTINGS[root] = (tuple(stamps), files)
    return files


def _stamp(path: Path) -> tuple[int, ...] | None:
    """What ``stat`` says of ``path`` that every change to it moves (None: it is not there)."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


def changed_files(fingerprint: str, directory: str | Path) -> list[str]:
    """The files of the model in ``directory`` that differ from those ``fingerprint`` was made of,
    as far as this machine's cache remembers it (none named where it does not)."""
    was = _read_cache(cache_root(), "fingerprints.json").get(fingerprint)
    if not isinstance(was, dict):
        return []
    now = file_hashes(directory)
    return sorted(name for name in was.keys() | now.keys() if was.get(name) != now.get(name))


def _file_hash(path: Path) -> str:
    """sha256 of one file: a model's code read each time, any other file through the cache."""
    if path.suffix == CODE:
        return _sha256(path)
    stat = path.stat()
    return _cached_hash(
        cache_root(), str(path), stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_ctime_ns
    )


@functools.lru_cache(maxsize=256)
def _cached_hash(cache: Path, path: str, *stat: int) -> str:
    """sha256 of a file, kept on disk in ``cache`` under its path and ``stat`` (size, modification
    time, inode, change time: what no rewrite keeps), so a model's weights are read once."""
    key = "|".join([path, *map(str, stat)])
    known = _read_cache(cache, "file-hashes.json")
    if key in known:
        return known[key]
    hashed = _sha256(Path(path))
    # a file has one current state: its older keys go, with those of files no longer there
    known = {k: v for k, v in known.items() if k.split("|")[0] != path and Path(k.split("|")[0]).exists()}
    known[key] = hashed
    _save_json(cache / "file-hashes.json", known)
    return hashed


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@functools.lru_cache(maxsize=64)
def _remember(cache: Path, fingerprint: str, hashes: tuple[tuple[str, str], ...]) -> None:
    """Keep the file hashes of ``fingerprint`` in ``cache`` (once a process and cache), the newest
    ``KEPT_FINGERPRINTS``: what ``changed_files`` compares a changed model with."""
    known = _read_cache(cache, "fingerprints.json")
    if known.get(fingerprint) == dict(hashes):
        return
    known.pop(fingerprint, None)
    known[fingerprint] = dict(hashes)
    _save_json(cache / "fingerprints.json", dict(list(known.items())[-KEPT_FINGERPRINTS:]))


def _read_cache(cache: Path, name: str) -> dict[str, Any]:
    """A JSON file of ``cache`` as a mapping (empty where it is absent or not one)."""
    found = read_json(cache / name)
    return found if isinstance(found, dict) else {}


def _save_json(path: Path, data: dict[str, Any]) -> None:
    """Write a cache file atomically; failing to costs time later, never correctness."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(temporary, path)
    except OSError:
        Path(temporary).unlink(missing_ok=True)
