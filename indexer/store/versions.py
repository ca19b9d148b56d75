"""Versions of an index: the writer lock, ``CURRENT``, making a version durable and live, the
readers' holds on the versions they have open, and removing old versions (once no reader holds
them) and what killed writers left."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from indexer.catalog import Catalog, DatabaseError
from indexer.errors import BadInput, DiskFull, IndexDamaged, IndexLocked, SemsearchError
from indexer.files import cannot_make, out_of_space, remove_unheld
from indexer.store.integrity import records
from indexer.store.layout import CURRENT, DATABASE, LOCK, MAX_POINTER, VERSION_NAME
from indexer.store.meta import IndexMeta

if TYPE_CHECKING:
    from concurrent.futures import Future


def fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def writer_lock(index_dir: Path, wait: float = 0) -> Iterator[None]:
    """One writer at a time per index; the kernel drops the lock if the writer dies. ``wait``:
    seconds to keep trying while another writer holds it, then ``IndexLocked`` (naming the
    other writer's process, which the lock file holds)."""
    deadline = time.monotonic() + wait
    while True:
        if not Path(index_dir).is_dir():
            raise _NoFolder(f"no index at {index_dir}")
        try:
            handle = (Path(index_dir) / LOCK).open("a+")
        except OSError as exc:
            raise _cannot_lock(Path(index_dir), exc) from None
        with handle:
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise IndexLocked(
                            f"another semsearch process is writing to {index_dir}{_holder(handle)}: try "
                            "again when it has finished, or wait for it (--wait SECONDS)"
                        ) from None
                    time.sleep(min(0.05, max(deadline - time.monotonic(), 0)))
            if os.fstat(handle.fileno()).st_nlink == 0:
                continue  # removed while we waited (a first build that failed): lock the folder anew
            _note_holder(handle, f"{os.getpid()}\n")  # for a writer that waits (``_holder``)
            try:
                _remove_leftovers(Path(index_dir))
                yield
            finally:
                _note_holder(handle, "")
            return


def _cannot_lock(index_dir: Path, exc: OSError) -> BadInput:
    """Why the lock file cannot be opened: the folder refuses writes, or the lock is not a file."""
    lock = index_dir / LOCK
    if lock.is_dir() or (lock.exists() and not lock.is_file()):
        what = "a folder" if lock.is_dir() else "not a file"
        return BadInput(f"cannot write to {index_dir}: its lock file {lock} is {what} (remove it)")
    return BadInput(f"cannot write to {index_dir}: {exc.strerror}")


class _NoFolder(BadInput):
    """The folder to lock is not there (``building`` makes it again)."""


def _note_holder(handle: IO[str], pid: str) -> None:
    """The lock file holds the process id of the writer holding the lock (best effort: written
    past the file object's buffer, so a full disk fails nothing here nor when the file closes)."""
    with contextlib.suppress(OSError):
        os.ftruncate(handle.fileno(), 0)
        os.pwrite(handle.fileno(), pid.encode(), 0)


def _holder(handle: IO[str]) -> str:
    """`` (pid N)``: the running process that holds the lock, as it wrote itself into the lock
    file; empty where it did not (a writer killed before it wrote, or an older semsearch)."""
    handle.seek(0)
    pid = handle.read(20).strip()
    if not pid.isdigit() or int(pid) == 0:
        return ""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return ""
    except PermissionError:  # running, as another user
        pass
    return f" (pid {pid})"


def _remove_leftovers(index_dir: Path) -> None:
    """What killed writers left (a partial version, a pointer file) and older versions no reader
    holds, removed by the next writer under the lock. An index written before versions recorded
    their predecessor loses only those newer than the live one (a partial version is always
    newer: it was begun after the live one was committed)."""
    try:
        live = live_version(index_dir)
        if live is None:
            return
        meta = live_meta(index_dir)
    except SemsearchError:
        return  # a damaged or absent index: leave everything for the user to see
    stamp = live[: len("v-YYYYmmddTHHMMSS")]

    def leftover(name: str) -> bool:
        return meta.records_previous or name[: len(stamp)] > stamp

    _remove_stale(index_dir, keep={live}, version=leftover)


def prepare_target(index_dir: Path) -> None:
    """Make sure ``index_dir`` can take an index, making it (and its missing parents) if need be.
    A folder that holds only what builds write (their lock, versions, pointer files) can: another
    build is writing its first version there (``building`` waits for its lock), or one was killed."""
    if index_dir.exists() and not index_dir.is_dir():
        raise BadInput(f"{index_dir} exists and is not a directory")
    occupied = index_dir.is_dir() and any(not _written_by_a_build(p) for p in index_dir.iterdir())
    if occupied and not (index_dir / CURRENT).is_file():
        raise BadInput(
            f"{index_dir} exists, is not empty and is not a semsearch index: refusing to overwrite it"
        )
    try:
        index_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise cannot_make(index_dir, exc) from None


def missing_top(index_dir: Path) -> Path | None:
    """The topmost directory of ``index_dir``'s path that does not exist yet (what making it
    creates); None when it exists."""
    top, missing = None, index_dir.absolute()
    while not missing.exists():
        top, missing = missing, missing.parent
    return top


def _written_by_a_build(path: Path) -> bool:
    """The lock, a version directory or a pointer file: what a build writes before ``CURRENT``."""
    version = VERSION_NAME.fullmatch(path.name) and path.is_dir() and not path.is_symlink()
    return path.name == LOCK or bool(version) or path.name.startswith(f".{CURRENT}.")


@contextlib.contextmanager
def building(index_dir: Path, wait: float = 0) -> Iterator[None]:
    """Prepare ``index_dir`` and hold its writer lock for a build. A build that fails before
    any index exists there removes the directories it created: nothing is left behind, also when
    it is stopped (Ctrl-C) before it holds the lock, unless another writer holds it by then. One
    that waited for a first build that failed so makes them again."""
    deadline = time.monotonic() + wait
    while True:
        made = missing_top(index_dir)  # known before it is made: a stop just after leaves nothing
        lock = contextlib.ExitStack()
        try:
            prepare_target(index_dir)
            lock.enter_context(writer_lock(index_dir, max(deadline - time.monotonic(), 0)))
        except _NoFolder:
            continue
        except BaseException:
            if made is not None and live_or_none(index_dir) is None:
                _remove_unlocked(made, index_dir)
            raise
        with lock:
            try:
                yield
            except BaseException:
                if made is not None and live_or_none(index_dir) is None:
                    shutil.rmtree(made, ignore_errors=True)
                raise
        return


def _remove_unlocked(made: Path, index_dir: Path) -> None:
    """Remove ``made`` (the folders a first build made) unless a writer holds ``index_dir``'s
    lock; removed holding it, so a writer that takes it next sees its lock file gone and starts
    anew (``writer_lock``)."""
    try:
        handle = (index_dir / LOCK).open("r")
    except OSError:  # no lock file: no writer came
        shutil.rmtree(made, ignore_errors=True)
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        shutil.rmtree(made, ignore_errors=True)


@contextlib.contextmanager
def space(index_dir: Path) -> Iterator[None]:
    """A write that runs out of space ends as ``DiskFull`` (its caller has undone its partial files)."""
    try:
        yield
    except Exception as exc:
        if out_of_space(exc):
            raise DiskFull(
                f"disk full: cannot write to {index_dir}; the index is unchanged (free some space and retry)"
            ) from None
        raise


@dataclass
class Pending:
    """A version being written (``committing``): its directory, and the meta it is committed with,
    set by whoever writes it."""

    path: Path
    meta: IndexMeta | None = None
    checked: Future[dict[str, list[int]]] | None = None
    """The sizes and checksums of files final before the rest was written (a held graph's:
    ``integrity.records_ahead``); the others' are made at the commit."""


@contextlib.contextmanager
def committing(index_dir: Path) -> Iterator[Pending]:
    """A new version directory to write; on a clean exit its meta (``Pending.meta``) is written,
    once, with its files' sizes and checksums and the version before it, the version is made
    durable and then the live one. On an exception it is removed and the live version stays; one
    that runs out of space ends as ``DiskFull``. The caller holds ``writer_lock``."""
    with space(index_dir):
        version = index_dir / f"v-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}"
        version.mkdir()
        pointer = index_dir / f".{CURRENT}.{secrets.token_hex(4)}"
        try:
            pending = Pending(version)
            yield pending
            _make_durable(index_dir, pending)
            pointer.write_text(version.name + "\n", encoding="utf-8")
            fsync(pointer)
        except BaseException:
            shutil.rmtree(version, ignore_errors=True)
            pointer.unlink(missing_ok=True)
            raise
        os.replace(pointer, index_dir / CURRENT)  # the swap: from here on the version is live
        fsync(index_dir)
        _remove_stale(index_dir, keep={version.name})


def _make_durable(index_dir: Path, pending: Pending) -> None:
    """Write the meta of a written version, then fsync its every file and itself."""
    if pending.meta is None:
        raise RuntimeError(f"a new version of {index_dir} was left without its meta")
    version, previous = pending.path, live_or_none(index_dir)
    names = [f.name for f in version.iterdir() if f.name != DATABASE]
    known = pending.checked.result() if pending.checked is not None else {}
    fresh = records(version, [name for name in names if name not in known])
    files = {name: known[name] if name in known else fresh[name] for name in names}
    meta = pending.meta.replace(files=files, previous=previous, records_previous=True)
    catalog = Catalog(version / DATABASE, readonly=False, synced=False)  # fsynced below
    catalog.write_meta(meta.to_dict())
    catalog.commit()
    catalog.close()
    for child in version.iterdir():
        fsync(child)
    fsync(version)


def live_version(index_dir: Path) -> str | None:
    """Name of the live version directory (what CURRENT says), or None where there is no
    CURRENT. One that cannot hold a version name (not UTF-8, too long) is damage."""
    try:
        with (index_dir / CURRENT).open("rb") as f:
            raw = f.read(MAX_POINTER + 1)
    except OSError:
        return None
    try:
        name = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        name = None
    if name is None or len(raw) > MAX_POINTER:
        raise IndexDamaged(f"damaged index {index_dir}: {CURRENT} does not hold a version name")
    return name


def live_or_none(index_dir: Path) -> str | None:
    """``live_version`` for a writer about to replace CURRENT: a damaged one counts as none."""
    try:
        return live_version(index_dir)
    except IndexDamaged:
        return None


def version_dir(index_dir: Path, name: str) -> Path:
    """The live version's directory. Only a plain ``v-<time>-<hex>`` name (no path separators,
    not a symlink) is accepted, so the directory is always inside ``index_dir``."""
    version = index_dir / name
    if not VERSION_NAME.fullmatch(name) or version.is_symlink():
        plain = re.fullmatch(r"[\w-]+", name) and not version.is_symlink()
        what = f"a missing version {name!r}" if plain else f"{name!r}, which is not a version directory in it"
        raise IndexDamaged(f"damaged index {index_dir}: {CURRENT} names {what}")
    return version


def _remove_stale(
    index_dir: Path, keep: set[str | None], version: Callable[[str], bool] = lambda name: True
) -> None:
    """Older versions (those ``version`` accepts) that no reader holds, and leftovers of killed
    runs."""
    for child in index_dir.iterdir():
        if child.name in keep:
            continue
        if child.name.startswith("v-") and child.is_dir() and not child.is_symlink() and version(child.name):
            remove_unheld(child)
        elif child.name.startswith(f".{CURRENT}."):
            child.unlink(missing_ok=True)


class VersionHold:
    """A reader's shared flock on the version directory it opened, kept while the reader has it:
    no one removes a version a reader holds. Letting go (``release``, or the holder being
    dropped) removes the version if it is no longer live and no one else holds it, so an index
    on disk is its live version plus what open readers still use."""

    def __init__(self, index_dir: Path, version: Path, fd: int):
        self.release = weakref.finalize(self, _let_go, index_dir, version, fd)


def hold_version(index_dir: Path, version: Path) -> VersionHold | None:
    """A hold on ``version``, or None when it is gone or being removed (no longer live)."""
    try:
        fd = os.open(version, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        held = version.is_dir()  # False: removed before we held it
    except BlockingIOError:
        held = False  # being removed
    if not held:
        os.close(fd)
        return None
    return VersionHold(index_dir, version, fd)


def _let_go(index_dir: Path, version: Path, fd: int) -> None:
    os.close(fd)
    live = live_or_none(index_dir)
    if live is not None and live != version.name:
        remove_unheld(version)


def live_meta(index_dir: str | Path) -> IndexMeta:
    """The live version's meta table alone: cheap, no vectors loaded."""
    index_dir = Path(index_dir)
    if not index_dir.is_dir():
        raise BadInput(f"no index at {index_dir}")  # as ``open_index`` says it
    for _attempt in range(3):  # a writer may swap versions between reading CURRENT and holding it
        name = live_version(index_dir)
        if name is None:
            raise BadInput(f"{index_dir} is not a semsearch index (no {CURRENT} file)")
        version = version_dir(index_dir, name)
        hold = hold_version(index_dir, version)
        if hold is not None:
            break
    try:
        catalog = Catalog(version / DATABASE)
        with contextlib.closing(catalog.db):
            stored = catalog.read_meta()
    except (DatabaseError, ValueError) as exc:
        raise IndexDamaged(f"damaged index {index_dir}: cannot read {DATABASE}: {exc}") from None
    finally:
        if hold is not None:
            hold.release()
    return IndexMeta.parse(stored, index_dir)
