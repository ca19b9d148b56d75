"""The catalog: the SQLite half of an index version (``meta.db``), one row per entry plus the
index's meta, with typed operations on it. The vectors are the other half (``vector_index``).
How a field's values decide its column type, and how a value is stored in it: ``indexer.reading.field_types``.

Tables::

    entries(_rowid INTEGER PRIMARY KEY, _id TEXT UNIQUE, _text, _hash, _chunks, <user fields>)
    meta(key TEXT PRIMARY KEY, value)    JSON values: strategy, counts, index kind, source, ...
    tombstones(_rowid INTEGER PRIMARY KEY, generation INTEGER)   vectors hidden by an update
                                         (``indexer.segments``); made by the first update that needs it
    keywords                             FTS5 over ``entries._text`` and the also fields (external
                                         content, kept by triggers in the writer's own transaction):
                                         keyword search
    keyword_texts                        the view it reads those columns through (with also fields)

An index written before the keyword table, or before it read the also fields, gets it with its
next version (the first ``put`` or ``delete`` of a writer makes and fills it, in that writer's
transaction).

Operations that take many ids bind them as one JSON array (``json_each``), never one parameter
per id, so they work past SQLite's bound-parameter limit.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, Protocol, TypedDict

from indexer.columns import RESERVED
from indexer.errors import FilterError, IndexMoved
from indexer.reading.field_types import comparable, detect_types, stored_value

if TYPE_CHECKING:
    import numpy as np

SQL_TYPES = {"integer": "INTEGER", "number": "NUMERIC", "text": "TEXT"}
_FIELD_TYPES = {"INTEGER": "integer", "NUMERIC": "number", "REAL": "number", "FLOAT": "number"}
MAX_FACET_VALUES = 50  # distinct values up to which a field gets a value list (a select on a page)
MAX_FACET_CHARS = 100  # a longer value is prose (an answer), not something to pick from a list
REPEATS_SAMPLE = 10_000  # entries read to tell whether a field's values repeat (bounded work a field)

KEYWORDS = "keywords"
"""The FTS5 table of the entries' texts (BM25). Porter stems English words; codes such as
``E3453C`` stay one token."""
_KEYWORD_TEXTS = "keyword_texts"
"""The view the keyword table reads when it covers also fields: their columns under names FTS5
takes (a field may be called ``rank``)."""
_TOKENIZE = "tokenize='porter unicode61 remove_diacritics 2'"
_KEYWORD_OBJECTS = (KEYWORDS, _KEYWORD_TEXTS, "keywords_insert", "keywords_delete", "keywords_update")


def keyword_fields(text_fields: Sequence[str], also: Sequence[str], columns: Sequence[str]) -> list[str]:
    """The columns besides ``_text`` whose words keyword search reads: the ``--also`` fields
    (``indexer.embedding.fields``) that are not text fields, as ``columns`` spell them (a field
    matches whatever its case); a name no column has is skipped."""
    spelled = {name.casefold(): name for name in columns if name not in RESERVED}
    skipped = {name.casefold() for name in text_fields}
    wanted = dict.fromkeys(name.casefold() for name in also if name.casefold() not in skipped)
    return [spelled[name] for name in wanted if name in spelled]


def _keyword_schema(fields: Sequence[str]) -> dict[str, str]:
    """Name -> statement, in order, of the keyword table over ``_text`` and ``fields`` and of the
    triggers that keep it exact in every transaction that changes ``entries`` (a replaced row fires
    the delete trigger: writable connections set ``recursive_triggers``). With no fields it reads
    ``entries`` itself, as tables written before the also fields did."""
    names = ["_text", *(f"_also{i}" for i in range(1, len(fields) + 1))]
    values = ["_text", *map(quote, fields)]
    schema: dict[str, str] = {}
    content = "entries"
    if fields:
        content = _KEYWORD_TEXTS
        columns = ", ".join(f"{value} as {name}" for value, name in zip(values, names, strict=True))
        schema[_KEYWORD_TEXTS] = f"create view {_KEYWORD_TEXTS} as select _rowid, {columns} from entries"
    listed = ", ".join(names)
    new, old = (", ".join(f"{row}.{value}" for value in values) for row in ("new", "old"))
    insert = f"insert into keywords(rowid, {listed}) values (new._rowid, {new})"
    delete = f"insert into keywords(keywords, rowid, {listed}) values ('delete', old._rowid, {old})"
    schema[KEYWORDS] = (
        f"create virtual table keywords using fts5({listed}, content='{content}', content_rowid='_rowid',"
        f" {_TOKENIZE})"
    )
    schema["keywords_insert"] = f"create trigger keywords_insert after insert on entries begin {insert}; end"
    schema["keywords_delete"] = f"create trigger keywords_delete after delete on entries begin {delete}; end"
    changed = ", ".join(values)
    schema["keywords_update"] = (
        f"create trigger keywords_update after update of {changed} on entries begin {delete}; {insert}; end"
    )
    return schema


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


def _journal_header(journal: Path) -> bytes:
    """The first bytes of a rollback journal: its header, with the nonce of its transaction."""
    with journal.open("rb") as f:
        return f.read(28)


def is_disk_full(error: BaseException) -> bool:
    """Whether SQLite failed because the disk is full (SQLITE_FULL)."""
    code = getattr(error, "sqlite_errorcode", None)
    return isinstance(error, OperationalError) and code == sqlite3.SQLITE_FULL


class Facet(TypedDict):
    """One stored field as ``Catalog.facets`` describes it (the JSON of ``GET /fields``)."""

    type: str  # integer, number or text
    values: list[list[Any]] | None  # [value, count] pairs, most common first; None: too many or long
    repeats: bool  # a value stands in more than one entry (of a bounded sample): a field to group by
    min: NotRequired[int | float | None]  # numeric fields only: None when no value is a number
    max: NotRequired[int | float | None]


_WITHIN = " where (?1 is null or _rowid in (select value from json_each(?1)))"
"""The rows of a grouping: all, or those of a JSON list of row ids (a filter's)."""


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class Catalog:
    """One version's ``meta.db``, opened for reading (queries) or writable (a write in progress).

    A reader's connection may write (``query_only`` keeps its statements from doing so) because a
    writer killed mid-transaction leaves a hot ``-journal`` that only a connection that may write
    can roll back, and SQLite refuses every read until one has: this way the first read after the
    kill rolls it back, in any process that reads. Where this process cannot write the file or
    its folder, it reads the last committed state from a private copy (``_committed_copy``)."""

    def __init__(self, path: Path, *, readonly: bool = True):
        self.path = path
        self._copy: Path | None = None  # the private folder of ``_committed_copy``, if reading one
        mode = "rw" if readonly else "rwc"
        self.db = sqlite3.connect(f"file:{path}?mode={mode}", uri=True, check_same_thread=False)
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
    def journal(self) -> Path:
        return self.path.with_name(self.path.name + "-journal")

    @property
    def file(self) -> Path:
        """The file this catalog reads: ``path``, or its private copy."""
        return self.path if self._copy is None else self._copy / self.path.name

    def _committed_copy(self) -> sqlite3.Connection:
        """The last committed state of a file whose hot journal this process cannot roll back
        (it may not write there): the journal, then the file, copied to a private folder and
        rolled back there. The copy is whole if the journal still begins the same afterwards (a
        rollback deletes it; a new transaction's journal has another nonce): otherwise someone
        rolled it back meanwhile, and the file itself reads."""
        for _attempt in range(3):
            self._copy = Path(tempfile.mkdtemp(prefix="semsearch-catalog-"))
            weakref.finalize(self, shutil.rmtree, self._copy, True)
            try:
                header = _journal_header(self.journal)
                shutil.copyfile(self.journal, self._copy / self.journal.name)
                shutil.copyfile(self.path, self.file)
                whole = _journal_header(self.journal) == header
            except FileNotFoundError:  # rolled back meanwhile
                whole = False
            if whole:
                db = sqlite3.connect(f"file:{self.file}?mode=rw", uri=True, check_same_thread=False)
                db.execute("select count(*) from sqlite_master").fetchone()  # the rollback
                db.execute("pragma query_only = on")
                return db
            shutil.rmtree(self._copy, ignore_errors=True)
            self._copy = None
            db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
            try:
                db.execute("select count(*) from sqlite_master").fetchone()
                return db
            except OperationalError as exc:  # another writer was killed meanwhile: copy again
                db.close()
                if not self.cannot_roll_back(exc):
                    raise
        raise OperationalError(f"cannot read {self.path}: writers keep being killed while it is read")

    def cannot_roll_back(self, error: BaseException) -> bool:
        """Whether SQLite failed a read because this process cannot roll back a killed writer's
        journal of this file: it may not write the file (SQLITE_READONLY_ROLLBACK), open the
        journal for writing (SQLITE_CANTOPEN) or delete it (SQLITE_IOERR_DELETE)."""
        code = getattr(error, "sqlite_errorcode", 0) & 0xFF
        unable = (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_IOERR)
        return isinstance(error, OperationalError) and code in unable and self.journal.exists()

    def outdated(self) -> bool:
        """Whether this reads a private copy though the file itself reads again (its journal was
        rolled back: a later commit is not in the copy). Reopen it."""
        return self._copy is not None and not self.journal.exists()

    @classmethod
    def create(cls, path: Path, field_types: dict[str, str], keyword_fields: Sequence[str] = ()) -> Catalog:
        """A new catalog whose keyword table reads ``_text`` and the columns ``keyword_fields``
        names (``keyword_fields()``: the also fields)."""
        catalog = cls(path, readonly=False)
        columns = ", ".join(f"{quote(n)} {SQL_TYPES[t]}" for n, t in field_types.items())
        catalog.db.executescript(
            "create table meta (key text primary key, value text);"
            "create table entries (_rowid integer primary key, _id text not null unique, _text text,"
            f" _hash text, _chunks integer{', ' + columns if columns else ''});"
        )
        for statement in _keyword_schema(keyword_fields).values():
            catalog.db.execute(statement)
        return catalog

    def close(self) -> None:
        self.db.close()
        if self._copy is not None:
            shutil.rmtree(self._copy, ignore_errors=True)

    def commit(self) -> None:
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

    def facets(self, max_values: int = MAX_FACET_VALUES) -> dict[str, Facet]:
        """Each user field: its ``type``; ``values`` (``[value, count]`` pairs, most common first)
        when it holds at most ``max_values`` distinct non-NULL values, none longer than
        ``MAX_FACET_CHARS``, else None; ``repeats``, whether a value stands in more than one of its
        first ``REPEATS_SAMPLE`` entries (a field to group by); and for numeric fields
        ``min``/``max`` of the numbers in it. What a search page builds its filters from.

        Bounded work: the distinct values are read through ``LIMIT max_values + 1``, so a field
        with many values costs one partial scan and is never grouped or counted."""
        facets = {}
        for name, field_type in self.field_types().items():
            column = quote(name)
            distinct = self.db.execute(
                f"select count(*) from (select distinct {column} from entries"
                f" where {column} is not null limit ?)",
                (max_values + 1,),
            ).fetchone()[0]
            values = None
            if distinct <= max_values:
                values = [
                    list(row)
                    for row in self.db.execute(
                        f"select {column}, count(*) from entries where {column} is not null"
                        f" group by {column} order by count(*) desc, {column}"
                    )
                ]
                if any(len(str(value)) > MAX_FACET_CHARS for value, _ in values):
                    values = None
            rows, different = self.db.execute(
                f"select count(*), count(distinct {column}) from (select {column} from entries"
                f" where {column} is not null limit ?)",
                (REPEATS_SAMPLE,),
            ).fetchone()
            facet = Facet(type=field_type, values=values, repeats=different < rows)
            if field_type != "text":
                low, high = self.db.execute(
                    f"select min({column}), max({column}) from entries"
                    f" where typeof({column}) in ('integer', 'real')"
                ).fetchone()
                facet.update(min=low, max=high)
            facets[name] = facet
        return facets

    def types_for(self, rows: Sequence[dict[str, Any]]) -> dict[str, str]:
        """Casefolded field name -> type, for the stored fields and any new ones ``rows`` bring
        (typed from those rows). Names match case-insensitively, as SQLite's do."""
        types = {name.casefold(): t for name, t in self.field_types().items()}
        for name, field_type in detect_types(rows).items():
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

    def has_keywords(self) -> bool:
        """Whether this version keeps the keyword table (one written before it does not)."""
        found = "select 1 from sqlite_master where type = 'table' and name = ?"
        return self.db.execute(found, (KEYWORDS,)).fetchone() is not None

    def _wanted_keyword_fields(self) -> list[str]:
        """The fields besides ``_text`` the keyword table should read: the also fields the meta's
        ``source`` names."""
        row = self.db.execute("select value from meta where key = 'source'").fetchone()
        source = json.loads(row[0]) if row else {}
        also = (source.get("also") or {}).get("fields") or []
        return keyword_fields(source.get("text_fields") or [], also, self.columns())

    def _keyword_objects(self) -> list[tuple[str, str, str]]:
        """(type, name, sql) of the keyword table's objects as kept: triggers, the table, the view."""
        return self.db.execute(
            "select type, name, sql from sqlite_master where name in (select value from json_each(?))"
            " order by type = 'view', type = 'table'",
            (json.dumps(_KEYWORD_OBJECTS),),
        ).fetchall()

    def keyword_coverage(self) -> tuple[list[str], list[str]]:
        """The fields besides ``_text`` the keyword table reads, and those it should read but will
        only from the next version (a table written over the text alone): what ``info`` says."""
        wanted = self._wanted_keyword_fields()
        kept = {name: sql.lower() for _, name, sql in self._keyword_objects()}
        if kept == {name: sql.lower() for name, sql in _keyword_schema(wanted).items()}:
            return wanted, []
        return [], wanted

    def _keep_keywords(self) -> None:
        """Make the keyword table, filled from the rows, of a version written before it or before
        it read the also fields its meta's ``source`` names (a version being built has no source
        yet: ``create`` made its table), inside the caller's transaction (so the rows and their
        keywords commit, or roll back, together)."""
        has_source = self.db.execute("select 1 from meta where key = 'source'").fetchone() is not None
        if not has_source and self.has_keywords():
            return
        wanted = _keyword_schema(self._wanted_keyword_fields())
        found = self._keyword_objects()
        kept = {name: sql.lower() for _, name, sql in found}
        if kept == {name: sql.lower() for name, sql in wanted.items()}:
            return
        for kind, name, _ in found:
            self.db.execute(f"drop {kind} {name}")
        for statement in wanted.values():
            self.db.execute(statement)
        self.db.execute("insert into keywords(keywords) values ('rebuild')")

    def keyword_search(
        self,
        match: str,
        k: int,
        allowed: Sequence[int] | None = None,
        phrases: Sequence[str] = (),
        weights: Sequence[float] = (),
    ) -> list[tuple[int, float]]:
        """(row id, the summed ``weights`` of the ``phrases`` it holds) of the k best entries by
        BM25 for an FTS5 ``match`` expression (``search.hybrid`` builds both from the user's
        words), among ``allowed`` row ids when given; equal BM25 in row id (file) order. An
        entry's weight is summed in the phrases' order from which of them it holds, so entries
        holding the same ones get the very same number."""
        params: dict[str, Any] = {"match": match, "k": int(k)}
        within = ""
        if allowed is not None:
            params["allowed"] = json.dumps([int(r) for r in allowed])
            within = " and rowid in (select value from json_each(:allowed))"
        counted = [i for i, weight in enumerate(weights) if weight > 0]  # a word of no weight adds nothing
        held, sums = "", "0.0"
        if counted:
            parts = []
            for i in counted:
                params[f"p{i}"], params[f"w{i}"] = phrases[i], float(weights[i])
                parts.append(
                    f"select rowid, {1 << i} from keywords where keywords match :p{i}"
                    " and rowid in (select rowid from matched)"
                )
            held = (
                f", held(rowid, bit) as ({' union all '.join(parts)}),"
                " masks(rowid, mask) as (select rowid, sum(bit) from held group by rowid)"
            )
            sums = " + ".join(f"((coalesce(mask, 0) >> {i}) & 1) * :w{i}" for i in counted)
        found = self.db.execute(
            "with matched as materialized (select rowid, bm25(keywords) as rank from keywords"
            f" where keywords match :match{within} order by rank, rowid limit :k){held}"
            f" select matched.rowid, {sums} from matched{' left join masks using (rowid)' if counted else ''}"
            " order by rank, matched.rowid",
            params,
        )
        return found.fetchall()

    def keyword_frequencies(self, phrases: Sequence[str]) -> tuple[int, list[int]]:
        """The entries the keyword table holds and how many of them match each FTS5 phrase: what
        a word's weight reads (``search.hybrid.word_weight``)."""
        total = self.db.execute("select count(*) from entries").fetchone()[0]
        count = "select count(*) from keywords where keywords match ?"
        return int(total), [int(self.db.execute(count, [p]).fetchone()[0]) for p in phrases]

    def put(self, entries: Sequence[Entry], rowids: Sequence[int], chunks: Sequence[int]) -> None:
        """Insert entries, replacing any row with the same row id whole (fields it no longer has
        become NULL); the keyword table follows (its triggers)."""
        types = self.types_for([e.fields for e in entries])
        known = {name.casefold() for name in self.columns()}
        for name in dict.fromkeys(n for e in entries for n in e.fields):
            if name.casefold() not in known:
                self.db.execute(
                    f"alter table entries add column {quote(name)} {SQL_TYPES[types[name.casefold()]]}"
                )
                known.add(name.casefold())
        self._keep_keywords()
        by_columns: dict[tuple[str, ...], list[tuple]] = {}  # one statement per set of fields
        for entry, rowid, n in zip(entries, rowids, chunks, strict=True):
            names = tuple(entry.fields)
            values = (int(rowid), entry.id, entry.text, content_hash(entry.text), int(n))
            values += tuple(stored_value(entry.fields[name], types[name.casefold()]) for name in names)
            by_columns.setdefault(names, []).append(values)
        for names, rows in by_columns.items():
            columns = ", ".join(map(quote, [*RESERVED, *names]))  # _rowid, _id, _text, _hash, _chunks
            marks = ", ".join("?" * (len(RESERVED) + len(names)))
            self.db.executemany(f"insert or replace into entries ({columns}) values ({marks})", rows)

    def matching(self, condition: str, params: Sequence[Any]) -> list[tuple[int, int]]:
        """(row id, vectors held) of each entry a filter admits. ``condition`` is SQL that
        ``search.filters`` built from a parsed filter, its values bound as ``params``."""
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
            yield
        finally:
            self.db.commit()

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
        select = ", ".join(map(quote, ["_id", "_hash", *types]))
        found = self.db.execute(
            f"select {select} from entries where _id in (select value from json_each(?))",
            (json.dumps(list(ids)),),
        )
        return {row[0]: (row[1], comparable(dict(zip(types, row[2:], strict=True)), folded)) for row in found}

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
        return {row[0]: dict(zip(names, row, strict=True)) for row in cursor.fetchall()}

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
            f"select count(distinct {column}) + count(*) - count({column}) from entries"
            + _WITHIN,
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
        self.db.execute(
            "delete from entries where _rowid in (select value from json_each(?))",
            (json.dumps([int(r) for r in rowids]),),
        )


def content_hash(text: str) -> str:
    """What decides whether an entry must be embedded again (the strategy is fixed per index)."""
    import hashlib

    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()[:32]
