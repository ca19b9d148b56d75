"""Reading a model's files where they lie: a local directory, or the Hugging Face cache's
snapshot of a hub model (never the network). A model's files are data a stranger may have
written: a name leading out of the folder, a link that leads nowhere or JSON that cannot be read
is refused in one line naming it, never taken for an absent file."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

from indexer.errors import BadInput


def inside(name: str) -> bool:
    """Whether a file or folder name of a model (``2_Dense/config.json``) stays inside its folder:
    relative, and never through ``..``."""
    path = PurePosixPath(name)
    return bool(name) and not path.is_absolute() and ".." not in path.parts


def check_link(path: Path) -> None:
    """Refuse ``path`` where it is a symbolic link that leads nowhere (a loop, a missing target),
    which would otherwise read as no file at all."""
    if path.is_symlink():
        try:
            path.stat()
        except OSError as exc:
            raise BadInput(f"{path} is a symbolic link that leads nowhere ({exc.strerror})") from None


def model_file(location: str, filename: str) -> Path | None:
    """A file of a local model directory or of a cached hub model, or None."""
    if not inside(filename):
        raise BadInput(f"{filename!r} lies outside the model folder {location}")
    local = Path(location)
    if local.is_dir():
        path = local / filename
        check_link(path)
        return path if path.is_file() else None
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(location, filename)
    except ValueError:  # not a hub name either (a path that does not exist): no such file
        return None
    return Path(found) if isinstance(found, str) else None


def read_json(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def model_json(path: Path | None) -> Any:
    """A model's JSON file as read, None where it is absent; one that cannot be read is refused,
    naming it, before a library that reads it unguarded meets it (transformers' ``json.load`` of
    a nesting deeper than Python's recursion limit)."""
    if path is None:
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise BadInput(f"{path} is JSON nested too deep to read") from None
    except (OSError, ValueError) as exc:
        raise BadInput(f"{path} is not JSON semsearch can read ({exc})") from None
