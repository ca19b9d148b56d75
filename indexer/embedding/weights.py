"""Reading weight files as data a stranger may have written: no code of theirs runs, nothing is
read past what they hold, and a file that is not what it says is refused in one line naming it.

``tensor_shapes`` reads the shapes alone (a safetensors header; the tensor records of a torch
pickle), which is how a model's ``config.json`` is checked against its weights before anything is
built. ``read_tensors`` reads a Dense module's small tensors as float32 NumPy arrays. Both read a
torch pickle without torch, on purpose: an index's queries run a Dense module without torch (the
ONNX path), from the copy the index holds, so the file must be read by the same code when the
index is built, or an index could be built that its queries cannot read.
"""

from __future__ import annotations

import collections
import math
import pickle
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard, TypeVar

import numpy as np

from indexer.errors import BadInput

STORAGES = {
    "FloatStorage": np.dtype("<f4"),
    "HalfStorage": np.dtype("<f2"),
    "DoubleStorage": np.dtype("<f8"),
    "BFloat16Storage": np.dtype("<u2"),  # widened to float32 by hand: NumPy has no bfloat16
    "LongStorage": np.dtype("<i8"),
    "IntStorage": np.dtype("<i4"),
    "ShortStorage": np.dtype("<i2"),
    "CharStorage": np.dtype("i1"),
    "ByteStorage": np.dtype("u1"),
    "BoolStorage": np.dtype("?"),
}
"""The storages a torch pickle of weights names (``torch.FloatStorage``...) and their bytes."""
REBUILD = ("torch._utils", "_rebuild_tensor_v2")
"""The one function a torch pickle of tensors names to make each tensor."""
LEGACY_MAGIC = (0x1950A86A20F9469CFC6C).to_bytes(10, "little")
"""The number a torch file in the format before torch 1.6 (a pickle stream, no zip) opens with."""


def torch_alone_reads(file: Path) -> bool:
    """Whether ``file`` is a torch file in the format before torch 1.6, which only torch reads (a
    model's own weights are loaded by transformers with torch's ``weights_only``; a Dense
    module's, read without torch, must be a zip)."""
    if file.suffix == ".safetensors" or zipfile.is_zipfile(file):
        return False
    try:
        with file.open("rb") as opened:
            return LEGACY_MAGIC in opened.read(32)
    except OSError:
        return False


def tensor_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape in a safetensors file or a ``torch.save`` zip, no tensor read."""
    if file.suffix == ".safetensors":
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(file), framework="numpy") as opened:
                names = opened.keys()  # the header alone: no tensor is read
                return {name: tuple(opened.get_slice(name).get_shape()) for name in names}
        except (SafetensorError, OSError) as exc:
            raise BadInput(f"{file} is not a safetensors file ({_first_line(exc)})") from None
    return _torch_file(file, lambda opened: {name: t.shape for name, t in opened.tensors().items()})


def read_tensors(file: Path) -> dict[str, np.ndarray]:
    """A safetensors file's or a ``torch.save`` zip's tensors, as float32 NumPy arrays."""
    if file.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.numpy import load_file

        try:
            return {k: np.asarray(v, dtype=np.float32) for k, v in load_file(str(file)).items()}
        except (SafetensorError, OSError, TypeError, ValueError) as exc:
            raise BadInput(f"{file} is not a safetensors file semsearch reads ({_first_line(exc)})") from None
    return _torch_file(file, lambda opened: {name: opened.array(t) for name, t in opened.tensors().items()})


def _first_line(error: BaseException) -> str:
    said = str(error).strip()
    return said.splitlines()[0] if said else type(error).__name__


@dataclass(frozen=True)
class _Storage:
    """One storage of a torch zip: its member and how many values it holds."""

    member: zipfile.ZipInfo
    kind: str
    count: int


@dataclass(frozen=True)
class _Tensor:
    """One tensor of a torch pickle, not read yet: a strided view of its storage."""

    storage: _Storage
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


def _count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _counts(values: object) -> TypeGuard[tuple[int, ...]]:
    return isinstance(values, tuple) and all(_count(v) for v in values)


MALFORMED = (
    zipfile.BadZipFile,
    pickle.UnpicklingError,
    EOFError,
    OSError,
    ValueError,
    TypeError,
    IndexError,
    KeyError,
    AttributeError,
    OverflowError,
    RecursionError,
)
"""What reading a file that is no ``torch.save`` zip raises, from ``zipfile``, ``pickle`` or NumPy."""

T = TypeVar("T")


def _torch_file(file: Path, use: Callable[[_TorchZip], T]) -> T:
    """``use`` of the ``torch.save`` zip ``file``; a file that is none is refused, naming it."""
    try:
        with zipfile.ZipFile(file) as archive:
            return use(_TorchZip(file, archive))
    except MALFORMED as exc:
        raise BadInput(f"{file} is not a file torch.save writes ({_first_line(exc)})") from None


class _TorchZip:
    """A ``torch.save`` zip: its pickle read with nothing callable but the tensor rebuilder (so no
    code of the file runs), each tensor checked to lie inside its storage before any is read."""

    def __init__(self, file: Path, archive: zipfile.ZipFile):
        self.file = file
        self.archive = archive

    def refuse(self, why: str) -> BadInput:
        return BadInput(f"{self.file} {why}: not read")

    def member(self, name: str) -> zipfile.ZipInfo:
        """A member torch writes uncompressed, so what it holds is no larger than the file."""
        try:
            info = self.archive.getinfo(name)
        except KeyError:
            raise self.refuse(f"names {name}, which it does not hold") from None
        if info.compress_type != zipfile.ZIP_STORED:
            raise self.refuse(f"holds {name} compressed, which torch.save never writes")
        return info

    def tensors(self) -> dict[str, _Tensor]:
        """The tensor records its pickle names, by name; anything else in it is refused."""
        pickles = [n for n in self.archive.namelist() if n.rsplit("/", 1)[-1] == "data.pkl"]
        if len(pickles) != 1:
            raise ValueError(f"{len(pickles)} data.pkl files, not one")
        root = pickles[0][: -len("data.pkl")]
        zipped = self

        class Reader(pickle.Unpickler):
            def find_class(self, module: str, name: str) -> object:
                if (module, name) == REBUILD:
                    return zipped.rebuild
                if (module, name) == ("collections", "OrderedDict"):
                    return collections.OrderedDict
                if module == "torch" and name in STORAGES:
                    return name
                raise zipped.refuse(f"holds more than tensors ({module}.{name})")

            def persistent_load(self, pid: object) -> _Storage:
                if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
                    raise zipped.refuse(f"names a storage as {str(pid)[:60]}")
                kind, key = pid[1], pid[2]
                if kind not in STORAGES or not isinstance(key, str):
                    raise zipped.refuse(f"names a storage of {str(kind)[:40]}")
                member = zipped.member(f"{root}data/{key}")
                size = STORAGES[kind].itemsize
                if member.file_size % size:
                    raise zipped.refuse(f"holds {member.file_size} bytes of {kind}, not whole values")
                return _Storage(member, kind, member.file_size // size)

        with self.archive.open(self.member(pickles[0])) as pickled:
            loaded = Reader(pickled).load()
        if not isinstance(loaded, dict) or not all(
            isinstance(k, str) and isinstance(v, _Tensor) for k, v in loaded.items()
        ):
            raise self.refuse("holds more than named tensors")
        return dict(loaded)

    def rebuild(self, storage: object, offset: object, shape: object, stride: object, *_: object) -> _Tensor:
        """A tensor record, checked: the last value its shape and strides reach from its offset lies
        inside its storage, and it names no more values than the storage holds (a view repeating
        one value a million times would be read as a million)."""
        if not isinstance(storage, _Storage):
            raise self.refuse("names a tensor of no storage")
        if not (_count(offset) and _counts(shape) and _counts(stride) and len(stride) == len(shape)):
            said = f"shape {str(shape)[:40]}, stride {str(stride)[:40]}, offset {str(offset)[:20]}"
            raise self.refuse(f"names a tensor of {said}")
        size, count, said = math.prod(shape), storage.count, "x".join(map(str, shape))
        if size and offset + sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) >= count:
            raise self.refuse(f"names a {said} tensor beyond its storage of {count} values")
        if size > count:
            raise self.refuse(f"names a {said} tensor of more values than its storage holds ({count})")
        return _Tensor(storage, offset, shape, stride)

    def array(self, tensor: _Tensor) -> np.ndarray:
        """A tensor record, checked by ``rebuild``, read as a float32 array."""
        storage = tensor.storage
        values = np.frombuffer(self.archive.read(storage.member), STORAGES[storage.kind])
        if storage.kind == "BFloat16Storage":
            values = (values.astype(np.uint32) << 16).view(np.float32)
        strides = tuple(s * values.itemsize for s in tensor.stride)
        view = np.lib.stride_tricks.as_strided(values[tensor.offset :], shape=tensor.shape, strides=strides)
        return np.array(view, dtype=np.float32)
