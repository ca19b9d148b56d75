"""Reading corpora: every format, field choice, and each bad row counted with its reason."""

from __future__ import annotations

import csv
import io
import json

import pytest

from indexer.errors import SemsearchError
from indexer.reading.corpus import read_corpus


def write(path, content: str | bytes):
    if isinstance(content, str):
        content = content.encode("utf-8")
    path.write_bytes(content)
    return path


def test_csv_with_joined_fields_and_id(tmp_path):
    path = write(
        tmp_path / "faq.csv",
        'id,question,answer\nq1,"How, really?",Like this.\nq2,Why?,"Because\nof that."\n',
    )
    corpus = read_corpus(path, text_fields=["question", "answer"])
    assert [(e.id, e.text) for e in corpus.entries] == [
        ("q1", "How, really? Like this."),
        ("q2", "Why? Because\nof that."),
    ]
    assert corpus.entries[0].fields == {"id": "q1", "question": "How, really?", "answer": "Like this."}


def test_tsv_keeps_quotes_and_row_number_ids(tmp_path):
    path = write(tmp_path / "s.tsv", 'sentence\tscore\nHe said "hi\tthere\n"Quoted" text\t2\n')
    corpus = read_corpus(path, text_fields=["sentence"])
    assert [e.text for e in corpus.entries] == ['He said "hi', '"Quoted" text']
    assert [e.id for e in corpus.entries] == ["1", "2"]


def test_jsonl_and_text(tmp_path):
    rows = [{"id": 7, "text": "first", "tags": ["a"]}, {"id": 8, "text": "second"}]
    path = write(tmp_path / "c.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    corpus = read_corpus(path)
    assert [(e.id, e.text) for e in corpus.entries] == [("7", "first"), ("8", "second")]
    lines = read_corpus(write(tmp_path / "c.txt", "one\ntwo\n"))
    assert [(e.id, e.text) for e in lines.entries] == [("1", "one"), ("2", "two")]


def test_rows_with_no_readable_character_are_empty(tmp_path):
    """Control, zero-width, BOM and lone combining characters tokenise to nothing: rejected as empty."""
    content = "id,text\n1,good\n2,\u00ad\u0301\n3,\x01\x02\n4,\u200b\u200b\n5,\ufeff\n6,a\u200bb\n".encode()
    corpus = read_corpus(write(tmp_path / "odd.csv", content))
    assert [e.id for e in corpus.entries] == ["1", "6"]
    assert {r.row: r.reason for r in corpus.rejected} == {n: "empty text" for n in (2, 3, 4, 5)}
    assert corpus.rejection_summary() == "4 empty text"


def test_bad_rows_are_counted_with_reasons(tmp_path):
    content = b"id,text\n1,good\n2,\n1,duplicate\n3,bad \x81 byte\n4,a,b\n,no id\n5,  \n6,fine\n"
    corpus = read_corpus(write(tmp_path / "bad.csv", content))
    assert [e.id for e in corpus.entries] == ["1", "6"]
    reasons = {r.row: r.reason for r in corpus.rejected}
    assert reasons[2] == "empty text"
    assert reasons[3].startswith("duplicate id: '1'")
    assert reasons[4] == "invalid UTF-8: byte 0x81"
    assert reasons[5].startswith("wrong field count")
    assert reasons[6].startswith("missing id")
    assert reasons[7] == "empty text"
    assert corpus.rows == 8


def test_bad_jsonl_rows(tmp_path):
    content = '{"text": "ok"}\nnot json\n[1, 2]\n\n{"text": {"nested": 1}}\n{"other": "x"}\n'
    corpus = read_corpus(write(tmp_path / "c.jsonl", content))
    assert len(corpus.entries) == 1
    assert sorted(r.reason.split(":")[0] for r in corpus.rejected) == [
        "empty line",
        "invalid JSON",
        "missing text",
        "not a JSON object",
        "text not a string",
    ]
    assert "missing text" in corpus.rejection_summary()


@pytest.mark.parametrize(
    "name,content,message",
    [
        ("missing.csv", None, "no such file"),
        ("c.xml", "<a/>", "cannot tell the format"),
        ("c.csv", "id,question\n1,hi\n", "has field 'text'"),
        ("c.csv", "id,text\n1,\n2, \n", "empty corpus"),
        ("c.csv", "", "no header"),
        ("c.txt", "\n\n", "empty corpus"),
        ("c.csv", "_rowid,text\n1,x\n", "reserved"),
        ("c.bin", b"\x00\x01\x02binary", "binary"),
    ],
)
def test_unusable_corpus_is_one_clear_error(tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        write(path, content)
    with pytest.raises(SemsearchError, match=message):
        read_corpus(path, fmt="text" if name.endswith(".bin") else None)


def test_beir_corpus_as_distributed(tmp_path):
    """BEIR's corpus.jsonl: ``_id`` is the id (not a field of its own), title and text joined."""
    rows = [
        {"_id": "d1", "title": "Bikes", "text": "How to park a bike.", "metadata": {}},
        {"_id": "d2", "title": "", "text": "Cards we accept.", "metadata": {}},
    ]
    path = write(tmp_path / "corpus.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    corpus = read_corpus(path, text_fields=["title", "text"])
    assert [(e.id, e.text) for e in corpus.entries] == [
        ("d1", "Bikes How to park a bike."),
        ("d2", "Cards we accept."),
    ]
    assert "_id" not in corpus.entries[0].fields and corpus.entries[0].fields["title"] == "Bikes"
    with pytest.raises(SemsearchError, match="_rowid.*reserved"):
        read_corpus(write(tmp_path / "clash.jsonl", '{"_id": "a", "text": "x", "_rowid": 3}\n'))


def test_a_missing_or_empty_field_among_joined_fields_is_an_empty_part(tmp_path):
    """BEIR corpora often have no title, or an empty or null one: the row keeps the text it has.
    Only a row with none of the joined fields' text is rejected; one named field alone must be there."""
    rows = [
        {"_id": "d1", "title": "Bikes", "text": "How to park."},
        {"_id": "d2", "text": "No title at all."},
        {"_id": "d3", "title": None, "text": "A null title."},
        {"_id": "d4", "title": "  ", "text": "A blank title."},
        {"_id": "d5", "title": "Only a title"},
        {"_id": "d6", "title": "", "text": ""},
        {"_id": "d7"},
    ]
    path = write(tmp_path / "corpus.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    corpus = read_corpus(path, text_fields=["title", "text"])
    assert [(e.id, e.text) for e in corpus.entries] == [
        ("d1", "Bikes How to park."),
        ("d2", "No title at all."),
        ("d3", "A null title."),
        ("d4", "A blank title."),
        ("d5", "Only a title"),
    ]
    assert [(r.row, r.reason) for r in corpus.rejected] == [
        (6, "empty text"),
        (7, "missing text: no field 'title' or 'text'"),
    ]
    alone = read_corpus(path, text_fields=["title"])
    assert [r.row for r in alone.rejected] == [2, 3, 4, 6, 7]
    assert alone.rejected[0].reason == "missing text: no field 'title'"
    table = write(tmp_path / "c.csv", "id,title,text\n1,,Body only\n2,Head,\n3,,\n")
    corpus = read_corpus(table, text_fields=["title", "text"])
    assert [(e.id, e.text) for e in corpus.entries] == [("1", "Body only"), ("2", "Head")]
    assert [r.reason for r in corpus.rejected] == ["empty text"]


def test_columns_differing_only_in_case_are_one_clear_error(tmp_path):
    with pytest.raises(SemsearchError, match="'text' and 'Text' differ only in case"):
        read_corpus(write(tmp_path / "c.csv", "id,text,Text\n1,a,b\n"))
    rows = '{"id": 1, "text": "a", "tag": "x"}\n{"id": 2, "text": "b", "TAG": "y"}\n'
    with pytest.raises(SemsearchError, match="differ only in case"):
        read_corpus(write(tmp_path / "c.jsonl", rows))


def test_unterminated_quote_rejects_its_row_and_keeps_the_rest(tmp_path):
    path = write(tmp_path / "c.csv", 'id,text\n1,"fine"\n2,"broken\n3,also fine\n4,"multi\nline"\n')
    corpus = read_corpus(path)
    assert [(e.id, e.text) for e in corpus.entries] == [
        ("1", "fine"),
        ("3", "also fine"),
        ("4", "multi\nline"),
    ]
    assert [(r.row, r.reason.split(":")[0]) for r in corpus.rejected] == [(2, "unterminated quote")]
    at_end = read_corpus(write(tmp_path / "d.csv", 'id,text\n1,fine\n2,"broken\n3,lost\n4,lost too\n'))
    assert [e.id for e in at_end.entries] == ["1", "3", "4"]
    assert at_end.rejected[0].reason == "unterminated quote: opened on line 3"
    last = read_corpus(write(tmp_path / "e.csv", 'id,text\n1,fine\n2,"broken'))
    assert [e.id for e in last.entries] == ["1"] and last.rejected[0].reason.startswith("unterminated quote")
    stray = read_corpus(write(tmp_path / "f.csv", 'id,text\n1,"fine"x\n2,ok\n'))
    assert [e.id for e in stray.entries] == ["2"] and stray.rejected[0].reason.startswith("bad CSV")


ODD_LINES = (
    "\ufeffid,text\r\n"  # a BOM, then Windows line ends
    "k1,caf\u00e9 cr\u00e8me\r\n"
    'k2,"a quoted, field"\r'  # an old Mac line end
    "k3,\u4e2d\u6587\u6587\u672c \U0001f600\n"
    'k4,"opened and never closed\n'
    "k5,after the open quote\x0cand a form feed\n"  # part of the cell: CSV lines end at \n or \r
    "k6,bad \xff byte\n"
    "k7,last line without an end"
)


@pytest.mark.parametrize("block", [1, 2, 3, 7, 64])
def test_corpus_read_in_small_blocks_reads_as_a_whole_file(tmp_path, monkeypatch, block):
    """The file is read a block at a time: a line end, a multi-byte character or a BOM cut by a
    block boundary reads as it does in one piece."""
    import indexer.reading.decoding

    path = tmp_path / "odd.csv"
    path.write_bytes(ODD_LINES.encode("utf-8").replace("\xc3\xbf".encode("latin-1"), b"\xff"))
    whole = read_corpus(path)
    monkeypatch.setattr(indexer.reading.decoding, "_BLOCK", block)
    streamed = read_corpus(path)
    assert [(e.id, e.text) for e in whole.entries] == [(e.id, e.text) for e in streamed.entries]
    assert whole.rejected == streamed.rejected
    assert [e.id for e in streamed.entries] == ["k1", "k2", "k3", "k5", "k7"]
    assert streamed.entries[0].text == "caf\u00e9 cr\u00e8me"
    assert streamed.entries[2].text == "\u4e2d\u6587\u6587\u672c \U0001f600"
    assert streamed.entries[3].text == "after the open quote\x0cand a form feed"
    assert [(r.row, r.reason.split(":")[0]) for r in streamed.rejected] == [
        (4, "unterminated quote"),
        (6, "invalid UTF-8"),
    ]


@pytest.mark.parametrize("fmt", ["text", "jsonl"])
def test_line_formats_read_in_small_blocks(tmp_path, monkeypatch, fmt):
    import indexer.reading.decoding

    monkeypatch.setattr(indexer.reading.decoding, "_BLOCK", 2)
    lines = ["first \u00e9", "second\u2028third", "", "fourth"]
    if fmt == "jsonl":
        lines = [json.dumps({"text": t}, ensure_ascii=False) if t else "" for t in lines]
    path = tmp_path / f"c.{'txt' if fmt == 'text' else 'jsonl'}"
    path.write_text("\r\n".join(lines) + "\r", encoding="utf-8")
    corpus = read_corpus(path)
    assert [e.text for e in corpus.entries] == ["first \u00e9", "second\u2028third", "fourth"]
    assert [r.reason for r in corpus.rejected] == (["empty text"] if fmt == "text" else ["empty line"])


def test_ids_are_strings_or_integers_as_written(tmp_path):
    """An id is a string (trimmed) or an integer, compared as its exact text: 1.0 is not 1, "01"
    is not "1", and a huge integer keeps its digits; anything else rejects its row."""
    rows = [
        '{"id": true, "text": "a"}',
        '{"id": {"a": 1}, "text": "b"}',
        '{"id": 1.0, "text": "c"}',
        '{"id": [1], "text": "d"}',
        '{"id": 99999999999999999999999, "text": "e"}',
        '{"id": "01", "text": "f"}',
        '{"id": 1, "text": "g"}',
        '{"id": " x ", "text": "h"}',
        '{"id": null, "text": "i"}',
    ]
    corpus = read_corpus(write(tmp_path / "c.jsonl", "\n".join(rows) + "\n"))
    assert [e.id for e in corpus.entries] == ["99999999999999999999999", "01", "1", "x"]
    reasons = {r.row: r.reason for r in corpus.rejected}
    assert [reasons[n].split(":")[0] for n in (1, 2, 3, 4, 9)] == ["bad id"] * 4 + ["missing id"]
    assert "1.0" in reasons[3] and "true" in reasons[1]
    csv = read_corpus(write(tmp_path / "c.csv", "id,text\n01,a\n1,b\n1.0,c\n1e0,d\n"))
    assert [e.id for e in csv.entries] == ["01", "1", "1.0", "1e0"]


def test_jsonl_id_field_is_found_in_any_row(tmp_path):
    """A first row without ``id`` does not switch the file to row numbers: it is the row missing its id."""
    path = write(tmp_path / "c.jsonl", '{"text": "no id"}\n{"id": "x", "text": "has id"}\n')
    corpus = read_corpus(path)
    assert corpus.id_field == "id" and [e.id for e in corpus.entries] == ["x"]
    assert [(r.row, r.reason.split(":")[0]) for r in corpus.rejected] == [(1, "missing id")]


DEEP = '{"id": "deep", "text": "t", "n": ' + "[" * 100_000 + "]" * 100_000 + "}"
NESTED = '{"id": "nested", "text": "t", "n": ' + "[" * 500 + "]" * 500 + "}"
BROKEN_ROWS = {
    '{"id": "a", "text": "cut \\ud83d emoji"}': "lone surrogate",
    '{"id": "b", "text": "t", "other": "\\ud83d"}': "lone surrogate",
    '{"id": "c", "text": "t", "k\\ud83d": 1}': "lone surrogate",
    '{"id": "\\ud83d", "text": "t"}': "lone surrogate",
    '{"id": "d", "text": "t", "n": {"x": ["\\udc80"]}}': "invalid UTF-8",
    '{"id": "e", "text": "t", "k\\u0000": 1}': "binary data",
    '{"id": "f", "text": "t", "n": {"x\\u0000": 1}}': "binary data",
    DEEP: "nested too deeply",
    NESTED: "nested too deeply",
}


def test_a_broken_jsonl_row_is_rejected_and_the_rest_kept(tmp_path):
    lines = [*BROKEN_ROWS, '{"id": "ok", "text": "fine", "n": [[1, {"a": ["b"]}]]}']
    corpus = read_corpus(write(tmp_path / "c.jsonl", "\n".join(lines) + "\n"))
    assert [e.id for e in corpus.entries] == ["ok"]
    assert [r.reason.split(":")[0] for r in corpus.rejected] == [
        ("invalid text" if kind == "lone surrogate" else kind) for kind in BROKEN_ROWS.values()
    ]
    assert all(kind in r.reason for r, kind in zip(corpus.rejected, BROKEN_ROWS.values(), strict=True))


def test_more_columns_than_sqlite_holds_is_one_clear_error(tmp_path):
    from indexer.columns import MAX_FIELDS

    header = ["id", "text"] + [f"c{i}" for i in range(2100)]
    path = write(tmp_path / "wide.csv", ",".join(header) + "\n" + ",".join(["1", "t"] + ["x"] * 2100) + "\n")
    with pytest.raises(SemsearchError, match=f"2102 columns.*at most {MAX_FIELDS}"):
        read_corpus(path)
    keys = {f"k{i}": i for i in range(MAX_FIELDS)}
    rows = [json.dumps({"id": "a", "text": "t", **keys}), json.dumps({"id": "b", "text": "t", "x": 1})]
    with pytest.raises(SemsearchError, match=f"{MAX_FIELDS + 3} fields.*at most {MAX_FIELDS}"):
        read_corpus(write(tmp_path / "wide.jsonl", "\n".join(rows)))


def test_broken_rows_and_wide_files_never_reach_the_index(tmp_path, tiny_model):
    """The rows that used to end a build with a TypeError, UnicodeEncodeError, ValueError or
    RecursionError are rejected and the rest indexed; a file wider than SQLite's table is refused
    before anything is written, and one exactly as wide is indexed."""
    from indexer import Strategy, build_index
    from indexer.columns import MAX_FIELDS
    from indexer.store import open_index

    lines = [*BROKEN_ROWS, '{"id": "ok", "text": "fine"}']
    path = write(tmp_path / "c.jsonl", "\n".join(lines) + "\n")
    report = build_index(path, tmp_path / "idx", Strategy(model=tiny_model))
    assert (report.entries, len(report.rejected)) == (1, len(BROKEN_ROWS))
    assert open_index(tmp_path / "idx").meta["count"] == 1
    for width, fits in ((MAX_FIELDS + 1, False), (MAX_FIELDS, True)):
        names = ["text"] + [f"c{i}" for i in range(width - 1)]
        wide = write(tmp_path / "wide.csv", ",".join(names) + "\n" + ",".join(["t"] * width) + "\n")
        if fits:
            build_index(wide, tmp_path / "wide", Strategy(model=tiny_model))
            assert len(open_index(tmp_path / "wide").columns()) == width + 5
        else:
            with pytest.raises(SemsearchError, match="at most"):
                build_index(wide, tmp_path / "wide", Strategy(model=tiny_model))
            assert not (tmp_path / "wide").exists()


@pytest.mark.parametrize("sep", [",", "\t"])
def test_csv_cells_keep_line_separators_other_than_newlines(tmp_path, sep):
    """CSV and TSV records end at \\n or \\r only: a U+2028, a form feed or a vertical tab inside a
    cell (text pasted from the web) is part of it, not the end of the row."""
    path = write(
        tmp_path / ("c.csv" if sep == "," else "c.tsv"),
        f"id{sep}text\n1{sep}a\u2028b\x0cc\x0bd\x85e\n2{sep}ok\n",
    )
    corpus = read_corpus(path)
    assert [(e.id, e.text) for e in corpus.entries] == [("1", "a\u2028b\x0cc\x0bd\x85e"), ("2", "ok")]
    assert corpus.rejected == []


def test_text_lines_end_at_newlines_only_as_wc_counts(tmp_path, monkeypatch):
    """Form feeds (pdftotext's page breaks), vertical tabs, U+2028, NEL and a lone \\r are text:
    a file gives as many rows as ``wc -l`` counts, and stdin gives the same rows."""
    import io
    import sys

    from search.read.encoding import read_texts

    content = "page one\x0cpage two\n\x0bsecond\x1cline\x85\u2028\r\nthird\rstill third\n"
    path = write(tmp_path / "pdf.txt", content)
    corpus = read_corpus(path)
    assert corpus.rows == content.count("\n") == 3
    from_file = list(read_texts(str(path)))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(content.encode("utf-8"))))
    assert [(i, t.strip()) for i, t in read_texts("-")] == from_file  # a file's texts are trimmed
    assert [text for _, text in from_file][0] == "page one\x0cpage two"


def test_small_line_files_split_as_corpora(tmp_path):
    from indexer.writing.update import read_ids
    from search.read.queries import read_queries

    path = write(tmp_path / "ids.txt", "a\x0cb\r\nc\n")
    assert read_ids(path) == ["a\x0cb", "c"]
    assert [q.text for q in read_queries(str(path))] == ["a\x0cb", "c"]


def cp1252_csv(rows: int = 30, accented: int = 13) -> bytes:
    lines = ["id,text"] + [f"{i},{'café crème' if i < accented else 'plain'} {i}" for i in range(rows)]
    return ("\r\n".join(lines) + "\r\n").encode("cp1252")


def test_a_file_in_another_encoding_is_refused_naming_the_one_to_try(tmp_path):
    path = write(tmp_path / "win.csv", cp1252_csv())
    message = r"13 of 31 lines are not valid UTF-8; looks like cp1252/latin-1: try --encoding cp1252"
    with pytest.raises(SemsearchError, match=message):
        read_corpus(path)
    corpus = read_corpus(path, encoding="cp1252")
    assert corpus.rows == len(corpus.entries) == 30 and corpus.entries[0].text == "café crème 0"
    with pytest.raises(SemsearchError, match="unknown encoding"):
        read_corpus(path, encoding="klingon")


def test_undecodable_first_lines_stop_the_read_and_a_few_bad_rows_are_rejected(tmp_path):
    content = "".join(f"caf\xe9 {i}\n" for i in range(5)).encode("latin-1") + b"ok\n" * 10_000
    with pytest.raises(SemsearchError, match="the first 5 lines are not valid UTF-8"):
        read_corpus(write(tmp_path / "a.txt", content))
    corpus = read_corpus(write(tmp_path / "b.csv", cp1252_csv(30, accented=3) + "30,naïve\r\n".encode()))
    assert [r.reason for r in corpus.rejected] == ["invalid UTF-8: bytes 0xe8, 0xe9"] * 3
    utf16 = write(tmp_path / "c.txt", "one\ntwo\n".encode("utf-16"))
    with pytest.raises(SemsearchError, match="try --encoding utf-16"):
        read_corpus(utf16)
    assert [e.text for e in read_corpus(utf16, encoding="utf-16").entries] == ["one", "two"]


@pytest.mark.parametrize("asked", ["latin-1", "cp1252"])
def test_a_utf8_file_read_in_a_one_byte_encoding_is_refused_naming_utf8(tmp_path, asked):
    """A UTF-8 byte order mark, or text whose every byte beyond ASCII is UTF-8 (which reads as
    'CafÃ©' in latin-1 or cp1252): refused with one line naming utf-8, not indexed as mojibake."""
    content = "id,text\r\n1,Café crème\r\n2,plain\r\n3,naïve déjà vu\r\n"
    bom = write(tmp_path / "bom.csv", "\ufeff" + content)
    with pytest.raises(SemsearchError, match=r"UTF-8 byte order mark.*--encoding utf-8"):
        read_corpus(bom, encoding=asked)
    plain = write(tmp_path / "plain.csv", content)
    with pytest.raises(SemsearchError, match=r"reads as UTF-8.*'CafÃ©'.*--encoding utf-8"):
        read_corpus(plain, encoding=asked)
    assert [e.text for e in read_corpus(bom).entries] == ["Café crème", "plain", "naïve déjà vu"]
    latin = write(tmp_path / "latin.csv", content.encode(asked))  # what the encoding is for
    assert read_corpus(latin, encoding=asked).entries[0].text == "Café crème"


@pytest.mark.parametrize("order", ["le", "be"])
def test_utf16_without_a_byte_order_mark_is_refused_naming_its_byte_order(tmp_path, order):
    content = "id\ttext\n" + "".join(f"{i}\tCafé row {i}\n" for i in range(20))
    path = write(tmp_path / "u.tsv", content.encode(f"utf-16-{order}"))
    for asked in ("utf-8", "cp1252"):
        with pytest.raises(SemsearchError, match=rf"UTF-16 .*--encoding utf-16-{order}$"):
            read_corpus(path, encoding=asked)
    assert len(read_corpus(path, encoding=f"utf-16-{order}").entries) == 20


def test_a_byte_cp1252_has_no_character_for_is_named_with_its_row_and_line(tmp_path):
    lines = ["id,text", *(f"{i},Café {i}" for i in range(1, 30))]
    content = ("\r\n".join(lines) + "\r\n").encode("cp1252")
    path = write(tmp_path / "w.csv", content.replace(b"Caf\xe9 7", b"Caf\x9d 7"))
    corpus = read_corpus(path, encoding="cp1252")
    assert len(corpus.entries) == 28
    [rejected] = corpus.rejected
    assert (rejected.row, rejected.line) == (7, 8)
    assert rejected.reason == "invalid CP1252: byte 0x9d, which cp1252 has no character for"
    few = write(tmp_path / "few.csv", b"id,text\r\n1,Caf\x9d\r\n2,ok\r\n")  # refused: a third of its lines
    with pytest.raises(SemsearchError, match=r"not valid CP1252.*\(line 2: byte 0x9d\)$"):
        read_corpus(few, encoding="cp1252")


def test_ids_and_queries_are_read_from_a_pipe(tmp_path):
    """`--ids-file <(...)` names a pipe, read once: its lines are the ids."""
    import os
    import threading

    from indexer.reading.decoding import lines_of
    from indexer.writing.update import read_ids

    fifo = tmp_path / "ids"
    os.mkfifo(fifo)
    for read, expected in [(read_ids, ["q1", "q2"]), (lines_of, ["q1", "", "q2"])]:
        writer = threading.Thread(target=lambda: fifo.write_bytes(b"q1\n\nq2\n"), daemon=True)
        writer.start()
        assert read(fifo) == expected
        writer.join()


def test_a_corpus_given_as_a_pipe_is_refused_saying_why(tmp_path):
    import os

    fifo = tmp_path / "corpus.csv"
    os.mkfifo(fifo)
    with pytest.raises(SemsearchError, match="is a pipe.*read more than once.*a file"):
        read_corpus(fifo)


@pytest.mark.parametrize("sep", [";", "\t", "|"])
def test_csv_delimiter_is_told_from_the_header(tmp_path, sep):
    content = f'id{sep}question{sep}answer\n1{sep}"how, when"{sep}now\n2{sep}why{sep}so\n'
    path = write(tmp_path / "faq.csv", content)
    corpus = read_corpus(path, text_fields=["question", "answer"])
    assert [(e.id, e.text) for e in corpus.entries] == [("1", "how, when now"), ("2", "why so")]


def test_csv_delimiter_can_be_given(tmp_path):
    path = write(tmp_path / "faq.csv", "id;text,more\n1;a,b\n")
    assert read_corpus(path, text_fields=["more"]).entries[0].text == "b"  # one of each: a comma wins ties
    assert read_corpus(path, delimiter=";", text_fields=["text,more"]).entries[0].text == "a,b"
    with pytest.raises(SemsearchError, match="one character"):
        read_corpus(path, delimiter=";;")


@pytest.mark.parametrize(
    "name,content,given,fix",
    [
        ("faq.csv", "id,text,answer\n1,how,now\n2,why,so\n", ";", "--delimiter ','"),
        ("faq.csv", "id\ttext\n1\thow\n", "|", "--delimiter tab"),
        ("faq.tsv", "id;text\n1;how\n", None, "--format csv --delimiter ';'"),
    ],
)
def test_a_header_of_one_field_holding_a_separator_names_the_delimiter(tmp_path, name, content, given, fix):
    """Split at the wrong character, the header is one field and every row lacks 'text': the
    error says the delimiter is likely wrong and how to give it, not to choose another field."""
    path = write(tmp_path / name, content)
    with pytest.raises(SemsearchError, match="delimiter is likely wrong") as caught:
        read_corpus(path, delimiter=given)
    assert fix in str(caught.value) and "--text-field" not in str(caught.value)
    write(tmp_path / "plain.csv", "question\nhow\n")
    with pytest.raises(SemsearchError, match="choose with --text-field"):  # one field, no separator in it
        read_corpus(tmp_path / "plain.csv", delimiter=given if name.endswith("csv") else None)


def test_field_names_match_whatever_their_case(tmp_path):
    csv_path = write(tmp_path / "faq.csv", "ID,question\n1,how?\n")
    corpus = read_corpus(csv_path, text_fields=["Question"], id_field="id")
    assert [(e.id, e.text) for e in corpus.entries] == [("1", "how?")]
    content = '{"Key": "a", "Question": "how?"}\n{"Key": "b", "Question": "why?"}\n'
    jsonl = write(tmp_path / "faq.jsonl", content)
    corpus = read_corpus(jsonl, text_fields=["question"], id_field="KEY")
    assert [(e.id, e.text) for e in corpus.entries] == [("a", "how?"), ("b", "why?")]
    with pytest.raises(SemsearchError, match=r"has field 'qestion' \(did you mean 'question'\?\)"):
        read_corpus(csv_path, text_fields=["qestion"])


JSON_ARRAY = (
    '[{"text": "first"}, "a plain string",\n'
    ' 7, {"text": "second", "tags": ["x", {"y": "]"}]},\n'
    ' {"text": tru, "n": [1, {"m": ","}]}, {"text": "after the broken one"}]\n'
)


@pytest.mark.parametrize("block", [1, 3, 1 << 20])
def test_json_array_of_objects_and_strings(tmp_path, monkeypatch, block):
    """A JSON array (a spreadsheet's or a database's export): each object is a row, each string a
    text; any other element, or one that is not JSON, is rejected at its position, and the rest kept."""
    import indexer.reading.decoding

    monkeypatch.setattr(indexer.reading.decoding, "_BLOCK", block)
    corpus = read_corpus(write(tmp_path / "export.json", JSON_ARRAY))
    assert [(e.id, e.text) for e in corpus.entries] == [
        ("1", "first"),
        ("2", "a plain string"),
        ("4", "second"),
        ("6", "after the broken one"),
    ]
    assert corpus.entries[2].fields["tags"] == ["x", {"y": "]"}]
    assert [(r.row, r.reason.split(":")[0]) for r in corpus.rejected] == [
        (3, "not a JSON object or string"),
        (5, "invalid JSON"),
    ]


def test_json_array_ids_are_found_in_any_element(tmp_path):
    path = write(tmp_path / "c.json", '["no id", {"id": "k", "text": "with one"}]')
    corpus = read_corpus(path)
    assert [(e.id, e.text) for e in corpus.entries] == [("k", "with one")]
    assert [(r.row, r.reason) for r in corpus.rejected] == [(1, "missing id: field 'id'")]


def test_json_file_of_lines_is_read_as_json_lines(tmp_path):
    path = write(tmp_path / "rows.json", '{"id": "a", "text": "one"}\n{"id": "b", "text": "two"}\n')
    assert [(e.id, e.text) for e in read_corpus(path).entries] == [("a", "one"), ("b", "two")]


@pytest.mark.parametrize(
    "content, texts, rejected",
    [
        ('[{"text": "one"}, {"text": "two"}', ["one", "two"], (3, "unclosed JSON array")),
        ('[{"text": "one"}] {"text": "x"}', ["one"], (2, "text after the JSON array")),
    ],
)
def test_json_array_cut_short_or_followed_by_more_is_reported(tmp_path, content, texts, rejected):
    corpus = read_corpus(write(tmp_path / "c.json", content))
    assert [e.text for e in corpus.entries] == texts
    assert [(r.row, r.reason[: len(rejected[1])]) for r in corpus.rejected] == [rejected]


def test_json_that_is_not_an_array_is_one_clear_error(tmp_path):
    with pytest.raises(SemsearchError, match="not a JSON array"):
        read_corpus(write(tmp_path / "c.json", '"just a string"'))


def test_json_array_is_read_in_bounded_memory(tmp_path):
    """A JSON array written on one line (as ``json.dump`` writes it) is never held whole."""
    import tracemalloc

    rows = [{"id": i, "text": f"entry {i} " + "word " * 250} for i in range(12000)]
    path = tmp_path / "big.json"
    path.write_text(json.dumps(rows), encoding="utf-8")
    size = path.stat().st_size
    assert size > 15_000_000
    from indexer.reading.corpus import CorpusReader

    tracemalloc.start()
    try:
        count = sum(1 for _ in CorpusReader(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == 12000
    assert peak < size / 2


# TSV as tools write it: CSV quoting, a tab as the separator

AWKWARD = [
    "Line one\nline two",
    "a\ttab inside",
    'He said "hi"',
    '"Quoted" at the start',
    '5" wheel',
    "Windows\r\nline end",
    '"whole"',
    "",
    "plain",
]


def test_a_tsv_written_by_pandas_reads_back_every_row_as_written(tmp_path):
    """pandas and Python's csv quote a TSV field that holds a tab, a line end or a quote (and
    double its quotes): every row comes back, every value as it was."""
    import pandas as pd

    frame = pd.DataFrame({"id": [f"r{i}" for i in range(len(AWKWARD))], "text": AWKWARD, "n": range(9)})
    frame["text"] = frame["text"].radd("x ")  # no empty text: every row is an entry
    frame.to_csv(tmp_path / "p.tsv", sep="\t", index=False)
    corpus = read_corpus(tmp_path / "p.tsv")
    written = list(zip(frame["id"], frame["text"], strict=True))
    assert [(e.id, e.fields["text"]) for e in corpus.entries] == written
    assert not corpus.rejected
    for lineterminator, quoting in [("\r\n", csv.QUOTE_MINIMAL), ("\n", csv.QUOTE_ALL)]:
        with (tmp_path / "w.tsv").open("w", newline="", encoding="utf-8") as out:
            writer = csv.writer(out, delimiter="\t", lineterminator=lineterminator, quoting=quoting)
            writer.writerows([["id", "text", "note"], *([str(i), f"t{i}", v] for i, v in enumerate(AWKWARD))])
        read = read_corpus(tmp_path / "w.tsv")
        assert [e.fields["note"] for e in read.entries] == AWKWARD, (lineterminator, quoting)


def test_tsv_quotes_no_writer_would_write_are_text(tmp_path):
    """A quote that opens a field but is not CSV quoting as a writer writes it (a quoted field
    that needed no quotes, one that closes before more text, one never closed, one whose lines
    would not make a row of the header's width) is text, as in a file typed by hand."""
    lines = [
        "score\tsentence",
        '1\t"A whole quoted sentence."',
        '2\t"Closed early," he said.',
        '3\t"Never closed',
        "4\tplain",
        '5\tends "here"',
        '"6\tspans',
        '7\t" lines\textra',
        '"8\tspans',
        '9\tlines"\tbut makes\tthree fields',
    ]
    path = write(tmp_path / "hand.tsv", "\n".join(lines) + "\n")
    rows = [line.split("\t") for line in lines[1:]]
    corpus = read_corpus(path, text_fields=["sentence"])
    fields = [dict(zip(["score", "sentence"], r, strict=True)) for r in rows if len(r) == 2]
    assert [e.fields for e in corpus.entries] == fields
    wrong = [(r.row, r.reason.split(":")[0]) for r in corpus.rejected]
    assert wrong == [(7, "wrong field count"), (9, "wrong field count")]


@pytest.mark.parametrize("name", ["stsb/stsb-dev.tsv", "stsb/stsb-train.tsv", "sick-r/sick-trial.tsv"])
def test_real_tsv_files_with_literal_quotes_read_as_their_lines_split_at_tabs(name):
    """STS-B's sentences open and close with quotes of their own (quoted speech): each line
    still reads as its tab-split fields, one row per line."""
    from tests.helpers import shared_file

    path = shared_file(*name.split("/"))
    lines = path.read_text(encoding="utf-8").splitlines()
    header = lines[0].split("\t")
    corpus = read_corpus(path, text_fields=[header[1]])
    assert not corpus.rejected
    split = [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:]]
    assert [e.fields for e in corpus.entries] == split


# Files read the wrong way: refused with the cause and the option that fixes it


def excel_semicolon_export(rows: int, accented: int, encoding: str = "cp1252") -> bytes:
    """Excel's "CSV (semicolon)": cp1252, \\r\\n, answers of several lines in quotes."""
    out = io.StringIO()
    writer = csv.writer(out, delimiter=";", lineterminator="\r\n")
    writer.writerow(["Id", "Question", "Answer"])
    for i in range(rows):
        question = f"Où est le café {i}?" if i < accented else f"Where is stop {i}?"
        writer.writerow([i, question, "\n".join(f"Step {s} of the answer." for s in range(6))])
    return out.getvalue().encode(encoding)


def test_a_cp1252_export_is_refused_by_its_rows_not_its_lines(tmp_path):
    """8 of 20 rows hold cp1252 bytes, on 8 of 121 lines: refused by rows, naming cp1252, whether
    or not something else in the file is UTF-8."""
    path = write(tmp_path / "faq.csv", excel_semicolon_export(20, accented=8))
    with pytest.raises(SemsearchError, match="try --encoding cp1252"):
        read_corpus(path, text_fields=["Question"])
    assert len(read_corpus(path, text_fields=["Question"], encoding="cp1252").entries) == 20
    mixed = write(tmp_path / "mixed.csv", path.read_bytes() + "99;Naïve?;Oui\r\n".encode())
    message = "8 of 21 rows are not valid UTF-8; looks like cp1252/latin-1: try --encoding cp1252"
    with pytest.raises(SemsearchError, match=message):
        read_corpus(mixed, text_fields=["Question"])


def test_one_cp1252_row_in_a_file_with_no_utf8_is_refused(tmp_path):
    """One row that does not decode, in bytes cp1252 reads, and nothing in the file that is UTF-8
    beyond ASCII: the file is cp1252. With UTF-8 elsewhere, or bytes cp1252 has no character for,
    the row alone is rejected."""
    rows = [f"{i},plain text {i}" for i in range(40)]
    ascii_file = "id,text\n" + "\n".join(rows) + "\n"
    one = write(tmp_path / "one.csv", ascii_file.encode() + "40,café\n".encode("cp1252"))
    with pytest.raises(SemsearchError, match="looks like cp1252/latin-1: try --encoding cp1252"):
        read_corpus(one)
    assert read_corpus(one, encoding="cp1252").entries[-1].text == "café"
    with_utf8 = write(tmp_path / "utf8.csv", one.read_bytes() + "41,naïve\n".encode())
    assert [r.reason for r in read_corpus(with_utf8).rejected] == ["invalid UTF-8: byte 0xe9"]
    no_cp1252 = write(tmp_path / "x.csv", ascii_file.encode() + b"40,caf\x81\n")
    assert [r.reason for r in read_corpus(no_cp1252).rejected] == ["invalid UTF-8: byte 0x81"]


def test_a_json_array_in_cp1252_is_refused(tmp_path):
    quotes = [{"text": f"Quote {i}" + (" – à la française" if i % 4 == 0 else "")} for i in range(40)]
    path = write(tmp_path / "quotes.json", json.dumps(quotes, ensure_ascii=False).encode("cp1252"))
    with pytest.raises(SemsearchError, match="try --encoding cp1252"):
        read_corpus(path)
    assert len(read_corpus(path, encoding="cp1252").entries) == 40


def test_most_rows_rejected_for_one_format_reason_refuse_the_file(tmp_path):
    """More than half the rows with the wrong field count (a CSV of one column whose texts hold
    unquoted commas): refused, naming the separator and --delimiter, and read with one."""
    lines = ["text", *(f"Hello, world {i}" if i % 3 else f"Hello {i}" for i in range(12))]
    path = write(tmp_path / "one-column.csv", "\n".join(lines) + "\n")
    message = r"8 of 12 rows do not have the header's 1 field when split at commas.*--delimiter"
    with pytest.raises(SemsearchError, match=message):
        read_corpus(path)
    assert len(read_corpus(path, delimiter="|").entries) == 12
    jsonl = write(tmp_path / "array.jsonl", json.dumps([{"text": f"t{i}"} for i in range(6)], indent=1))
    with pytest.raises(SemsearchError, match="not JSON.*--format json"):
        read_corpus(jsonl)


def test_rows_rejected_for_their_content_do_not_refuse_the_file(tmp_path):
    """Empty texts and duplicate ids are the rows' own faults, however many: the rest is read."""
    lines = ["id,text", *(f"{i % 3},{'x' if i % 2 else ''}" for i in range(12))]
    corpus = read_corpus(write(tmp_path / "c.csv", "\n".join(lines) + "\n"))
    assert len(corpus.entries) == 3 and corpus.rejection_summary() == "6 empty text, 3 duplicate id"
