"""The catalog's keyword table: an FTS5 table over ``entries._text`` and the ``--also`` fields
(external content, kept exact by triggers in the writer's own transaction), what keyword and
hybrid search read (``search.read.hybrid``). ``Catalog`` takes its operations from ``KeywordTable``.

An index written before the keyword table, or before it read the also fields, gets it with its
next version (the first ``put`` or ``delete`` of a writer makes and fills it, in that writer's
transaction); until then ``keyword_coverage`` says what it reads.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from indexer.catalog.identifiers import quote
from indexer.catalog.postings import Postings, ranked
from indexer.columns import RESERVED

if TYPE_CHECKING:
    import sqlite3

KEYWORDS = "keywords"
"""The FTS5 table of the entries' texts (BM25). Porter stems English words; codes such as
``E3453C`` stay one token."""
_KEYWORD_TEXTS = "keyword_texts"
"""The view the keyword table reads when it covers also fields: their columns under names FTS5
takes (a field may be called ``rank``)."""
_TOKENIZE = "tokenize='porter unicode61 remove_diacritics 2'"
_TRIGGERS = ("keywords_insert", "keywords_delete", "keywords_update")
_KEYWORD_OBJECTS = (KEYWORDS, _KEYWORD_TEXTS, *_TRIGGERS)
MANY_ROWS = 1000
"""Rows put at once from which the keyword table follows them by two statements (the rows they
replace out, then them in) rather than by its triggers row by row (``keywords_aside``)."""


def keyword_fields(text_fields: Sequence[str], also: Sequence[str], columns: Sequence[str]) -> list[str]:
    """The columns besides ``_text`` whose words keyword search reads: the ``--also`` fields
    (``indexer.embedding.fields``) that are not text fields, as ``columns`` spell them (a field
    matches whatever its case); a name no column has is skipped."""
    spelled = {name.casefold(): name for name in columns if name not in RESERVED}
    skipped = {name.casefold() for name in text_fields}
    wanted = dict.fromkeys(name.casefold() for name in also if name.casefold() not in skipped)
    return [spelled[name] for name in wanted if name in spelled]


def _keyword_columns(fields: int) -> tuple[list[str], str]:
    """The keyword table's column names over ``_text`` and ``fields`` also fields, and what it
    reads them from: ``entries`` itself, or with also fields the view that names them."""
    return ["_text", *(f"_also{i}" for i in range(1, fields + 1))], _KEYWORD_TEXTS if fields else "entries"


def _keyword_schema(fields: Sequence[str]) -> dict[str, str]:
    """Name -> statement, in order, of the keyword table over ``_text`` and ``fields`` and of the
    triggers that keep it exact in every transaction that changes ``entries`` (a replaced row fires
    the delete trigger: writable connections set ``recursive_triggers``). With no fields it reads
    ``entries`` itself, as tables written before the also fields did."""
    names, content = _keyword_columns(len(fields))
    values = ["_text", *map(quote, fields)]
    schema: dict[str, str] = {}
    if fields:
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


class KeywordTable:
    """The keyword table's operations on a catalog's connection (``db``) and columns."""

    db: sqlite3.Connection

    def columns(self) -> list[str]:
        """The table's column names (``Catalog.columns``)."""
        raise NotImplementedError

    def create_keywords(self, fields: Sequence[str], *, triggers: bool = True) -> None:
        """Make the keyword table of a new catalog over ``_text`` and ``fields``; without its
        ``triggers`` it reads no row until ``fill_keywords``."""
        for name, statement in _keyword_schema(fields).items():
            if triggers or name not in _TRIGGERS:
                self.db.execute(statement)

    _unfilled: Sequence[str] | None = None
    """A bulk catalog's keyword fields until its first commit (``Catalog.create``)."""
    _read_to = 0
    """The last row id a bulk catalog's keyword table has read (``keep_up_keywords``)."""
    _refill = False
    """Whether a bulk catalog's keyword table must read every row again at the commit."""

    def keep_up_keywords(self, rowids: Sequence[int]) -> None:
        """A bulk catalog's keyword table reads each part's rows as they are put: SQLite's work
        beside the rest of a build rather than one pass after it (the same cost). Rows that are
        not one run of new row ids (a row put again) leave it to the commit to read them all."""
        if self._unfilled is None or self._refill or not len(rowids):
            return
        low, high = int(min(rowids)), int(max(rowids))
        if low <= self._read_to or high - low + 1 != len(rowids):
            self._refill = True
            return
        columns, content = _keyword_columns(len(self._unfilled))
        names = ", ".join(columns)
        self.db.execute(
            f"insert into keywords(rowid, {names}) select _rowid, {names} from {content}"
            " where _rowid between ? and ?",
            (low, high),
        )
        self._read_to = high

    def fill_keywords(self) -> None:
        """At a bulk catalog's first commit: its keyword table made whole (FTS5's ``rebuild``,
        where ``keep_up_keywords`` could not keep up) and the triggers that keep it exact from
        then on."""
        if self._unfilled is None:
            return
        if self._refill:
            self.db.execute("insert into keywords(keywords) values ('rebuild')")
        for name, statement in _keyword_schema(self._unfilled).items():
            if name in _TRIGGERS:
                self.db.execute(statement)
        self._unfilled = None

    @contextmanager
    def keywords_aside(self, rowids: Sequence[int]) -> Iterator[None]:
        """Around a put of ``MANY_ROWS`` or more rows into a catalog whose triggers keep its
        keyword table: the triggers dropped and the rows the put replaces taken out of the table
        in one statement; after the put, its rows read in by one and the triggers made again, in
        the put's transaction. The same table, at a third of the triggers' cost (an ``add`` of
        100,000 rows, docs/performance.md)."""
        found = (
            "select name, sql from sqlite_master where type = 'trigger'"
            " and name in (select value from json_each(?))"
        )
        triggers = (
            [] if len(rowids) < MANY_ROWS else self.db.execute(found, (json.dumps(_TRIGGERS),)).fetchall()
        )
        if len(triggers) != len(_TRIGGERS):  # few rows, a bulk catalog (no triggers yet), no table
            yield
            return
        also = len(self.db.execute(f"pragma table_info({KEYWORDS})").fetchall()) - 1  # besides _text
        columns, content = _keyword_columns(also)
        names = ", ".join(columns)
        chosen = f"select _rowid, {names} from {content} where _rowid in (select value from json_each(?))"
        given = (json.dumps([int(r) for r in rowids]),)
        if not self.db.in_transaction:  # the triggers come back, or stay, with the rows
            self.db.execute("begin")
        for name, _ in triggers:
            self.db.execute(f"drop trigger {name}")
        self.db.execute(
            f"insert into keywords(keywords, rowid, {names}) select 'delete', * from ({chosen})", given
        )
        yield
        self.db.execute(f"insert into keywords(rowid, {names}) {chosen}", given)
        for _, statement in triggers:
            self.db.execute(statement)

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
    ) -> list[tuple[int, float, float]]:
        """(row id, the summed ``weights`` of the ``phrases`` it holds, its BM25: ``-bm25()``) of
        the k best entries by BM25 for an FTS5 ``match`` expression (``search.read.hybrid`` builds
        both from the user's words), among ``allowed`` row ids when given; equal BM25 in row id
        (file) order. An entry's weight is summed in the phrases' order from which of them it
        holds, so entries holding the same ones get the very same number."""
        params: dict[str, Any] = {"match": match, "k": int(k)}
        within = ""
        if allowed is not None:
            params["allowed"] = json.dumps([int(r) for r in allowed])
            within = " and rowid in (select value from json_each(:allowed))"
        scored = dict(
            self.db.execute(
                f"select rowid, -bm25(keywords) from keywords where keywords match :match{within}"
                " order by bm25(keywords), rowid limit :k",
                params,
            ).fetchall()
        )
        found = list(scored)
        # Which weighted phrase each found entry holds: one pass over each phrase's matches (a
        # word that weighs something is held by under a quarter of the entries), not one look-up
        # per entry and phrase, which costs FTS5 a seek each.
        masks = dict.fromkeys(found, 0)
        counted = [i for i, weight in enumerate(weights) if weight > 0]  # a word of no weight adds nothing
        for i in counted if found else ():
            holding = self.db.execute("select rowid from keywords where keywords match ?", (phrases[i],))
            for (rowid,) in holding:
                if rowid in masks:
                    masks[rowid] |= 1 << i
        return [(rowid, _held(masks[rowid], counted, weights), scored[rowid]) for rowid in found]

    def keyword_ranking(
        self,
        phrases: Sequence[str],
        k: int,
        allowed: Sequence[int] | None = None,
        weights: Sequence[float] = (),
    ) -> list[tuple[int, float, float]]:
        """``keyword_search`` of the OR of ``phrases``: the same entries, order, sums and BM25. Inside a
        read checked at a generation (``Catalog.reading_at``) it is summed from the phrases' kept
        postings (``indexer.catalog.postings``) where each is held by few enough entries."""
        if not phrases:
            return []
        kept = self._postings()
        postings = [kept.posting(self.db, phrase) for phrase in phrases] if kept is not None else []
        if kept is None or any(found.rows is None for found in postings):
            return self.keyword_search(" OR ".join(phrases), k, allowed, phrases, weights)
        return ranked(postings, k, allowed, list(weights) or [0.0] * len(phrases))

    def keyword_frequencies(self, phrases: Sequence[str]) -> tuple[int, list[int]]:
        """The entries the keyword table holds and how many of them match each FTS5 phrase: what
        a word's weight reads (``search.read.hybrid.word_weight``); kept between the reads at one
        generation."""
        kept = self._postings()
        if kept is not None:
            return kept.total(self.db), [kept.posting(self.db, phrase).count for phrase in phrases]
        total = self.db.execute("select count(*) from entries").fetchone()[0]
        count = "select count(*) from keywords where keywords match ?"
        return int(total), [int(self.db.execute(count, [p]).fetchone()[0]) for p in phrases]

    def _postings(self) -> Postings | None:
        """The kept postings of the generation this read is checked at; None outside such a read."""
        raise NotImplementedError


def _held(mask: int, counted: Sequence[int], weights: Sequence[float]) -> float:
    """The summed weights of the phrases ``mask`` marks, in the phrases' order (entries holding the
    same ones get the very same number)."""
    total = 0.0
    for i in counted:
        total += float(weights[i]) if mask >> i & 1 else 0.0
    return total
