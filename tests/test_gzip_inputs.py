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
