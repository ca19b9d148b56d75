"""The Dropout module: nothing once trained, wherever it stands."""

from __future__ import annotations

from indexer.embedding.modules.base import Listed, Reading


class Dropout:
    """Read and left out: a trained model's dropout changes no vector."""

    @classmethod
    def read(cls, folder: Reading, listed: Listed) -> str | None:
        return None
