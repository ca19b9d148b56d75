"""Reading a catalog file whose writer was killed mid-transaction. Its hot ``-journal`` must be
rolled back before SQLite reads the file at all, and only a connection that may write the file
and its folder can do that: a process that may not (a server reading someone else's index) reads
the last committed state from a private copy instead (``committed_copy``)."""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from pathlib import Path


def journal_of(path: Path) -> Path:
    """The rollback journal SQLite keeps beside the database file ``path``."""
    return path.with_name(path.name + "-journal")


def _journal_header(journal: Path) -> bytes:
    """The first bytes of a rollback journal: its header, with the nonce of its transaction."""
    with journal.open("rb") as f:
        return f.read(28)


def cannot_roll_back(error: BaseException, path: Path) -> bool:
    """Whether SQLite failed a read of ``path`` because this process cannot roll back a killed
    writer's journal of it: it may not write the file (SQLITE_READONLY_ROLLBACK), open the
    journal for writing (SQLITE_CANTOPEN) or delete it (SQLITE_IOERR_DELETE)."""
    code = getattr(error, "sqlite_errorcode", 0) & 0xFF
    unable = (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_IOERR)
    return isinstance(error, sqlite3.OperationalError) and code in unable and journal_of(path).exists()


def committed_copy(path: Path) -> tuple[sqlite3.Connection, Path | None]:
    """A read-only connection to the last committed state of ``path``, whose hot journal this
    process cannot roll back, and the private folder it reads from (None: the file itself). The
    journal, then the file, are copied to a private folder and rolled back there. The copy is
    whole if the journal still begins the same afterwards (a rollback deletes it; a new
    transaction's journal has another nonce): otherwise someone rolled it back meanwhile, and
    the file itself reads. The caller removes the folder when done."""
    journal = journal_of(path)
    for _attempt in range(3):
        folder = Path(tempfile.mkdtemp(prefix="semsearch-catalog-"))
        try:
            try:
                header = _journal_header(journal)
                shutil.copyfile(journal, folder / journal.name)
                shutil.copyfile(path, folder / path.name)
                whole = _journal_header(journal) == header
            except FileNotFoundError:  # rolled back meanwhile
                whole = False
            if whole:
                db = sqlite3.connect(f"file:{folder / path.name}?mode=rw", uri=True, check_same_thread=False)
                db.execute("select count(*) from sqlite_master").fetchone()  # the rollback
                db.execute("pragma query_only = on")
                return db, folder
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        shutil.rmtree(folder, ignore_errors=True)
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        try:
            db.execute("select count(*) from sqlite_master").fetchone()
            return db, None
        except sqlite3.OperationalError as exc:  # another writer was killed meanwhile: copy again
            db.close()
            if not cannot_roll_back(exc, path):
                raise
    raise sqlite3.OperationalError(f"cannot read {path}: writers keep being killed while it is read")
