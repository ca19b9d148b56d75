"""Each version's files against what was recorded at commit: sizes and headers on every open,
CRC-32 checksums in ``verify`` and before a merge."""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

from indexer.errors import IndexDamaged
from indexer.vectors.files import npy_size


def checksum(path: Path) -> int:
    """CRC-32 of a file, read in 1 MB blocks (about 3.7 GB/s here: cheap next to writing it)."""
    crc = 0
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            crc = zlib.crc32(block, crc)
    return crc


def records(version: Path, names: Iterable[str]) -> dict[str, list[int]]:
    return {name: [(version / name).stat().st_size, checksum(version / name)] for name in names}


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
