"""What semsearch writes for the user outside an index (``encode``'s vectors, ``export-encoder``'s
directory, ``tune``'s model): the one place such a file or directory is made, so each is whole or
absent, and its mode is what a plain ``open()`` or ``mkdir`` would give. Its missing folders are
made first (``make_parents``), as ``index -o`` makes an index's, and removed again if the run fails.

An output is made beside its place under a staging name (``.NAME.semsearch-XXXXXXXX``) and renamed
into it whole. The run holds an flock on its staging while it writes; the kernel drops it when the
run dies (as with an index's writer lock), so the next run to that place tells a killed run's
staging (unlocked: removed) from a running one's (locked: refused, one writer per output). A
SIGTERM (``stop_on_sigterm``) ends a run through its clean-up, which removes its staging.

Modes: a new file gets 0666 and a directory 0777, less the umask; a file replaced keeps its mode;
an output that is a symlink is written through to its target (staged beside the target).

These helpers sit a floor under the store: the store (a version's files) and the query side
(``encode``'s output) use them as the writers do.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import shutil
import signal
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from indexer.errors import BadInput, DiskFull, IndexLocked, SemsearchError

STAGING = "semsearch-"
"""Between an output's name and the random part of its staging name."""


def stop_on_sigterm() -> None:
    """A SIGTERM ends the process as an exception would (exit 143): every ``finally`` and clean-up
    runs, so no staging file or directory is left."""

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def out_of_space(exc: BaseException) -> bool:
    """Whether a write failed for want of space, as each writer says it: an OSError (ENOSPC,
    EDQUOT, or numpy's short write), SQLite's SQLITE_FULL, FAISS's or ONNX's RuntimeError text."""
    from indexer.catalog import is_disk_full

    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT) or (
            exc.errno is None and "requested and" in str(exc)
        )
    if is_disk_full(exc):
        return True
    return isinstance(exc, RuntimeError) and "No space left on device" in str(exc)


@contextlib.contextmanager
def staged_file(output: str | Path) -> Iterator[IO[bytes]]:
    """A binary file to write that becomes ``output`` when the block ends without an error (and
    is removed when it ends with one). Refuses a directory or a special file (a rename would
    replace the device or pipe itself)."""
    target = _resolved(output)
    if target.is_dir():
        raise BadInput(f"{output} is a directory: give a file name")
    if target.exists() and not target.is_file():
        raise BadInput(f"{output} is not a regular file: give a file name")
    with _writing(target), _parents(target), _claim(target, directory=False) as (staging, fd):
        if target.is_file():
            os.fchmod(fd, stat.S_IMODE(target.stat().st_mode))
        with os.fdopen(fd, "wb", closefd=False) as handle:
            yield handle
        os.replace(staging, target)


@contextlib.contextmanager
def staged_dir(output: str | Path, check: Callable[[Path], None] = lambda target: None) -> Iterator[Path]:
    """An empty directory to fill that becomes ``output`` when the block ends without an error,
    replacing what is there if ``check`` (called now and again just before) lets it. The output
    is claimed from the start: a second run to it is refused before it does its work."""
    target = _resolved(output)
    check(target)
    with _writing(target), _parents(target), _claim(target, directory=True) as (staging, _):
        yield staging
        made = stat.S_IMODE(staging.stat().st_mode)  # 0777 less the umask
        for root, directories, files in os.walk(staging):  # as if each were made by plain open()
            for name in directories:
                os.chmod(Path(root, name), made)
            for name in files:
                os.chmod(Path(root, name), made & 0o666)
        check(target)
        if target.exists():
            old = _staging(target)
            os.rename(target, old)  # unlocked: if killed here, the next run removes it
            os.rename(staging, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(staging, target)


def _resolved(output: str | Path) -> Path:
    """Where ``output`` is written: through a symlink, to its target."""
    path = Path(output)
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def make_parents(target: str | Path) -> Path | None:
    """Make the missing folders above ``target``; the topmost one made (None: none were missing).
    A folder of the path that is a file, or one that cannot be made, is one clear error."""
    parent = Path(target).parent
    top, missing = None, parent.absolute()
    while not missing.exists() and not missing.is_symlink():
        top, missing = missing, missing.parent
    if top is None and parent.is_dir():
        return None
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise cannot_make(Path(target), exc) from None
    return top


@contextlib.contextmanager
def _parents(target: Path) -> Iterator[None]:
    """``target``'s missing folders made for the block; those still empty removed when it fails
    (a failed run leaves nothing it made, and never what another run put there)."""
    top = make_parents(target)
    try:
        yield
    except BaseException:
        if top is not None:
            _remove_empty(target.absolute().parent, top)
        raise


def _remove_empty(folder: Path, top: Path) -> None:
    """``folder`` and its parents up to ``top``, each while it is empty."""
    while True:
        try:
            folder.rmdir()
        except OSError:
            return
        if folder == top:
            return
        folder = folder.parent


def _staging(target: Path) -> Path:
    return target.with_name(f".{target.name}.{STAGING}{secrets.token_hex(4)}")


@contextlib.contextmanager
def _writing(target: Path) -> Iterator[None]:
    try:
        yield
    except SemsearchError:
        raise
    except Exception as exc:
        if out_of_space(exc):
            raise DiskFull(
                f"disk full: cannot write {target}; nothing was written (free some space and retry)"
            ) from None
        raise


@contextlib.contextmanager
def _claim(target: Path, *, directory: bool) -> Iterator[tuple[Path, int]]:
    """A new staging file or directory beside ``target`` and a descriptor holding its lock;
    removed on an error. A killed run's staging there is removed, a running one's refused. The
    clean-up is armed before the staging is made: a stop (SIGTERM, Ctrl-C) raised the moment it
    exists, in whichever thread the signal landed, still removes it (its name is new, so what
    stands there is this run's)."""
    staging: Path | None = None
    fd: int | None = None
    try:
        while True:
            staging = _staging(target)
            try:
                if directory:
                    os.mkdir(staging, 0o777)
                    fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
                else:
                    fd = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                staging = None  # another's: not ours to remove
                continue
            except FileNotFoundError as exc:
                staging = None
                if target.parent.is_dir():  # /proc, /sys: a folder that makes no new files
                    raise _cannot_write(target, exc) from None
                make_parents(target)  # a failed run to a sibling removed the folder just made
                continue
            except OSError as exc:
                if not (directory and staging.is_dir()):
                    staging = None
                raise _cannot_write(target, exc) from None
            fcntl.flock(fd, fcntl.LOCK_EX)  # waits only on a run that is removing it as a killed one's
            if _same(staging, fd):
                break
            os.close(fd)  # it was removed before we held it: take another name
            fd, staging = None, None
        _remove_killed(target, staging)
        yield staging, fd
    except BaseException:
        if staging is not None and directory:
            shutil.rmtree(staging, ignore_errors=True)
        elif staging is not None:
            staging.unlink(missing_ok=True)
        raise
    finally:
        if fd is not None:
            os.close(fd)


def _same(path: Path, fd: int) -> bool:
    try:
        found, held = os.stat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (found.st_dev, found.st_ino) == (held.st_dev, held.st_ino)


def _remove_killed(target: Path, own: Path) -> None:
    """Every other staging of ``target``: a killed run's removed; a running one's refused."""
    name = re.compile(rf"\.{re.escape(target.name)}\.{STAGING}[0-9a-f]{{8}}")
    for child in target.parent.iterdir():
        if child != own and name.fullmatch(child.name) and not remove_unheld(child):
            raise IndexLocked(
                f"another semsearch process is writing {target}: wait for it to finish, or write elsewhere"
            )


def remove_unheld(path: Path) -> bool:
    """Remove ``path`` unless a running process holds an flock on it (a writer its staging, a
    reader an index version it has open); False when one does."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return True  # gone, or not a staging of ours (a symlink): not in the way
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        return True
    finally:
        os.close(fd)


def cannot_make(target: Path, exc: OSError) -> SemsearchError:
    """Why ``target``'s folders cannot be made (``exc``: what making them raised), naming the
    folder of its path that stops it."""
    standing = target.parent
    while not standing.exists() and not standing.is_symlink() and standing != standing.parent:
        standing = standing.parent
    if standing.is_file():
        return BadInput(f"cannot write {target}: {standing} is a file, not a folder")
    if standing.exists() and not standing.is_dir():
        return BadInput(f"cannot write {target}: {standing} is not a folder")
    if out_of_space(exc):
        return DiskFull(f"disk full: cannot write {target} (free some space and retry)")
    if exc.errno == errno.ENOENT:  # /proc, /sys: a folder that makes no new folders
        return BadInput(f"cannot write {target}: {standing} takes no new files")
    return BadInput(f"cannot write to {standing}: {exc.strerror}")


def _cannot_write(target: Path, exc: OSError) -> SemsearchError:
    """Why ``target`` cannot be made, naming it (never the staging name)."""
    if out_of_space(exc):
        return DiskFull(f"disk full: cannot write {target} (free some space and retry)")
    parent = target.parent
    if exc.errno == errno.ENOENT:
        if parent.is_dir():  # /proc, /sys: a folder that makes no new files
            return BadInput(f"cannot write {target}: {parent} takes no new files")
        return BadInput(f"cannot write {target}: no such folder {parent}")
    return BadInput(f"cannot write to {parent}: {exc.strerror}")
