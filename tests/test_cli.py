"""The real `semsearch` command in a subprocess: outputs people read and parse, and every bad input
ends as one clear line on stderr with a non-zero exit, never a traceback, never a damaged index."""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import pytest

from indexer.store import CURRENT
from tests.helpers import assert_clean_failure, run


@pytest.fixture(scope="module")
def index(tmp_path_factory, tiny_model) -> Path:
    root = tmp_path_factory.mktemp("cli")
    corpus = root / "faq.csv"
    corpus.write_text(
        "id,question,answer\nq1,How do I pay?,By card.\nq2,Where do I park?,At a dock.\n"
        "q1,How do I pay?,\n,No id here,x\n",
        encoding="utf-8",
    )
    result = run("index", corpus, "-o", root / "idx", "--model", tiny_model, "--text-field", "question")
    assert result.returncode == 0, result.stderr
    assert "indexed 2 entries" in result.stderr
    assert "rejected 2 rows: 1 duplicate id, 1 missing id" in result.stderr
    assert "line 4 (row 3): duplicate id: 'q1' (first at row 1)" in result.stderr
    return root / "idx"


@pytest.mark.slow
def test_query_json_and_table(index):
    result = run("query", index, "Where do I park?", "-k", "2", "--json")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["query"] == "Where do I park?" and record["query_id"] == "1"
    top = record["hits"][0]
    assert (top["rank"], top["id"], top["text"], top["fields"]["answer"]) == (
        1,
        "q2",
        "Where do I park?",
        "At a dock.",
    )
    assert top["score"] == pytest.approx(1.0, abs=1e-4)
    table = run("query", index, "Where do I park?", "-k", "1")
    assert "q2" in table.stdout and "answer: At a dock." in table.stdout


@pytest.mark.slow
def test_queries_file_gives_one_json_line_per_query(index, tmp_path):
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"id": "a", "text": "How do I pay?"}\n{"id": "b", "text": "Where do I park?"}\n')
    result = run("query", index, "--queries", queries, "-k", "1", "--json")
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["query_id"], r["hits"][0]["id"]) for r in records] == [("a", "q1"), ("b", "q2")]
    plain = run("query", index, "--queries", "-", "-k", "1", "--json", stdin="How do I pay?\n\n")
    assert [json.loads(line)["query_id"] for line in plain.stdout.splitlines()] == ["1"]


@pytest.mark.slow
def test_similar_ranks_lines_of_stdin(tiny_model):
    result = run(
        "similar",
        "a red bike",
        "-",
        "--model",
        tiny_model,
        "--json",
        stdin="completely different words\na red bike\n\nsomething else\n",
    )
    assert result.returncode == 0, result.stderr
    hits = json.loads(result.stdout)["hits"]
    assert len(hits) == 3 and hits[0]["text"] == "a red bike" and hits[0]["id"] == "2"


@pytest.mark.slow
def test_info(index):
    result = run("info", index, "--json")
    info = json.loads(result.stdout)
    assert (info["entries"], info["vectors"], info["dimension"]) == (2, 2, 32)
    assert info["strategy"]["layers"] == [-2] and info["size_bytes"] > 0


@pytest.mark.slow
def test_bad_inputs_are_one_line_errors(index, tmp_path, tiny_model):
    before = (index / CURRENT).read_text()
    bad_utf8 = tmp_path / "bad.csv"
    bad_utf8.write_bytes(b"text\n\xff\xfe\n")
    empty = tmp_path / "empty.csv"
    empty.write_text("text\n\n", encoding="utf-8")
    good = tmp_path / "good.txt"
    good.write_text("a line\n", encoding="utf-8")
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / CURRENT).write_text("v-missing\n")
    cases = [
        (("index", tmp_path / "missing.csv", "-o", index), "no such file"),
        (("index", tmp_path / "x.unknown", "-o", index, "--model", tiny_model), "no such file"),
        (("index", empty, "-o", index, "--model", tiny_model), "empty corpus"),
        (("index", bad_utf8, "-o", index, "--model", tiny_model), "not valid UTF-8; looks like cp1252"),
        (("index", empty, "-o", index, "--text-field", "question"), "has field 'question'"),
        (("index", good, "-o", index, "--model", "/no/such/model"), "cannot load model"),
        (("index", good, "-o", index, "--model", tiny_model, "--layers", "9"), "out of range"),
        (("index", good, "-o", index, "--layers", "x"), "Invalid value for '--layers'"),
        (("query", index, "   "), "empty query"),
        (("similar", "hi", good, "--index", index, "--layers", "-1"), "built with"),
        (("query", tmp_path / "nowhere", "hi"), "no index at"),
        (("query", damaged, "hi"), "names a missing version"),
        (("query", tmp_path, "hi"), "not a semsearch index"),
    ]
    for args, message in cases:
        assert_clean_failure(run(*args), message)
    assert (index / CURRENT).read_text() == before
    unknown = tmp_path / "x.unknown"
    unknown.write_text("hello\n")
    assert_clean_failure(run("index", unknown, "-o", index, "--model", tiny_model), "cannot tell the format")
    assert_clean_failure(run("query", index), "give a QUESTION or --queries")


@pytest.mark.slow
def test_evaluate_sweep_and_words_commands(tmp_path, tiny_model):
    pairs = tmp_path / "pairs.tsv"
    rows = [
        ("A man plays guitar.", "Someone plays music.", 4.2),
        ("A dog runs.", "Stocks fell.", 0.2),
        ("It is raining.", "Rain is falling.", 4.8),
        ("A cat sleeps.", "Parliament votes.", 0.0),
    ]
    pairs.write_text("score\tsentence1\tsentence2\n" + "".join(f"{g}\t{a}\t{b}\n" for a, b, g in rows))
    result = run("evaluate", "sts", pairs, "--model", tiny_model, "--json")
    assert result.returncode == 0, result.stderr
    assert set(json.loads(result.stdout)) >= {"spearman", "pearson", "pairs", "strategy"}
    sweep = run(
        "sweep",
        "sts",
        pairs,
        "--model",
        tiny_model,
        "--poolings",
        "mean,cls",
        "--csv",
        tmp_path / "s.csv",
        "--heatmap",
        tmp_path / "s.png",
    )
    assert sweep.returncode == 0, sweep.stderr
    assert "reproduce: semsearch index CORPUS -o INDEX --model" in sweep.stdout
    assert (tmp_path / "s.png").stat().st_size > 0
    assert len((tmp_path / "s.csv").read_text().splitlines()) == 1 + 8 * 2
    words = run("words", "the bank of the river and the bank vault", "--word", "bank", "--json")
    assert words.returncode == 0, words.stderr
    out = json.loads(words.stdout)
    assert out["words"] == ["bank", "bank"] and len(out["cosine"]) == 2
    assert_clean_failure(run("words", "no such thing here", "--word", "bank"), "does not occur")
    assert_clean_failure(run("evaluate", "sts", pairs, "--sentence1", "left"), "--sentence1")
    assert_clean_failure(run("sweep", "sts", pairs, "--poolings", "median"), "unknown pooling")


@pytest.mark.slow
def test_a_windows_export_indexes_with_its_encoding_and_separator(tmp_path, tiny_model):
    """A spreadsheet's CSV as Excel writes it in Europe: cp1252, semicolons, capitalised names.
    Read as UTF-8 it is refused with the encoding to try and nothing written; with it, every row
    is indexed and the separator is said."""
    rows = [f"q{i};Caf\u00e9 n\u00b0{i} ferm\u00e9?;Oui" for i in range(8)]
    corpus = tmp_path / "export.csv"
    corpus.write_bytes(("Id;Question;Answer\r\n" + "\r\n".join(rows) + "\r\n").encode("cp1252"))
    args = ["index", corpus, "-o", tmp_path / "idx", "--model", tiny_model, "--text-field", "question"]
    assert_clean_failure(run(*args), "looks like cp1252/latin-1: try --encoding cp1252")
    assert not (tmp_path / "idx").exists()
    result = run(*args, "--encoding", "cp1252")
    assert result.returncode == 0, result.stderr
    assert "reading export.csv as semicolon-separated" in result.stderr
    assert "indexed 8 entries" in result.stderr and "rejected" not in result.stderr
    misspelt = run(*args, "--encoding", "cp1252", "--text-field", "questoin")
    assert_clean_failure(misspelt, "did you mean 'Question'")


@pytest.mark.slow
def test_labels_in_another_encoding_are_read_with_it(tmp_path, tiny_model):
    """A cp1252 pairs file: refused with the encoding to try, and scored with ``--encoding``."""
    pairs = tmp_path / "pairs.tsv"
    rows = [("Caf\u00e9 ouvert.", "Le caf\u00e9 est ouvert.", 4.5), ("Il pleut.", "Bourse en baisse.", 0.2)]
    rows += [("Un chat dort.", "Le chat dort.", 4.0), ("Un chien court.", "Vote au S\u00e9nat.", 0.1)]
    text = "score\tsentence1\tsentence2\r\n" + "".join(f"{g}\t{a}\t{b}\r\n" for a, b, g in rows)
    pairs.write_bytes(text.encode("cp1252"))
    args = ["evaluate", "sts", pairs, "--model", tiny_model, "--json"]
    assert_clean_failure(run(*args), "try --encoding cp1252")
    result = run(*args, "--encoding", "cp1252")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["pairs"] == 4


@pytest.mark.slow
def test_an_empty_device_is_refused(tiny_model):
    """``--device ''`` (a variable left unset) is no device: it ran on auto before."""
    result = run("encode", "--model", tiny_model, "--device", "", stdin="a bike\n")
    assert_clean_failure(result, "Invalid value for '--device': give auto, cpu, cuda or cuda:N (it is empty)")


@pytest.mark.slow
def test_a_hybrid_weight_of_minus_zero_is_stored_and_shown_as_zero(tmp_path, tiny_model):
    from tests.helpers import build_faq

    index = build_faq(tmp_path, tiny_model)
    result = run("calibrate", index, "--hybrid-weight", "-0")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "hybrid weight 0 stored: hybrid fuses 1 dense + 0 keyword\n"
    info = run("info", index)
    assert "hybrid_weight: 0 (stored;" in info.stdout, info.stdout


@pytest.mark.slow
def test_a_file_read_the_wrong_way_stops_index_add_and_encode(tmp_path, tiny_model):
    """A one-column CSV whose texts hold commas splits into the wrong field count on most rows:
    ``index``, ``add`` and ``encode`` write nothing, name the cause and ``--delimiter``, and exit
    non-zero; with ``--delimiter`` every row is read. A pandas TSV with quoted line ends indexes
    every row, and a file with one cp1252 row and no UTF-8 is refused naming cp1252."""
    import pandas as pd

    wrong = tmp_path / "notes.csv"
    notes = [*(f"Note {i}, with a comma" for i in range(7)), *(f"Note {i}" for i in range(5))]
    wrong.write_text("text\n" + "\n".join(notes) + "\n")
    cause = "7 of 12 rows do not have the header's 1 field when split at commas"
    assert_clean_failure(run("index", wrong, "-o", tmp_path / "idx", "--model", tiny_model), "--delimiter")
    assert not (tmp_path / "idx").exists()
    frame = pd.DataFrame({"id": ["a", "b", "c"], "text": ["one\ntwo", 'say "hi"', "tab\there"]})
    frame.to_csv(tmp_path / "faq.tsv", sep="\t", index=False)
    built = run("index", tmp_path / "faq.tsv", "-o", tmp_path / "idx", "--model", tiny_model)
    assert built.returncode == 0 and "indexed 3 entries" in built.stderr and "rejected" not in built.stderr
    before = (tmp_path / "idx" / CURRENT).read_text()
    assert_clean_failure(run("add", tmp_path / "idx", wrong), cause)
    assert (tmp_path / "idx" / CURRENT).read_text() == before
    out = tmp_path / "v.npy"
    assert_clean_failure(run("encode", wrong, "-o", out, "--model", tiny_model), cause)
    assert not out.exists()
    encoded = run("encode", wrong, "-o", out, "--model", tiny_model, "--delimiter", "|")
    assert encoded.returncode == 0, encoded.stderr
    one = tmp_path / "one.csv"
    one.write_bytes(b"text\n" + b"".join(b"plain %d\n" % i for i in range(30)) + "café\n".encode("cp1252"))
    assert_clean_failure(run("add", tmp_path / "idx", one), "try --encoding cp1252")


def test_the_exit_does_not_trace_what_the_command_left(monkeypatch):
    """Once the command is done, `main` freezes the garbage collector: the interpreter's exit still
    runs every clean-up (atexit, finalizers, flushing), without tracing the objects NumPy, FAISS
    and ONNX Runtime left, which took 0.1-0.2 s of each `semsearch index`."""
    import search.cli

    monkeypatch.setattr(search.cli, "cli", lambda **_: sys.exit(0))
    monkeypatch.setattr("indexer.files.stop_on_sigterm", lambda: None)
    try:
        with pytest.raises(SystemExit):
            search.cli.main()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
