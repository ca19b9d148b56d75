"""The engine a running server serves: it picks up a new index version written by
``add``/``delete``/``index`` between requests, and hands each request one snapshot to work on
throughout, so a request always sees one complete version."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future
from pathlib import Path

from indexer.catalog import DatabaseError
from indexer.errors import IndexDamaged, SemsearchError
from search.read.engine import SearchEngine
from search.read.snapshot import Snapshot


class LiveEngine:
    """The engine ``loading`` gives, checked for a new version at most every ``reload_every``
    seconds (or at once when forced), one check at a time; ``reloads`` counts the versions picked
    up (here or by a request's retry). It takes the engine still loading, so the app's routes are
    set up meanwhile."""

    def __init__(self, loading: Future[SearchEngine], index_dir: str | Path, reload_every: float):
        self.loading = loading
        self.index_dir = index_dir
        self.reload_every = reload_every
        self.checked = time.monotonic()
        self.reloading = asyncio.Lock()
        self.fault: IndexDamaged | None = None  # what the last check found, until one passes

    @property
    def reloads(self) -> int:
        return self.loading.result().reloads

    async def engine(self, force: bool = False) -> SearchEngine:
        """The engine a request works with, after picking up a new version if one is due."""
        now = time.monotonic()
        if force or now - self.checked >= self.reload_every:
            self.checked = now
            async with self.reloading:
                try:
                    await asyncio.to_thread(self.loading.result().reload_if_changed)
                except (SemsearchError, OSError, DatabaseError) as exc:
                    self.fault = IndexDamaged(f"the index at {self.index_dir} cannot be read: {exc}")
                    raise self.fault from None
                self.fault = None
        return self.loading.result()

    async def check(self) -> None:
        """IndexDamaged while the index cannot serve: the reload check when one is due (a look
        at its version and segments, no search), else what the last check found (``/health``)."""
        await self.engine()
        if self.fault is not None:
            raise self.fault

    async def current(self, force: bool = False) -> Snapshot:
        """The snapshot a request works on (``engine``'s)."""
        return (await self.engine(force)).snapshot
