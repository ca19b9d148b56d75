"""One query reader for `query --queries` and the retrieval evaluation: BEIR's queries.jsonl and
qrels as distributed, our own JSON Lines, plain lines and stdin; ids are always strings."""

from __future__ import annotations

import io
import json

import pytest

from indexer.errors import BadInput
from search.read.queries import Query, read_queries
from search.studies.evaluate import evaluate_retrieval, read_retrieval_set

DOCS = [
    ("d1", "Paris", "Paris is the capital and largest city of France."),
    ("d2", "Photosynthesis", "Plants turn sunlight, water and carbon dioxide into sugar."),
    ("d3", "Tides", "The moon's gravity pulls the oceans and makes the tides."),
]
QUESTIONS = [
    ("q-1", "what is the capital of France"),
    ("q-2", "how do plants make food from light"),
    ("q-3", "why does the sea rise and fall"),
]


def beir_set(root, corpus_id_key: str = "_id"):
    """A BEIR-shaped directory: corpus.jsonl, queries.jsonl and qrels/test.tsv with its header."""
    (root / "qrels").mkdir(parents=True)
    rows = [{corpus_id_key: i, "title": t, "text": x} for i, t, x in DOCS]
    (root / "corpus.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\n", encoding="utf-8")
    queries = [{"_id": i, "text": q, "metadata": {}} for i, q in QUESTIONS]
    (root / "queries.jsonl").write_text("\n".join(map(json.dumps, queries)) + "\n", encoding="utf-8")
    qrels = "query-id\tcorpus-id\tscore\n" + "".join(f"q-{n}\td{n}\t1\n" for n in (1, 2, 3))
    (root / "qrels" / "test.tsv").write_text(qrels, encoding="utf-8")
    return root


def test_beir_queries_and_qrels_read_with_their_ids(tmp_path):
    root = beir_set(tmp_path)
    assert read_queries(str(root / "queries.jsonl"))[0] == Query("q-1", QUESTIONS[0][1])
    data = read_retrieval_set(root / "queries.jsonl", root / "qrels" / "test.tsv")
    assert [q.id for q in data.queries] == ["q-1", "q-2", "q-3"]
    assert data.qrels == {"q-1": {"d1": 1}, "q-2": {"d2": 1}, "q-3": {"d3": 1}}


@pytest.mark.slow
def test_beir_queries_and_qrels_evaluate_end_to_end(tmp_path, bundled):
    """The corpus uses ``id`` here: BEIR's corpus ``_id`` is read by indexer.reading.corpus (another
    branch)."""
    root = beir_set(tmp_path, corpus_id_key="id")
    data = read_retrieval_set(root / "queries.jsonl", root / "qrels" / "test.tsv")
    scores = evaluate_retrieval(data, corpus=root / "corpus.jsonl", text_fields=["title", "text"])
    assert scores["queries"] == 3 and scores["success@1"] == 1.0


@pytest.mark.slow
def test_beir_corpus_evaluates_end_to_end(tmp_path, bundled):
    root = beir_set(tmp_path)
    data = read_retrieval_set(root / "queries.jsonl", root / "qrels" / "test.tsv")
    scores = evaluate_retrieval(data, corpus=root / "corpus.jsonl", text_fields=["title", "text"])
    assert scores["queries"] == 3 and scores["success@1"] == 1.0


def test_formats_and_ids_are_strings(tmp_path, monkeypatch):
    ours = tmp_path / "q.jsonl"
    ours.write_text('{"id": 7, "text": "seven"}\n\n{"query": "no id here"}\n', encoding="utf-8")
    assert read_queries(str(ours)) == [Query("7", "seven"), Query("3", "no id here")]
    plain = tmp_path / "q.txt"
    plain.write_text("first question\n\n  second question \n", encoding="utf-8")
    assert read_queries(str(plain)) == [Query("1", "first question"), Query("3", "second question")]
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"from stdin\n"), encoding="utf-8"))
    assert read_queries("-") == [Query("1", "from stdin")]


@pytest.mark.parametrize(
    "content,message",
    [
        ('{"_id": "a", "text": "fine"}\n{"_id": "b", "text": \n', "line 2"),
        ('{"_id": "a", "text": "fine"}\n{"_id": "b"}\n', "line 2"),
        ('{"_id": "a", "text": "fine"}\n["not", "an object"]\n', "line 2"),
        ('{"_id": "a", "text": "   "}\n', "line 1"),
        ('{"id": 1.0, "text": "an id that is not one"}\n', "line 1"),
        ('{"id": true, "text": "an id that is not one"}\n', "line 1"),
        ('{"text": "deep", "n": ' + "[" * 100_000 + "]" * 100_000 + "}\n", "line 1"),
        ("", "no queries"),
        ("\n  \n", "no queries"),
    ],
)
def test_bad_query_files_are_one_clear_error(tmp_path, content, message):
    path = tmp_path / "q.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(BadInput, match=message):
        read_queries(str(path))


def test_missing_and_non_utf8_files(tmp_path):
    with pytest.raises(BadInput, match="no such file"):
        read_queries(str(tmp_path / "absent.jsonl"))
    binary = tmp_path / "q.txt"
    binary.write_bytes(b"caf\xe9\n")
    with pytest.raises(BadInput, match="UTF-8"):
        read_queries(str(binary))


@pytest.mark.parametrize(
    "name,content",
    [
        ("q.csv", 'id,text\nq1,facebook\nq2,"gmail, mail"\n'),
        ("q.tsv", "id\ttext\nq1\tfacebook\nq2\tgmail, mail\n"),
        ("q.csv.gz", None),
    ],
)
def test_csv_and_tsv_queries_are_read_by_their_columns(tmp_path, name, content):
    """A header is not a query and an id is not text: CSV and TSV are told apart by extension as a
    corpus's are, and read by its reader (quotes, delimiters, gzip)."""
    path = tmp_path / name
    if content is None:
        import gzip

        path.write_bytes(gzip.compress(b"id;text\nq1;facebook\nq2;gmail, mail\n"))
    else:
        path.write_text(content, encoding="utf-8")
    assert read_queries(str(path)) == [Query("q1", "facebook"), Query("q2", "gmail, mail")]


def test_csv_queries_without_ids_are_numbered_and_a_missing_text_column_is_named(tmp_path):
    plain = tmp_path / "q.csv"
    plain.write_text("text\nfacebook\ngmail\n", encoding="utf-8")
    assert read_queries(str(plain)) == [Query("1", "facebook"), Query("2", "gmail")]
    other = tmp_path / "o.csv"
    other.write_text("id,question\nq1,facebook\n", encoding="utf-8")
    with pytest.raises(BadInput, match=r"o\.csv.*'text'.*id, question") as caught:
        read_queries(str(other))
    assert "--text-field" not in str(caught.value)  # no command that reads queries has it
    broken = tmp_path / "b.csv"
    broken.write_text("id,text\nq1,facebook\nq2\n", encoding="utf-8")
    named = tmp_path / "n.tsv"
    named.write_text("query\nfacebook\n", encoding="utf-8")
    assert read_queries(str(named)) == [Query("1", "facebook")]
    with pytest.raises(BadInput, match=r"b\.csv line 3 \(row 2\): wrong field count"):
        read_queries(str(broken))


@pytest.mark.parametrize(
    "name,content",
    [
        ("q.jsonl", '{"id": "a", "text": "facebook"}\n{"id": "a", "text": "gmail"}\n'),
        ("q.csv", "id,text\na,facebook\na,gmail\n"),
    ],
)
def test_a_duplicate_query_id_is_an_error_naming_both_rows(tmp_path, name, content):
    """Otherwise the evaluation keeps one of the two texts against the id's judgements, and
    ``query --queries`` prints two results under one id."""
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(
        BadInput, match=r"(line|row) 2\)?: duplicate id: 'a' \(first at (line|row) 1\)"
    ) as caught:
        read_queries(str(path))
    assert "\n" not in str(caught.value)
