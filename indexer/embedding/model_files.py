"""Reading a model's files where they lie: a local directory, or the Hugging Face cache's
snapshot of a hub model (never the network)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def model_file(location: str, filename: str) -> Path | None:
    """A file of a local model directory or of a cached hub model, or None."""
    local = Path(location)
    if local.is_dir():
        path = local / filename
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
