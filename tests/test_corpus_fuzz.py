"""Hostile corpora, generated (hypothesis, derandomized so every run tries the same files): lone
surrogates, NUL, BOMs, line separators inside values, deep nesting, huge integers, odd ids and
mixed types, in CSV, TSV, JSON Lines and plain text. Every row is an entry or a rejection with its
reason, the counts add up, every entry can be stored and comes back as written, and nothing ends in
anything but a one-line ``SemsearchError``."""

from __future__ import annotations

import csv
import io
import json
import re
import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from indexer import Strategy, build_index
from indexer.catalog import SQL_TYPES, Catalog
from indexer.errors import SemsearchError
from indexer.reading.corpus import Corpus, read_corpus
from indexer.reading.field_types import SQLITE_NUMBER, as_number, detect_types, value_kind
from indexer.store import open_index
from indexer.writing.update import add_to_index

HOSTILE = [
    "\x00", "\ud83d", "\ude00", "\udc80", "\ufeff", "\u2028", "\x0c", "\x0b", "\x85", "\r", "\n",
    '"', ",", "\t", " ", "\\", "{", "é", "😀", "0", "01", "+1", "1e999", "9" * 25, "-", ".",
]  # fmt: skip
FUZZ = settings(
    max_examples=150, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

chars = st.one_of(st.sampled_from(HOSTILE), st.characters())
texts = st.lists(chars, max_size=6).map("".join)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**25), 10**25), st.floats(), texts, st.sampled_from(["1", "01"])
)
values = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(texts, inner, max_size=3))
)
ODD_NAMES = ["_id", "Text", "_rowid"]
"""Names that refuse a whole file (reserved, or one column with "text"): left out of a build."""


def rows(odd: bool) -> st.SearchStrategy[dict]:
    names = st.one_of(st.sampled_from(["id", "text", "zip", "n", *(ODD_NAMES if odd else [])]), texts)
    if not odd:
        names = names.filter(lambda name: name.casefold() not in ("text", "_id", "_rowid"))
    return st.fixed_dictionaries(
        {"text": st.one_of(st.text(max_size=15), values)},
        optional={"id": values, "zip": values, "n": values, **({"_id": values} if odd else {})},
    ).flatmap(lambda row: st.dictionaries(names, values, max_size=2).map(lambda more: {**more, **row}))


@st.composite
def jsonl_lines(draw: st.DrawFn, odd: bool) -> bytes:
    """A JSON Lines row, or something that is not one; never a line end but the last byte."""
    kind = draw(st.sampled_from(["row", "row", "row", "deep", "garbage", "empty"]))
    if kind == "row":
        text = json.dumps(draw(rows(odd)), ensure_ascii=draw(st.booleans()))
    elif kind == "deep":
        depth = draw(st.integers(0, 3000))
        text = '{"text": "t", "n": ' + "[" * depth + "]" * depth + "}"
    elif kind == "garbage":
        return draw(st.binary(max_size=20)).replace(b"\n", b" ").replace(b"\r", b" ") + b"\n"
    else:
        text = ""
    return text.encode("utf-8", "surrogatepass") + b"\n"  # a surrogate left raw: invalid UTF-8


def cells(line_ends: bool) -> st.SearchStrategy[str]:
    """A CSV cell (anything: the writer quotes it) or a TSV cell (no tab or line end)."""
    if line_ends:
        return st.one_of(texts, st.sampled_from(["1", "01", "9.5", "+44", "", "n/a"]))
    return texts.map(lambda t: t.replace("\t", " ").replace("\n", " ").replace("\r", " "))


@st.composite
def corpus_file(draw: st.DrawFn, fmt: str, least: int = 1, good: int = 0) -> tuple[bytes, int]:
    """A corpus file's bytes and the number of rows it holds: ``least`` rows or more, then
    ``good`` plain ones (and then no name that refuses the whole file: ``ODD_NAMES``)."""
    bom = b"\xef\xbb\xbf" if draw(st.booleans()) else b""
    plain = [f"plain row {i}" for i in range(good)]
    if fmt == "jsonl":
        lines = draw(st.lists(jsonl_lines(odd=not good), min_size=least, max_size=least + 8))
        lines += [json.dumps({"text": text}).encode() + b"\n" for text in plain]
        return bom + b"".join(lines), len(lines)
    if fmt == "text":
        content = "\n".join(draw(st.lists(texts, min_size=least, max_size=least + 8)) + plain) + "\n"
        raw = content.encode("utf-8", "surrogatepass")
        return bom + raw, raw.count(b"\n")  # a line ends at \n only, as wc -l counts
    header = draw(
        st.lists(st.one_of(st.sampled_from(["id", "text", "zip"]), cells(fmt == "csv")), max_size=4)
    )
    header = ["text", *header]
    if good:  # names that stay apart, none reserved
        header = list({name.strip().casefold(): name for name in reversed(header)}.values())[::-1]
        header = [name for name in header if name.strip().casefold() not in ("_id", "_rowid")]
    width = st.integers(len(header) - 1, len(header) + 1)
    record = width.flatmap(lambda n: st.lists(cells(fmt == "csv"), min_size=n, max_size=n))
    records = draw(st.lists(record, min_size=least - 1, max_size=least + 8))
    records += [[text] * len(header) for text in plain]
    out = io.StringIO()
    if fmt == "csv":
        writer = csv.writer(out)  # \r\n ends its lines: a \r or \n in a cell is quoted
        writer.writerows([header, *records])
    else:
        out.write("".join("\t".join(record) + "\n" for record in [header, *records]))
    return bom + out.getvalue().encode("utf-8", "surrogatepass"), len(records)


def read(path: Path, fmt: str) -> Corpus | None:
    """The corpus, or None for a file refused whole with one clear line (a bad header, field
    names that clash, no usable row)."""
    try:
        return read_corpus(path, fmt=fmt)
    except SemsearchError as exc:
        assert "\n" not in str(exc) and str(exc)
        return None


def check_stored(corpus: Corpus, directory: Path) -> None:
    """Every entry can be stored, and its id and text values come back as written (a number
    column gives back the number a text reads as, never another value)."""
    assert all(e.text.encode("utf-8") and e.id.encode("utf-8") for e in corpus.entries)  # no surrogate
    types = detect_types(e.fields for e in corpus.entries)
    catalog = Catalog.create(directory / "meta.db", types)
    rowids = list(range(1, len(corpus.entries) + 1))
    catalog.put(corpus.entries, rowids, [1] * len(rowids))
    stored = catalog.rows(rowids)
    for rowid, entry in zip(rowids, corpus.entries, strict=True):
        row = stored[rowid]
        assert (row["_id"], row["_text"]) == (entry.id, entry.text)
        for name, value in entry.fields.items():
            if isinstance(value, str) and value.strip():
                assert row[name] == value or row[name] == as_number(value), (name, value, row[name])
    catalog.close()


@FUZZ
@given(st.text(st.sampled_from("0123456789 \t+-.e\u0663\u00b2\uff11"), min_size=1, max_size=24))
def test_a_digit_text_counts_as_its_number_reads(value):
    """Texts of digits (an id column's) take a short way to their kind: it is the kind their
    number gives them, past 64 bits, with a leading zero, in other scripts' digits too."""
    number = as_number(value)
    if not value.strip():
        expected = None
    elif number is not None:
        expected = "integer" if isinstance(number, int) else "float"
    elif value.strip()[0] not in "0123456789+-.":
        expected = "text"
    else:
        expected = "code" if SQLITE_NUMBER.fullmatch(value) else "text"
    assert value_kind(value) == expected


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "tsv", "text"])
def test_every_row_is_an_entry_or_a_rejection_with_its_reason(fmt):
    # 50 files a format: drawing a hostile file costs hypothesis more than reading it does
    @settings(FUZZ, max_examples=50)
    @given(corpus_file(fmt))
    def run(generated: tuple[bytes, int]) -> None:
        content, rows = generated
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"c.{fmt}"
            path.write_bytes(content)
            corpus = read(path, fmt)
            if corpus is None:
                return
            assert corpus.rows == rows
            assert all(r.reason for r in corpus.rejected)
            assert len({e.id for e in corpus.entries}) == len(corpus.entries)
            check_stored(corpus, Path(tmp))

    run()


@FUZZ
@given(st.text(st.sampled_from("0123456789+-.eE \t\n\x0b\x0c\rx\xa0"), max_size=8))
def test_what_sqlite_reads_as_a_number_is_known(value):
    """``SQLITE_NUMBER`` is the text SQLite's numeric affinity converts: what the catalog relies
    on to keep a code (``007``) out of a number column."""
    db = sqlite3.connect(":memory:")
    db.execute(f"create table t (a {SQL_TYPES['number']})")
    db.execute("insert into t values (?)", (value,))
    converted = db.execute("select typeof(a) from t").fetchone()[0] != "text"
    assert converted == bool(SQLITE_NUMBER.fullmatch(value))


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "tsv", "text"])
def test_hostile_files_build_and_add_with_counts_that_add_up(tmp_path, tiny_model, fmt):
    """Real builds and adds of generated hostile files (a few, on the tiny model): the build
    and the add account for every row, and adding the same file again changes nothing where the
    ids come from the file, and appends every entry where they are row numbers."""
    tried, built = [], []

    @settings(max_examples=4, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
    # enough plain rows that undecodable lines stay under a quarter: rejected rows, not a refused file
    @given(corpus_file(fmt, least=8, good=64))
    def run(generated: tuple[bytes, int]) -> None:
        content, rows = generated
        tried.append(rows)
        case = tmp_path / str(len(tried))
        case.mkdir()
        path = case / f"c.{fmt}"
        path.write_bytes(content)
        try:
            report = build_index(path, case / "idx", Strategy(model=tiny_model))
        except SemsearchError:
            return
        built.append(report.entries)
        assert report.entries + len(report.rejected) == rows
        assert open_index(case / "idx").meta["count"] == report.entries
        again = add_to_index(case / "idx", path)
        assert again.added + again.updated + again.unchanged + len(again.rejected) == rows
        numbered = open_index(case / "idx").meta["source"].get("id_field") is None
        expected = (report.entries, 0, 0) if numbered else (0, 0, report.entries)
        assert (again.added, again.updated, again.unchanged) == expected
        assert again.count == report.entries * (2 if numbered else 1)

    run()
    assert sum(built) >= 5  # the generated files were corpora, not only files refused whole


@FUZZ
@given(
    st.lists(st.lists(texts, min_size=3, max_size=3), max_size=6),
    st.sampled_from(["\n", "\r\n"]),
    st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL]),
)
def test_a_tsv_as_csv_writes_it_reads_back_as_written(records, lineterminator, quoting):
    """Any values (tabs, line ends, quotes anywhere) written by Python's csv with a tab as the
    separator, as pandas writes a TSV, read back as the same rows, in order."""
    from indexer.reading.formats import parse_rows

    # text, not bytes; a \r that Python's csv leaves unquoted when its line end is \n is no line end
    odd = "[\x00\ud800-\udfff]" if lineterminator == "\r\n" else "[\x00\ud800-\udfff\r]"
    records = [[re.sub(odd, "", v) for v in r] for r in records]
    out = io.StringIO(newline="")
    writer = csv.writer(out, delimiter="\t", lineterminator=lineterminator, quoting=quoting)
    writer.writerows([["id", "text", "note"], *records])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.tsv"
        path.write_text(out.getvalue(), encoding="utf-8", newline="")
        with path.open("rb") as handle:
            header, rows = parse_rows(handle, "tsv", path)
            read = [row for _, _, row in rows]
    assert header == ["id", "text", "note"]
    written = [dict(zip(header, r, strict=True)) for r in records]
    written = [row if any(v.strip() for v in row.values()) else "empty line" for row in written]
    assert read == written
