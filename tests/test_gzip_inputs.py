"""Gzipped inputs: a corpus, queries and judgements compressed with gzip are read as the text they
hold, told by their ``.gz`` suffix or by gzip's magic bytes; a broken one is one error naming gzip."""

from __future__ import annotations

import contextlib
import gzip
import os
import threading

import pytest

from indexer.errors import BadInput
from indexer.reading.corpus import read_corpus
from search.read.queries import read_queries
from search.studies.evaluate import read_pairs, read_qrels
from tests.helpers import assert_clean_failure, run

QRELS = "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n"


def gzipped(path, text: str):
    path.write_bytes(gzip.compress(text.encode("utf-8")))
    return path


def test_gzipped_corpora_read_as_the_file_they_hold(tmp_path):
    """The format is told from the name before ``.gz``; the rows, lines and notes are the same."""
    tsv = 'id\ttext\tcat\n1\tplain\tx\n2\t"He said ""stop""\tthen\nleft"\ty\n'
    (tmp_path / "c.tsv").write_text(tsv, encoding="utf-8")
    plain = read_corpus(tmp_path / "c.tsv")
    packed = read_corpus(gzipped(tmp_path / "c.tsv.gz", tsv))
    assert [e.fields for e in packed.entries] == [e.fields for e in plain.entries]
    assert [e.text for e in packed.entries] == ["plain", 'He said "stop"\tthen\nleft']
    assert packed.notes == [n.replace("c.tsv", "c.tsv.gz") for n in plain.notes] and len(packed.notes) == 1
    jsonl = '{"id": "a", "text": "one"}\n{"id": "b", "text": "two"}\n'
    assert [e.id for e in read_corpus(gzipped(tmp_path / "c.json.GZ", jsonl)).entries] == ["a", "b"]


def test_gzipped_queries_and_qrels_are_read(tmp_path):
    assert read_qrels(gzipped(tmp_path / "qrels.tsv.gz", QRELS)) == {"q1": {"d1": 1}, "q2": {"d2": 1}}
    queries = gzipped(tmp_path / "queries.jsonl.gz", '{"_id": "q1", "text": "where is it"}\n')
    assert [(q.id, q.text) for q in read_queries(str(queries))] == [("q1", "where is it")]


def test_gzipped_sentence_pairs_are_read_in_the_format_their_name_gives(tmp_path):
    """``pairs.jsonl.gz`` holds JSON Lines, ``pairs.tsv.gz`` a table: ``evaluate sts`` reads both."""
    import json

    pairs = [("a", "b", 1.0), ("c", "d", 4.0), ("e", "f", 2.0)]
    lines = "".join(json.dumps({"sentence1": a, "sentence2": b, "score": g}) + "\n" for a, b, g in pairs)
    table = "sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{g}\n" for a, b, g in pairs)
    for name, text in (("pairs.jsonl.gz", lines), ("pairs.tsv.gz", table)):
        read = read_pairs(gzipped(tmp_path / name, text))
        assert list(zip(read.first, read.second, read.gold.tolist(), strict=True)) == pairs


def test_a_gzipped_file_without_the_suffix_is_told_by_its_magic_bytes(tmp_path):
    assert read_qrels(gzipped(tmp_path / "test.tsv", QRELS)) == {"q1": {"d1": 1}, "q2": {"d2": 1}}
    fifo = tmp_path / "qrels.pipe"  # read once, as <(cat qrels.tsv.gz) is: peeked at, not reopened
    os.mkfifo(fifo)

    def write() -> None:
        with contextlib.suppress(BrokenPipeError), open(fifo, "wb") as out:
            out.write(gzip.compress(QRELS.encode()))

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        assert read_qrels(fifo) == {"q1": {"d1": 1}, "q2": {"d2": 1}}
    finally:
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # a writer still waiting to open goes on
        writer.join(timeout=10)


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (gzip.compress(QRELS.encode())[:30], "cut short"),
        (gzip.compress(QRELS.encode())[:-8] + bytes(8), "not valid gzip"),
        (b"plain text, not gzip\n", "not valid gzip"),
    ],
    ids=["cut", "damaged", "not-gzip"],
)
def test_a_broken_gzip_file_is_one_error_naming_gzip(tmp_path, data, said):
    path = tmp_path / "qrels.tsv.gz"
    path.write_bytes(data)
    with pytest.raises(BadInput, match=f"{path}.*{said}") as refused:
        read_qrels(path)
    assert "\n" not in str(refused.value)
    with pytest.raises(BadInput, match=said):
        read_corpus(path)


@pytest.mark.slow
def test_the_cli_refuses_a_cut_gzip_corpus_in_one_line(tmp_path):
    corpus = tmp_path / "corpus.tsv.gz"
    corpus.write_bytes(gzip.compress(b"id\ttext\n" + b"1\tsome text\n" * 5000)[:-100])
    assert_clean_failure(run("index", corpus, "-o", tmp_path / "idx"), "gzip")


SMALL = 1 << 20
"""The limit on a line's and a field's length the tests below read under (the real one is 32 MiB)."""


@pytest.fixture
def small_limit(monkeypatch):
    """Lines and fields of at most ``SMALL`` characters, CSV's field limit restored afterwards."""
    import csv

    from indexer.reading import decoding

    real = decoding.MAX_TEXT
    monkeypatch.setattr(decoding, "MAX_TEXT", SMALL)
    yield
    csv.field_size_limit(real)


def write_big(path, head: str, size: int, tail: str, packed: bool):
    """``head``, ``size`` zeros, ``tail``, written a megabyte at a time (gzip: ~1/1000 of it on disk)."""
    with gzip.open(path, "wb", compresslevel=6) if packed else path.open("wb") as out:
        out.write(head.encode())
        for start in range(0, size, 1 << 20):
            out.write(b"0" * min(1 << 20, size - start))
        out.write(tail.encode())
    return path


BOMBS = {  # format -> (head, tail, where the refusal says the long line is)
    "csv": ("id,text\n1,short\n2,", "\n3,after\n", r"line 3 \(row 2\)"),
    "tsv": ("id\ttext\n1\tshort\n2\t", "\n3\tafter\n", r"line 3 \(row 2\)"),
    "jsonl": ('{"id": "1", "text": "short"}\n{"id": "2", "text": "', '"}\n', r"line 2 \(row 2\)"),
    "json": ('[{"text": "short"}, {"text": "', '"}]', r"row 2 \(an element of the JSON array\)"),
    "txt": ("short\n", "\nafter\n", r"line 2 \(row 2\)"),
}


@pytest.mark.parametrize("packed", [True, False], ids=["gzip", "plain"])
@pytest.mark.parametrize("fmt", list(BOMBS))
def test_a_line_over_the_limit_is_refused_naming_its_row_before_it_is_read_whole(
    tmp_path, small_limit, fmt, packed
):
    """A gzip bomb (one line of gigabytes in a small file) is refused once a line passes the
    limit, in memory that does not grow with the line: here 64 MiB of zeros in 64 KiB of gzip."""
    import tracemalloc

    head, tail, said = BOMBS[fmt]
    size = (64 if packed else 4) * SMALL
    path = write_big(tmp_path / f"c.{fmt}{'.gz' if packed else ''}", head, size, tail, packed)
    tracemalloc.start()
    try:
        refusal = f"^{path}: {said} is longer than 1 MiB, the most a line or a field may hold$"
        with pytest.raises(BadInput, match=refusal):
            read_corpus(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 12 * SMALL


def test_a_quoted_field_over_the_limit_is_refused_or_read_as_its_lines(tmp_path, small_limit):
    """Lines each short, one quoted field of 2 MiB: CSV (a writer's quotes) refuses it naming its
    row; a TSV read with ``auto`` quoting reads such a field's lines as the rows they are."""
    lines = ("0" * 1023 + "\n") * 2048
    path = tmp_path / "c.csv"
    path.write_text(f'id,text\n1,"{lines}"\n2,after\n', encoding="utf-8")
    with pytest.raises(BadInput, match="line 2 \\(row 1\\) holds a field longer than 1 MiB"):
        read_corpus(path)
    tsv = tmp_path / "c.tsv"
    tsv.write_text(f'text\n"start\n{lines}end"\n', encoding="utf-8")
    assert len(read_corpus(tsv).entries) == 2050
    with pytest.raises(BadInput, match="line 2 \\(row 1\\) holds a field longer than 1 MiB"):
        read_corpus(tsv, quoting="csv")


def test_queries_on_stdin_with_a_line_over_the_limit_are_refused(small_limit, monkeypatch):
    import io
    import sys

    from indexer.reading.decoding import lines_of

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"q1\n" + b"0" * (3 * SMALL) + b"\nq3\n")))
    with pytest.raises(BadInput, match="^stdin: line 2 is longer than 1 MiB"):
        lines_of("-")


def test_a_document_of_several_megabytes_is_read(tmp_path):
    """The real limit leaves room for long documents: a 6 MB field, gzipped or not."""
    for packed in (True, False):
        name = f"c{packed}.csv{'.gz' if packed else ''}"
        path = write_big(tmp_path / name, "id,text\n1,", 6 << 20, "\n", packed)
        assert [len(e.text) for e in read_corpus(path).entries] == [6 << 20]
