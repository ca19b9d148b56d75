"""The answers of ``GET /duplicates``: a scan can take seconds on a large index, so scans run one
at a time and each answer is kept for the version and question it was asked for."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from search.read.duplicates import find_duplicates
from search.read.snapshot import Snapshot

MAX_DUPLICATE_PAIRS = 1000  # pairs one /duplicates response lists (the groups hold them all)
MAX_SCANS = 16  # /duplicates answers kept for the live version


async def _finish(work: asyncio.Future) -> None:
    """Wait until ``work`` has ended, however often the waiter is cancelled meanwhile (a thread
    cannot be cancelled: whoever holds a lock for it must hold it that long); its outcome is
    dropped."""
    while not work.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({work})
    if not work.cancelled():
        work.exception()


class Scans:
    """Duplicates scans, one at a time, and their answers for the live version."""

    def __init__(self) -> None:
        self.scanning = asyncio.Lock()
        self.answers: dict[tuple[str, float, int], dict[str, Any]] = {}

    async def scan(self, snapshot: Snapshot, min_score: float, limit: int) -> dict[str, Any]:
        """One duplicates scan at a time, and one per version and question: a repeated or
        concurrent request gets the stored answer. "At a time" counts threads, not requests: a
        request whose client hung up tells its scan to stop (at its next step) and holds the lock
        until the thread has ended."""
        index = snapshot.index  # an update commits a new generation into the same version
        key = (f"{index.version.name}/{index.manifest.generation}", min_score, limit)
        async with self.scanning:
            if key not in self.answers:
                gone = threading.Event()
                work = asyncio.ensure_future(
                    asyncio.to_thread(
                        find_duplicates, index, min_score, limit, snapshot.db_lock, stop=gone.is_set
                    )
                )
                try:
                    found = await asyncio.shield(work)
                except asyncio.CancelledError:
                    gone.set()
                    await _finish(work)
                    raise
                if len(self.answers) >= MAX_SCANS or any(version != key[0] for version, *_ in self.answers):
                    self.answers.clear()  # answers of an older version, or more kept than worth it
                self.answers[key] = found.to_dict()
            return self.answers[key]
