"""Vector files read without FAISS: the header of a FAISS index file, ``.npy`` sizes and
memory maps (an open checks these on every call, so they stay cheap)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    import numpy as np


def npy_size(path: Path) -> int:
    """The size a ``.npy`` file must have, from its header alone: header plus shape x item size."""
    import math

    with path.open("rb") as f:
        shape, _, dtype = _npy_header(f)
        return f.tell() + math.prod(shape) * dtype.itemsize


def _npy_header(f: BinaryIO) -> tuple[tuple[int, ...], bool, Any]:
    """Shape, Fortran order and dtype of an open ``.npy`` file, which is left at its data."""
    import numpy as np

    version = np.lib.format.read_magic(f)
    header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    return header(f)


def mapped(path: Path) -> np.ndarray:
    """A read-only view of a ``.npy`` file, memory-mapped for random reads (``MADV_RANDOM``): a
    re-rank's page fault reads that page alone. With the kernel's read-ahead, 300 queries paged in
    the whole 1.5 GB of a 1M-vector file."""
    import mmap

    import numpy as np

    with path.open("rb") as f:
        shape, fortran, dtype = _npy_header(f)
        view = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        view.madvise(mmap.MADV_RANDOM)
        return np.ndarray(shape, dtype, buffer=view, offset=f.tell(), order="F" if fortran else "C")


def stored_shape(path: Path) -> tuple[int, int]:
    """Dimension and vector count of a FAISS index file, from its header alone (no FAISS import):
    every index FAISS writes starts with a four-byte type code, the dimension (int32) and the
    vector count (int64), little-endian."""
    import struct

    with path.open("rb") as f:
        header = f.read(16)
    if len(header) < 16:
        raise ValueError(f"{path.name} is too short to be a FAISS index")
    dimension, count = struct.unpack("<iq", header[4:16])
    return dimension, count
