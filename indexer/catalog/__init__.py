"""The catalog: the SQLite half of an index version (``meta.db``), one row per entry plus the
index's meta, with typed operations on it. The vectors are the other half (``vector_index``).
How a field's values decide its column type, and how a value is stored in it: ``indexer.reading.field_types``.

Tables::

    entries(_rowid INTEGER PRIMARY KEY, _id TEXT UNIQUE, _text, _hash, _chunks, <user fields>)
    meta(key TEXT PRIMARY KEY, value)    JSON values: strategy, counts, index kind, source, ...
    tombstones(_rowid INTEGER PRIMARY KEY, generation INTEGER)   vectors hidden by an update
                                         (``indexer.segments``); made by the first update that needs it
    keywords                             FTS5 over ``entries._text`` and the also fields (external
                                         content, kept by triggers in the writer's own transaction;
                                         a new version's filled once at its commit): keyword search
    keyword_texts                        the view it reads those columns through (with also fields)
    structured(_rowid, field)            the fields of each row that hold a JSON list or object (kept
                                         as JSON text, given back as the list or object); made by the
                                         first write that stores one (``indexer.catalog.structured``)
    exact(_rowid, field, value)          the JSON text of each number past 64 bits or -0.0, which its
                                         column holds as the nearest number SQLite has; made by the
                                         first write that stores one (``indexer.catalog.exact``)

The keyword table's schema and operations are ``indexer.catalog.keywords``; the fields' facets
(what a search page filters by) ``indexer.catalog.facets``; reading a file a killed writer left
a journal in ``indexer.catalog.rollback``.

Operations that take many ids bind them as one JSON array (``json_each``), never one parameter
per id, so they work past SQLite's bound-parameter limit.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from indexer.catalog import exact, rollback, structured
from indexer.catalog.facets import Facet, FieldFacets
from indexer.catalog.identifiers import quote
from indexer.catalog.keywords import KeywordTable, keyword_fields
from indexer.catalog.postings import Postings
from indexer.columns import RESERVED
from indexer.errors import FilterError, IndexMoved
from indexer.reading.field_types import comparable, detect_types, exact_text, stored_value

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "RESERVED",
    "SQL_TYPES",
    "Catalog",
    "DatabaseError",
    "Entry",
    "Facet",
    "OperationalError",
    "content_hash",
    "is_disk_full",
    "keyword_fields",
]

SQL_TYPES = {"integer": "INTEGER", "number": "NUMERIC", "text": "TEXT"}
_FIELD_TYPES = {"INTEGER": "integer", "NUMERIC": "number", "REAL": "number", "FLOAT": "number"}


DatabaseError = sqlite3.DatabaseError
"""What SQLite raises for a database file it cannot read (garbled, truncated, removed under a
reader): the name callers outside the catalog catch, so only the catalog imports ``sqlite3``."""
OperationalError = sqlite3.OperationalError
"""What SQLite raises for a statement it cannot run now (a killed writer's journal, a lock)."""


class Entry(Protocol):
    """What the catalog stores of an entry (``indexer.reading.corpus.Entry`` is one)."""

    id: str
    text: str
    fields: dict[str, Any]


def is_disk_full(error: BaseException) -> bool:
    """Whether SQLite failed because the disk is full (SQLITE_FULL)."""
    code = getattr(error, "sqlite_errorcode", None)
    return isinstance(error, OperationalError) and code == sqlite3.SQLITE_FULL


_APART = (structured.STRUCTURED, exact.EXACT)
"""The tables of values a column keeps otherwise than they were written (lists and objects, numbers)."""
_WITHIN = " where (?1 is null or _rowid in (select value from json_each(?1)))"
"""The rows of a grouping: all, or those of a JSON list of row ids (a filter's)."""


class Catalog(KeywordTable, FieldFacets):
    """One version's ``meta.db``, opened for reading (queries) or writable (a write in progress).

    A reader's connection may write (``query_only`` keeps its statements from doing so) because a
    writer killed mid-transaction leaves a hot ``-journal`` that only a connection that may write
    can roll back, and SQLite refuses every read until one has: this way the first read after the
    kill rolls it back, in any process that reads. Where this process cannot write the file or
    its folder, it reads the last committed state from a private copy (``rollback.committed_copy``)."""

    def __init__(self, path: Path, *, readonly: bool = True, synced: bool = True):
        """``synced`` False: SQLite's own fsyncs are skipped, for a file no one reads before its
        writer has fsynced it (a version not yet live: ``indexer.store.versions`` fsyncs its every
        file before the swap); each commit is then a write, not three syncs."""
        self.path = path
        self._copy: Path | None = None  # the private folder of ``_committed_copy``, if reading one
        self._read_at: int | None = None  # the generation the read in progress is checked at
        self._kept = Postings()
        self._apart: set[str] = set()  # the tables of values kept apart known to exist (``_decode``)
        mode = "rw" if readonly else "rwc"
        self.db = sqlite3.connect(f"file:{path}?mode={mode}", uri=True, check_same_thread=False)
        if not synced:
            self.db.execute("pragma synchronous = off")
        if not readonly:  # ``insert or replace`` runs the delete trigger that keeps ``keywords`` exact
            self.db.execute("pragma recursive_triggers = on")
            return
        self.db.execute("pragma query_only = on")
        try:
            self.db.execute("select count(*) from sqlite_master").fetchone()  # rolls a hot journal back
        except OperationalError as exc:
            if not self.cannot_roll_back(exc):
                raise
            self.db.close()
            self.db = self._committed_copy()

    @property
    def file(self) -> Path:
        """The file this catalog reads: ``path``, or its private copy."""
        return self.path if self._copy is None else self._copy / self.path.name

    def _committed_copy(self) -> sqlite3.Connection:
        """``rollback.committed_copy``: its private folder removed with this catalog."""
        db, self._copy = rollback.committed_copy(self.path)
        if self._copy is not None:
            weakref.finalize(self, shutil.rmtree, self._copy, True)
        return db

    def cannot_roll_back(self, error: BaseException) -> bool:
        """Whether ``error`` is a read of this file failed by a killed writer's journal this
        process cannot roll back (``rollback.cannot_roll_back``)."""
        return rollback.cannot_roll_back(error, self.path)

    def outdated(self) -> bool:
        """Whether this reads a private copy though the file itself reads again (its journal was
        rolled back: a later commit is not in the copy). Reopen it."""
        return self._copy is not None and not rollback.journal_of(self.path).exists()

    @classmethod
    def create(
        cls,
        path: Path,
        field_types: dict[str, str],
        keyword_fields: Sequence[str] = (),
        *,
        bulk: bool = False,
    ) -> Catalog:
        """A new catalog whose keyword table reads ``_text`` and the columns ``keyword_fields``
        names (``keyword_fields()``: the also fields). ``bulk``: a new version's, written whole
        before anyone reads it: SQLite does not sync it (``synced``), and its keyword table reads
        each part's rows as they are put and gets its triggers at the first ``commit``
        (``keep_up_keywords``: a fifth of the cost of the triggers' row by row), so it answers
        no keyword search before that commit."""
        catalog = cls(path, readonly=False, synced=not bulk)
        columns = ", ".join(f"{quote(n)} {SQL_TYPES[t]}" for n, t in field_types.items())
        catalog.db.executescript(
            "create table meta (key text primary key, value text);"
            "create table entries (_rowid integer primary key, _id text not null unique, _text text,"
            f" _hash text, _chunks integer{', ' + columns if columns else ''});"
        )
        catalog.create_keywords(keyword_fields, triggers=not bulk)
        if bulk:
            catalog._unfilled = keyword_fields
        return catalog

    def close(self) -> None:
        self.db.close()
        if self._copy is not None:
            shutil.rmtree(self._copy, ignore_errors=True)

    def commit(self) -> None:
        self.fill_keywords()
        self.db.commit()

    def vacuum(self) -> None:
        self.db.commit()
        self.db.execute("vacuum")

    # meta

    def read_meta(self) -> dict[str, Any]:
        return {key: json.loads(value) for key, value in self.db.execute("select key, value from meta")}

    def write_meta(self, meta: dict[str, Any]) -> None:
        self.db.executemany(
            "insert or replace into meta (key, value) values (?, ?)",
            [(k, json.dumps(v)) for k, v in meta.items()],
        )

    # columns

    def columns(self) -> list[str]:
        return [row[1] for row in self.db.execute("pragma table_info(entries)")]

    def field_types(self) -> dict[str, str]:
        """The user fields (not the index's own columns) and their types."""
        return {
            name: _FIELD_TYPES.get(declared.upper(), "text")
            for _, name, declared, *_ in self.db.execute("pragma table_info(entries)")
            if name not in RESERVED
        }

    def types_for(self, rows: Sequence[dict[str, Any]]) -> dict[str, str]:
        """Casefolded field name -> type, for the stored fields and any new ones ``rows`` bring
        (typed from those rows). Names match case-insensitively, as SQLite's do."""
        types = {name.casefold(): t for name, t in self.field_types().items()}
        new = {name for name in {n for row in rows for n in row} if name.casefold() not in types}
        if new:  # only new names are typed: a build's parts bring none (its survey typed them all)
            fresh = ({name: row[name] for name in row if name in new} for row in rows)
            for name, field_type in detect_types(fresh).items():
                types.setdefault(name.casefold(), field_type)
        return types

    # entries

    def count(self) -> int:
        return self.db.execute("select count(*) from entries").fetchone()[0]

    def largest_number_id(self) -> int:
        """The largest id that is a whole number written plainly (``12``, not ``012``), or 0: what
        an index built on row numbers has given, where its meta does not say (one scan)."""
        found = self.db.execute(
            "select max(cast(_id as integer)) from entries"
            " where _id glob '[1-9]*' and _id not glob '*[^0-9]*' and length(_id) < 19"
        ).fetchone()[0]
        return int(found or 0)

    def put(self, entries: Sequence[Entry], rowids: Sequence[int], chunks: Sequence[int]) -> None:
        """Insert entries, replacing any row with the same row id whole (fields it no longer has
        become NULL); the keyword table follows (its triggers)."""
        types = self.types_for([e.fields for e in entries])
        known = {name.casefold() for name in self.columns()}
        typed: dict[str, str] = {}  # each name as the rows spell it -> its column's type
        for name in dict.fromkeys(n for e in entries for n in e.fields):
            typed[name] = types[name.casefold()]
            if name.casefold() not in known:
                self.db.execute(f"alter table entries add column {quote(name)} {SQL_TYPES[typed[name]]}")
                known.add(name.casefold())
        self._keep_keywords()
        by_columns: dict[tuple[str, ...], list[tuple]] = {}  # one statement per set of fields
        nested: dict[int, list[str]] = {}  # row id -> its fields that hold a list or an object
        exact_numbers: dict[int, dict[str, str]] = {}  # row id -> field -> a number's JSON text (``exact``)
        for entry, rowid, n in zip(entries, rowids, chunks, strict=True):
            fields = entry.fields
            names = tuple(fields)
            values = [int(rowid), entry.id, entry.text, content_hash(entry.text), int(n)]
            for name in names:
                value, kind = fields[name], typed[name]
                if kind == "text" and type(value) is str:  # stored as it is (``stored_value``'s common case)
                    values.append(value)
                    continue
                values.append(stored_value(value, kind))
                if (written := exact_text(value, kind)) is not None:
                    exact_numbers.setdefault(int(rowid), {})[name] = written
            by_columns.setdefault(names, []).append(tuple(values))
            marked = [name for name in names if structured.is_structured(fields[name])]
            if marked:
                nested[int(rowid)] = marked
        with self.keywords_aside(rowids):
            for names, rows in by_columns.items():
                columns = ", ".join(map(quote, [*RESERVED, *names]))  # _rowid, _id, _text, _hash, _chunks
                marks = ", ".join("?" * (len(RESERVED) + len(names)))
                self.db.executemany(f"insert or replace into entries ({columns}) values ({marks})", rows)
        structured.mark(self.db, nested)
        exact.keep(self.db, exact_numbers)
        self.keep_up_keywords(rowids)

    def matching(self, condition: str, params: Sequence[Any]) -> list[tuple[int, int]]:
        """(row id, vectors held) of each entry a filter admits. ``condition`` is SQL that
        ``search.read.filters`` built from a parsed filter, its values bound as ``params``."""
        try:
            found = self.db.execute(f"select _rowid, _chunks from entries where {condition}", params)
            return found.fetchall()
        except OperationalError as exc:  # what the filter parser's bounds let through
            raise FilterError(f"filter: too large or complex ({exc})") from None

    @contextmanager
    def reading_at(self, generation: int) -> Iterator[None]:
        """One read transaction that sees ``generation``: the reads inside it come from the state
        the caller's vectors were opened at, or ``IndexMoved`` says an update has committed since.
        (A read transaction holds off a writer's commit only while it lasts: keep it short.)"""
        self.db.execute("begin")
        try:
            if self.generation() != generation:
                raise IndexMoved("the index changed while it was being read: ask again")
            self._read_at = generation
            yield
        finally:
            self._read_at = None
            self.db.commit()

    def _postings(self) -> Postings | None:
        """The keyword postings kept for the generation this read is checked at (``reading_at``);
        None outside such a read."""
        return None if self._read_at is None else self._kept.at(self._read_at)

    def generation(self) -> int:
        """The update generation committed into this version (0 before any update)."""
        row = self.db.execute("select value from meta where key = 'generation'").fetchone()
        return int(row[0]) if row else 0

    def integrity_problems(self) -> list[str]:
        """SQLite's own integrity check of the file: ``["ok"]`` when it is sound."""
        try:
            return [row[0] for row in self.db.execute("pragma integrity_check")]
        except DatabaseError as exc:
            return [str(exc)]

    def texts_by_hash(self) -> dict[str, str]:
        """Content hash -> its text: one item per distinct embedded text."""
        return dict(self.db.execute("select _hash, min(_text) from entries group by _hash"))

    def largest_text_group(self) -> int:
        """The most entries that share one text (0 when empty): how far past a text's own
        entries a search must reach to find another one."""
        found = "select coalesce(max(n), 0) from (select count(*) as n from entries group by _hash)"
        return self.db.execute(found).fetchone()[0]

    def fingerprints(self, ids: Sequence[str]) -> dict[str, tuple[str, dict[str, Any]]]:
        """The entries of these external ids that exist: id -> (content hash, fields as
        ``comparable`` gives them). By id, so an update reads what it changes, not the index."""
        types = self.field_types()
        folded = {name.casefold(): t for name, t in types.items()}
        select = ", ".join(map(quote, ["_rowid", "_id", "_hash", *types]))
        found = self.db.execute(
            f"select {select} from entries where _id in (select value from json_each(?))",
            (json.dumps(list(ids)),),
        )
        rows = {row[0]: (row[1], row[2], dict(zip(types, row[3:], strict=True))) for row in found}
        self._decode({rowid: fields for rowid, (_, _, fields) in rows.items()}, answered=False)
        return {i: (hashed, comparable(fields, folded)) for i, hashed, fields in rows.values()}

    def rowids(self, ids: Sequence[str]) -> dict[str, int]:
        """External id -> row id, for the ids that exist."""
        found = self.db.execute(
            "select _id, _rowid from entries where _id in (select value from json_each(?))",
            (json.dumps(ids),),
        )
        return dict(found.fetchall())

    def rows(self, rowids: Sequence[int]) -> dict[int, dict[str, Any]]:
        """Row id -> the whole row, for the row ids that exist."""
        if not len(rowids):
            return {}
        cursor = self.db.execute(
            "select * from entries where _rowid in (select value from json_each(?))",
            (json.dumps([int(r) for r in rowids]),),
        )
        names = [c[0] for c in cursor.description]
        rows = {row[0]: dict(zip(names, row, strict=True)) for row in cursor.fetchall()}
        self._decode(rows)
        return rows

    def _decode(self, rows: dict[int, dict[str, Any]], answered: bool = True) -> None:
        """Lists and objects (``structured.decode``) and numbers SQLite cannot hold
        (``exact.restore``) back as written in ``rows`` (row id -> column -> value), in place."""
        if len(self._apart) < len(_APART):  # each table is made by the first write that needs it
            found = "select name from sqlite_master where type = 'table' and name in (?, ?)"
            self._apart = {name for (name,) in self.db.execute(found, _APART)}
        if structured.STRUCTURED in self._apart:
            structured.decode(self.db, rows, answered)
        if exact.EXACT in self._apart:
            exact.restore(self.db, rows)

    def values(self, rowids: Sequence[int], name: str) -> dict[int, Any]:
        """Row id -> one column, for the row ids that exist: a reserved one (``_id``; ``_hash``:
        equal hashes hold the same text) or a stored field (what hits are grouped by)."""
        found = self.db.execute(
            f"select _rowid, {quote(name)} from entries where _rowid in (select value from json_each(?))",
            (json.dumps([int(r) for r in rowids]),),
        )
        return dict(found.fetchall())

    def group_count(self, name: str, within: Sequence[int] | None = None) -> int:
        """How many groups a field makes of the entries (of ``within``, the row ids a filter
        admits): one per distinct value, one per entry without a value."""
        column = quote(name)
        found = self.db.execute(
            f"select count(distinct {column}) + count(*) - count({column}) from entries" + _WITHIN,
            (None if within is None else json.dumps([int(r) for r in within]),),
        )
        return int(found.fetchone()[0])

    def group_sizes(
        self, name: str, values: Sequence[Any], within: Sequence[int] | None = None
    ) -> dict[Any, int]:
        """Value -> entries holding it in field ``name`` (of ``within``, the row ids a filter
        admits), for each of ``values``."""
        column = quote(name)
        found = self.db.execute(
            f"select {column}, count(*) from entries{_WITHIN}"
            f" and {column} in (select value from json_each(?)) group by {column}",
            (None if within is None else json.dumps([int(r) for r in within]), json.dumps(list(values))),
        )
        return dict(found.fetchall())

    def tombstones(self) -> np.ndarray:
        """(n, 2) int64 rows of (row id, generation that hid its older vectors)."""
        import numpy as np

        try:
            rows = self.db.execute("select _rowid, generation from tombstones").fetchall()
        except sqlite3.OperationalError:  # no update has needed the table yet
            rows = []
        return np.array(rows, dtype=np.int64).reshape(-1, 2)

    def bury(self, rowids: Sequence[int], generation: int) -> None:
        """Hide these rows' vectors in every part older than ``generation``."""
        self.db.execute(
            "create table if not exists tombstones (_rowid integer primary key, generation integer)"
        )
        self.db.executemany(
            "insert or replace into tombstones (_rowid, generation) values (?, ?)",
            [(int(r), int(generation)) for r in rowids],
        )

    def clear_tombstones(self) -> None:
        """After a merge: no vector left to hide."""
        self.db.execute("drop table if exists tombstones")

    def delete(self, rowids: Sequence[int]) -> None:
        self._keep_keywords()
        self._refill = self._refill or self._unfilled is not None  # a bulk table reads all at commit
        self.db.execute(
            "delete from entries where _rowid in (select value from json_each(?))",
            (json.dumps([int(r) for r in rowids]),),
        )


def content_hash(text: str) -> str:
    """What decides whether an entry must be embedded again (the strategy is fixed per index)."""
    import hashlib

    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()[:32]
