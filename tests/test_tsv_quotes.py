"""A TSV's quotes: CSV quoting where the file shows a writer quoted, text where a person typed them.
A row is never merged with the rows after it on a guess; where a quote would make a field of
several lines, what was read is said, and ``quoting`` decides."""

from __future__ import annotations

import random

import pytest

from indexer.errors import SemsearchError
from indexer.reading.corpus import CorpusReader, Entry, read_corpus


def write(path, text: str):
    path.write_bytes(text.encode("utf-8"))
    return path


def read_all(path, **options):
    """The entries, the rejections and the notes of one read."""
    reader = CorpusReader(path, **options)
    items = list(reader)
    entries = [i for i in items if isinstance(i, Entry)]
    return entries, [i for i in items if not isinstance(i, Entry)], reader.notes


def test_an_opening_quote_closed_by_an_inch_mark_900_rows_later_swallows_nothing(tmp_path):
    texts = [f"plain row {i}" for i in range(1, 1001)]
    texts[4] = '"Gone with the Wind is a long book'
    texts[899] = 'the monitor is 27"'
    path = write(tmp_path / "hand.tsv", "id\ttext\n" + "".join(f"{i}\t{t}\n" for i, t in enumerate(texts, 1)))
    entries, rejected, notes = read_all(path)
    assert [(e.id, e.text) for e in entries] == [(str(i), t) for i, t in enumerate(texts, 1)]
    assert not rejected
    # what was read and the lines the quote would have made one field of are said, with the choice
    assert len(notes) == 1 and "lines 6-901" in notes[0] and "896 rows" in notes[0]
    assert "--quoting csv" in notes[0]
    # asked for, CSV quoting makes them one field; no quoting reads every quote as text
    assert len(read_all(path, quoting="csv")[0]) == 105
    assert [e.text for e in read_all(path, quoting="none")[0]] == texts


def test_a_lone_quote_and_an_inch_mark_on_the_next_row_stay_two_rows(tmp_path):
    path = write(tmp_path / "b.tsv", 'id\ttext\tcat\n1\t"\tpunct\n2\ta 12"\tscreen\n')
    entries, rejected, _ = read_all(path)
    assert [e.fields for e in entries] == [
        {"id": "1", "text": '"', "cat": "punct"},
        {"id": "2", "text": 'a 12"', "cat": "screen"},
    ]
    assert not rejected


def test_two_quotes_typed_as_a_ditto_mark_stay_text(tmp_path):
    path = write(tmp_path / "d.tsv", 'id\ttext\tsize\n1\tboots\t42\n2\t""\t43\n')
    assert [e.fields["text"] for e in read_all(path)[0]] == ["boots", '""']


def test_a_pandas_tsv_with_many_quoted_newlines_loads_every_row(tmp_path):
    """pandas quotes the fields that hold a line end, a tab or a quote (doubling its quotes):
    every row comes back as written, whichever column the lines are in, and what spanned lines
    is said."""
    import pandas as pd

    rng = random.Random(7)
    pieces = ["Line one", "a\ttab", 'he said "hi"', '27" screen', "plain", "«»", '"whole"']
    texts = ["\n".join(rng.sample(pieces, rng.randint(1, 3))) for _ in range(300)]
    frame = pd.DataFrame({"id": [f"a{i}" for i in range(300)], "answer": texts, "n": range(300)})
    spanning = sum("\n" in t for t in texts)
    assert spanning > 100
    for columns in (["id", "answer", "n"], ["id", "n", "answer"]):
        path = tmp_path / "p.tsv"
        frame[columns].to_csv(path, sep="\t", index=False)
        entries, rejected, notes = read_all(path, text_fields=["answer"])
        assert [(e.id, e.text) for e in entries] == list(zip(frame["id"], texts, strict=True))
        assert not rejected
        assert len(notes) == 1 and f"{spanning} quoted fields span lines" in notes[0]
        assert "--quoting none" in notes[0]


def test_a_rejection_names_the_line_it_is_on(tmp_path):
    """Rows after a field of several lines are further down the file than their row number."""
    lines = ["id\ttext", '1\t"one\ntwo\nthree"', "2\tok", "3\t", "4\tok"]
    entries, rejected, _ = read_all(write(tmp_path / "l.tsv", "\n".join(lines) + "\n"))
    assert [e.id for e in entries] == ["1", "2", "4"]
    assert [(r.row, r.line, r.reason) for r in rejected] == [(3, 6, "empty text")]


def test_an_unknown_quoting_is_refused():
    with pytest.raises(SemsearchError, match="quoting"):
        read_corpus("data/demo_faq.csv", quoting="sometimes")


HOSTILE = [
    'the monitor is 27"',
    '"Gone with the Wind',
    'a 12" pipe',
    '"',
    '""',
    '"quoted" then more',
    'ends with a quote"',
    '"whole quoted"',
    'she said "hi" twice',
    '"""',
    "plain",
    '5" x 7"',
]


@pytest.mark.parametrize("seed", range(6))
def test_a_hand_typed_tsv_with_stray_quotes_reads_every_row_as_typed(tmp_path, seed):
    """A few hundred rows with inch marks, quotes opened and never closed, quotes closing at a
    field's end, ditto marks: every row is read, row by row, with its exact text."""
    rng = random.Random(seed)
    rows = []
    for i in range(1, rng.randint(200, 400)):
        text = rng.choice(HOSTILE) if rng.random() < 0.3 else f"row {i} text"
        note = rng.choice(HOSTILE) if rng.random() < 0.2 else f"n{i}"
        rows.append((str(i), text, note))
    body = "".join("\t".join(r) + "\n" for r in rows)
    entries, rejected, _ = read_all(write(tmp_path / "h.tsv", "id\ttext\tnote\n" + body))
    assert [e.fields for e in entries] == [{"id": i, "text": t, "note": n} for i, t, n in rows]
    assert not rejected


def test_a_typed_quote_in_a_csv_never_joins_its_rows(tmp_path):
    """A CSV is quoted by its writer, so a quoted field may span lines; but one whose lines are
    each a row of the header's width (three or more) is a typed quote closed by another: its
    rows are read as typed, said, and ``quoting`` decides. (A quote that CSV cannot close
    rejects its row, as before.)"""
    import csv
    import io

    texts = [f'"row {i}," quoted' if i > 250 else f"row {i} plain" for i in range(1, 301)]
    texts[4] = '"Gone with the Wind is a long book'
    texts[199] = 'the monitor is 27"'
    rows = [(str(i), t) for i, t in enumerate(texts, 1)]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)  # quoted as a writer quotes
    lines = out.getvalue().splitlines()
    lines[4], lines[199] = f"5,{texts[4]}", f"200,{texts[199]}"  # two quotes typed
    path = write(tmp_path / "hand.csv", "id,text\n" + "\n".join(lines) + "\n")
    entries, rejected, notes = read_all(path)
    assert [(e.id, e.text) for e in entries] == rows
    assert not rejected and len(notes) == 1 and "lines 6-201" in notes[0] and "--quoting csv" in notes[0]
    assert len(read_all(path, quoting="csv")[0]) == 300 - 195
    # a field of two lines, or of lines that are not each a row, is CSV quoting as written
    written = 'id,text\n1,"Hi there\nThanks, Bob"\n2,"Step 1\nStep 2\nStep 3"\n3,plain\n'
    entries, _, notes = read_all(write(tmp_path / "ok.csv", written))
    assert [e.text for e in entries] == ["Hi there\nThanks, Bob", "Step 1\nStep 2\nStep 3", "plain"]
    said = "2 quoted fields span lines (lines 2-3 as row 1, lines 4-6 as row 2)"
    assert len(notes) == 1 and said in notes[0]


@pytest.mark.slow
def test_index_reads_every_typed_row_and_says_which_lines_a_quote_would_join(tmp_path, tiny_model):
    from tests.helpers import run

    texts = [f"plain row {i}" for i in range(1, 1001)]
    texts[4], texts[899] = '"Gone with the Wind is a long book', 'the monitor is 27"'
    body = "".join(f"{i}\t{t}\n" for i, t in enumerate(texts, 1))
    corpus = write(tmp_path / "hand.tsv", "id\ttext\n" + body)
    result = run("index", corpus, "-o", tmp_path / "idx", "--model", tiny_model)
    assert result.returncode == 0, result.stderr
    assert "indexed 1000 entries" in result.stderr
    assert "lines 6-901" in result.stderr and "--quoting csv" in result.stderr
    joined = run("index", corpus, "-o", tmp_path / "idx", "--model", tiny_model, "--quoting", "csv")
    assert "indexed 105 entries" in joined.stderr
    assert "--quoting [auto|csv|none]" in run("index", "--help").stdout


def test_a_quoted_field_whose_two_lines_are_each_a_row_is_not_joined_on_a_guess(tmp_path):
    """A writer's field of two lines that hold the tabs to make each a row of the header's width
    looks just like a quote typed on one row and closed on the next: read as the two rows, said,
    and ``quoting="csv"`` reads it as written."""
    path = write(tmp_path / "w.tsv", 'id\tkind\ttext\na\tb\t"x\ny\tz\tw"\nc\td\te\n')
    entries, _, notes = read_all(path)
    assert [e.fields["text"] for e in entries] == ['"x', 'w"', "e"]
    assert len(notes) == 1 and "lines 2-3" in notes[0] and "--quoting csv" in notes[0]
    assert [e.fields["text"] for e in read_all(path, quoting="csv")[0]] == ["x\ny\tz\tw", "e"]


SAID = 'He said "stop"\tthen left\nNext day\tshe "came" back'
"""A text with a tab, a line end and quotes: each of its lines split at tabs makes a row of
three fields, as a typed file's rows do; only its doubled quotes show that a writer quoted it."""


def test_a_tsv_a_csv_writer_wrote_reads_as_its_rows_though_each_line_is_a_row(tmp_path):
    """A field that opens with a quote, doubles the quotes in its text and closes right before a
    tab is a writer's quoting, read as written even where its lines split at tabs look like rows."""
    import csv

    import pandas as pd

    rows = [("a", "plain one", "x"), ("b", SAID, "y"), ("c", "plain three", "z")]
    with (tmp_path / "w.tsv").open("w", newline="", encoding="utf-8") as out:
        csv.writer(out, delimiter="\t").writerows([("id", "text", "cat"), *rows])
    pd.DataFrame(rows, columns=["id", "text", "cat"]).to_csv(tmp_path / "p.tsv", sep="\t", index=False)
    for name in ("w.tsv", "p.tsv"):
        entries, rejected, notes = read_all(tmp_path / name)
        assert [(e.id, e.text, e.fields["cat"]) for e in entries] == rows, name
        assert not rejected
        assert len(notes) == 1 and "lines 3-4 as row 2" in notes[0] and "read 3 rows from 5 lines" in notes[0]


def test_doubled_quotes_typed_by_hand_between_an_opened_quote_and_an_inch_mark_join_nothing(tmp_path):
    """Ditto marks (``""``) and a field of three quotes typed between a quote opened on one row
    and an inch mark rows later are quotes beside tabs, not a writer's doubling inside a text."""
    texts = [f"plain row {i}" for i in range(1, 41)]
    texts[4], texts[9], texts[14], texts[29] = '"Gone with the Wind', '""', '"""', 'the monitor is 27"'
    path = write(tmp_path / "hand.tsv", "id\ttext\n" + "".join(f"{i}\t{t}\n" for i, t in enumerate(texts, 1)))
    entries, rejected, notes = read_all(path)
    assert [(e.id, e.text) for e in entries] == [(str(i), t) for i, t in enumerate(texts, 1)]
    assert not rejected and len(notes) == 1 and "lines 6-16" in notes[0] and "--quoting csv" in notes[0]


def test_a_tsv_refused_for_quoted_fields_read_as_their_lines_names_quoting_csv(tmp_path):
    """A writer's fields of many lines whose first and last lines are each a row are read as
    their lines' rows; when that rejects most rows, the refusal names the option that reads the
    file as written."""
    import pandas as pd

    texts = [f"first {i}\tpart\nsecond\nthird\nfourth\nfifth\nsixth\tend" for i in range(20)]
    path = tmp_path / "m.tsv"
    pd.DataFrame({"id": range(20), "text": texts, "cat": ["x"] * 20}).to_csv(path, sep="\t", index=False)
    with pytest.raises(SemsearchError, match="--quoting csv") as refused:
        read_all(path)
    assert "\n" not in str(refused.value) and "lines 2-7" in str(refused.value)
    assert [e.text for e in read_all(path, quoting="csv")[0]] == texts


def test_a_csv_field_that_spans_lines_is_said(tmp_path):
    """A CSV's quoted field of several lines is read as one field, and which lines made which row
    is said, as for a TSV: with many, their count and the first few."""
    path = write(tmp_path / "q.csv", 'id,text,note\n1,plain,n1\n2,"quoted start,n2\n3,27",n3\n4,last,n4\n')
    entries, rejected, notes = read_all(path)
    assert [e.id for e in entries] == ["1", "2", "4"] and not rejected
    assert entries[1].text == "quoted start,n2\n3,27"
    assert notes == [
        f"{path}: 1 quoted field spans lines (lines 3-4 as row 2); read 3 rows from 5 lines "
        "(--quoting none reads every quote as text)"
    ]
    import pandas as pd

    texts = [f"answer {i}\nsecond line" if i % 3 == 0 else f"answer {i}" for i in range(258)]
    frame = pd.DataFrame({"id": [f"q{i}" for i in range(258)], "text": texts})
    frame.to_csv(tmp_path / "p.csv", index=False)
    entries, rejected, notes = read_all(tmp_path / "p.csv")
    assert [e.text for e in entries] == texts and not rejected
    assert len(notes) == 1 and "86 quoted fields span lines" in notes[0]
    assert "(lines 2-3 as row 1, lines 6-7 as row 4, lines 10-11 as row 7, ...)" in notes[0]
    assert "read 258 rows from 345 lines" in notes[0]


@pytest.mark.slow
def test_index_reads_a_writers_tsv_as_its_rows_and_says_a_csvs_field_of_two_lines(tmp_path, tiny_model):
    import csv

    from tests.helpers import run

    tsv = tmp_path / "w.tsv"
    with tsv.open("w", newline="", encoding="utf-8") as out:
        rows = [("id", "text", "cat"), ("a", "one", "x"), ("b", SAID, "y")]
        csv.writer(out, delimiter="\t").writerows(rows)
    result = run("index", tsv, "-o", tmp_path / "tsv-idx", "--model", tiny_model)
    assert result.returncode == 0, result.stderr
    assert "indexed 2 entries" in result.stderr and "lines 3-4 as row 2" in result.stderr
    quoted = write(tmp_path / "q.csv", 'id,text,note\n1,plain,n1\n2,"quoted start,n2\n3,27",n3\n')
    result = run("index", quoted, "-o", tmp_path / "csv-idx", "--model", tiny_model)
    assert result.returncode == 0, result.stderr
    assert "indexed 2 entries" in result.stderr
    assert "1 quoted field spans lines (lines 3-4 as row 2); read 2 rows from 4 lines" in result.stderr
