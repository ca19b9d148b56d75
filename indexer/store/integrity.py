"""Each version's files against what was recorded at commit: sizes and headers on every open,
CRC-32 checksums in ``verify`` and before a merge."""

from __future__ import annotations

import mmap
import os
import zlib
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from indexer.errors import IndexDamaged
from indexer.vectors.files import npy_size


def checksum(path: Path) -> int:
    """CRC-32 of a file, mapped and summed in one call (cheap next to writing it: 90 MB in 0.05 s
    here). One call holds the GIL once, not once a block: read in 1 MB blocks beside a busy main
    thread (``records_ahead``), a graph's sum waited for the GIL 90 times and took 1 s instead."""
    with path.open("rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return 0  # nothing to map
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            return zlib.crc32(mapped)


def records(version: Path, names: Iterable[str]) -> dict[str, list[int]]:
    return {name: [(version / name).stat().st_size, checksum(version / name)] for name in names}


def records_ahead(version: Path, names: Sequence[str]) -> Future[dict[str, list[int]]]:
    """``records`` of files already final, made in a thread while the rest of the version is
    written: a held graph's 90 MB read and summed beside the vector index and SQLite's commit
    (reading and CRC-32 run without the GIL)."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="semsearch-checksums")
    found = pool.submit(records, version, list(names))
    pool.shutdown(wait=False)  # the thread ends with its sums
    return found


def check_files(
    index_dir: Path, version: Path, recorded: dict[str, list[int]], needed: Sequence[str]
) -> None:
    """Every file the version needs is there, with the size it was written with (recorded at
    commit) and, for ``.npy`` files, the size its header implies: stat calls and one header read,
    cheap enough for every open. A damaged file is named. ``recorded``: ``IndexMeta.files``."""
    for name in dict.fromkeys([*needed, *recorded]):
        path = version / name
        if not path.is_file():
            raise IndexDamaged(f"damaged index {index_dir}: {name} is missing")
        size = path.stat().st_size
        expected = [recorded[name][0]] if name in recorded else []
        if name.endswith(".npy"):
            try:
                expected.append(npy_size(path))
            except (OSError, ValueError, SyntaxError) as exc:
                raise IndexDamaged(f"damaged index {index_dir}: cannot read {name}: {exc}") from None
        wrong = next((e for e in expected if e != size), None)
        if wrong is not None:
            raise IndexDamaged(
                f"damaged index {index_dir}: cannot read {name}: it has {size} bytes, {wrong} were written"
            )


def check_database_header(path: Path) -> None:
    """A SQLite file holds at least the pages its header counts (when that count is current):
    a truncated ``meta.db`` is caught before a query meets a missing page."""
    with path.open("rb") as f:
        header = f.read(100)
    if len(header) < 100 or not header.startswith(b"SQLite format 3\x00"):
        raise ValueError("not a SQLite database")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    if header[24:28] == header[92:96] and path.stat().st_size < page_size * pages:
        raise ValueError(f"truncated: {path.stat().st_size} bytes, {page_size * pages} expected")


def verify_files(index_dir: Path, version: Path, recorded: dict[str, list[int]]) -> int:
    """The full check (``verify``): every file of ``version`` recorded at commit (name -> size,
    CRC-32) against its checksum. Returns the number of files checked."""
    damaged = [name for name, (_, crc) in recorded.items() if checksum(version / name) != crc]
    if damaged:
        raise IndexDamaged(
            f"damaged index {index_dir}: {', '.join(sorted(damaged))} do not match the checksum "
            "written at commit"
        )
    return len(recorded)
