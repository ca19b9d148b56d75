"""The CLI at its seams: exit codes by kind of error, filter errors as filter errors, "no match"
said plainly, ids from stdin, and a writer that can wait for the lock."""

from __future__ import annotations

import fcntl
import json
import threading
import time
from pathlib import Path

import pytest

from indexer.store import CURRENT, LOCK
from tests.helpers import assert_clean_failure, run


@pytest.fixture
def index(tmp_path, tiny_model) -> Path:
    corpus = tmp_path / "faq.csv"
    corpus.write_text(
        "id,text,category\nq1,How do I pay?,billing\nq2,Where do I park?,stations\nq3,Refunds?,billing\n",
        encoding="utf-8",
    )
    result = run("index", corpus, "-o", tmp_path / "idx", "--model", tiny_model)
    assert result.returncode == 0, result.stderr
    return tmp_path / "idx"


@pytest.mark.slow
def test_exit_codes_tell_the_kind_of_error(index, tmp_path):
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / CURRENT).write_text("v-missing\n")
    bad_input = run("query", index, "hi", "--where", "nope = 1")
    conflict = run("similar", "hi", "--index", index, "--layers", "-1", stdin="a line\n")
    broken = run("query", damaged, "hi")
    assert_clean_failure(bad_input, "unknown field 'nope'")
    assert_clean_failure(conflict, "built with")
    assert_clean_failure(broken, "names a missing version")
    assert (bad_input.returncode, conflict.returncode, broken.returncode) == (1, 3, 5)


@pytest.mark.slow
@pytest.mark.parametrize(
    "where, message",
    [
        ("(" * 490 + "category = 'billing'" + ")" * 490, "filter: nested deeper"),
        ("NOT " * 248 + "category = 'billing'", "filter: nested deeper"),
        (" OR ".join(["category = 'billing'"] * 1001), "filter: longer than"),
        (" OR ".join(["category = 'b'"] * 100), "filter: more than"),
        ('category = "billing"', "single quotes"),
    ],
    ids=["parens", "nots", "ors", "terms", "double-quoted-value"],
)
def test_filter_errors_are_filter_errors(index, where, message):
    result = run("query", index, "hi", "--where", where)
    assert_clean_failure(result, message)
    assert result.returncode == 1 and "unexpected" not in result.stderr


@pytest.mark.slow
def test_zero_hits_say_no_match(index):
    result = run("query", index, "How do I pay?", "--where", "category = 'none such'")
    assert result.returncode == 0, result.stderr
    assert "no match" in result.stdout
    assert "rank" not in result.stdout  # no empty table header
    as_json = run("query", index, "How do I pay?", "--where", "category = 'none such'", "--json")
    assert json.loads(as_json.stdout)["hits"] == []


@pytest.mark.slow
def test_delete_reads_ids_from_stdin(index):
    result = run("delete", index, "--ids-file", "-", stdin="q1\n\nq3\nq9\n")
    assert result.returncode == 0, result.stderr
    assert "deleted 2" in result.stderr and "not found (1): q9" in result.stderr


@pytest.mark.slow
def test_a_second_writer_fails_at_once_or_waits(index):
    with (index / LOCK).open("a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        locked = run("delete", index, "--id", "q1")
        assert_clean_failure(locked, "another semsearch process")
        assert locked.returncode == 4
        threading.Timer(1.0, lambda: fcntl.flock(handle, fcntl.LOCK_UN)).start()
        started = time.monotonic()
        waited = run("delete", index, "--id", "q1", "--wait", "30")
    assert waited.returncode == 0, waited.stderr
    assert "deleted 1" in waited.stderr and time.monotonic() - started >= 1.0


@pytest.mark.slow
def test_info_shows_fields_with_types(index):
    result = run("info", index, "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["fields"] == {"id": "text", "text": "text", "category": "text"} and info["entries"] == 3
    assert info["id_field"] == "id" and info["index_kind"] == "flat"
    text = run("info", index)
    assert "category (text)" in text.stdout and "flat, float32" in text.stdout


@pytest.mark.slow
def test_similar_with_post_processing_uses_an_index_or_refuses(tmp_path, tiny_model):
    corpus = tmp_path / "c.txt"
    corpus.write_text("A man plays guitar.\nA dog runs.\nStocks fell.\nIt is raining.\n", encoding="utf-8")
    built = run("index", corpus, "-o", tmp_path / "idx", "--model", tiny_model, "--postprocess", "center")
    assert built.returncode == 0, built.stderr
    from indexer.embedding.strategy import Strategy
    from indexer.errors import BadInput
    from search.read.similar import rank_similar

    with pytest.raises(BadInput, match="post-processing needs statistics fitted on a corpus"):
        rank_similar(
            "Someone makes music.", ["A man plays guitar."], Strategy(model=tiny_model, postprocess="center")
        )
    ranked = run(
        "similar",
        "Someone makes music.",
        "-",
        "--index",
        tmp_path / "idx",
        "--json",
        stdin="A man plays guitar.\n",
    )
    assert ranked.returncode == 0, ranked.stderr
    (hit,) = json.loads(ranked.stdout)["hits"]
    assert -1.0 < hit["score"] < 1.0  # refitting "center" on one candidate always gave -1.0


@pytest.mark.slow
def test_bytes_that_are_not_utf8_are_bad_input(index):
    """Arguments and stdin carry undecodable bytes as lone surrogates: one clear line, exit 1."""
    import subprocess
    import sys

    def raw(*args: bytes, stdin: bytes | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable.encode(), b"-m", b"search.cli", *args], input=stdin, capture_output=True
        )

    idx = str(index).encode()
    for result in (
        raw(b"query", idx, b"caf\xff"),
        raw(b"query", idx, b"--queries", b"-", stdin=b"caf\xff\n"),
        raw(b"query", idx, b"x", b"--where", b"category = '\xff'"),
        raw(b"similar", b"coffee", b"-", stdin=b"ok line\ncaf\xff\n"),
    ):
        err = result.stderr.decode("utf-8", "replace")
        assert result.returncode == 1 and "not valid UTF-8" in err, err
        assert "unexpected" not in err and "Traceback" not in err


@pytest.mark.parametrize("chained", ["cause", "context"])
def test_an_interrupt_that_a_library_raises_as_another_error_is_an_interrupt(tmp_path, monkeypatch, chained):
    """Ctrl-C during ``import onnxruntime`` comes out as ``ImportError: initialization failed``
    with the KeyboardInterrupt as its cause: it is still the user's interrupt (exit 130)."""
    import builtins

    from click.testing import CliRunner

    from search.cli import cli

    real = builtins.__import__

    def interrupted(name: str, *args: object, **kwargs: object) -> object:
        if name == "search.read.info":
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt as stop:
                if chained == "cause":
                    raise ImportError("initialization failed") from stop
                raise ImportError("initialization failed")  # noqa: B904 (what the extension does)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", interrupted)
    result = CliRunner().invoke(cli, ["info", str(tmp_path)])
    assert result.exit_code == 130, result.output
    assert "Interrupted: nothing was changed." in result.output and "unexpected" not in result.output


@pytest.mark.parametrize(
    "option",
    [
        ["--text-field", ""],
        ["--text-field", ",,"],
        ["-k", "99999999999999999999"],
        ["--min-score", "nan"],
        ["--min-score", "inf"],
    ],
)
def test_an_option_value_out_of_its_range_is_a_usage_error(tmp_path, option):
    """Exit 2 and the option named, as for ``-k 0``, before any file is read or written (an empty
    --text-field is not the default 'text')."""
    from click.testing import CliRunner

    from search.cli import cli

    corpus = tmp_path / "faq.csv"
    corpus.write_text("id,text\n1,hello\n", encoding="utf-8")
    if option[0] == "--text-field":
        args = ["index", str(corpus), "-o", str(tmp_path / "idx"), *option]
    else:
        args = ["query", str(tmp_path / "idx"), "hello", *option]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert option[0] in result.output and not (tmp_path / "idx").exists()


def test_the_cli_bounds_k_as_a_search_does():
    from search.cli.options import HITS
    from search.read.requests import MOST_HITS

    assert HITS.max == MOST_HITS


ABSTENTION = ["evaluate", "abstention", "--corpus", "C", "--queries", "Q", "--qrels", "R"]
FIXED_RANGES = [
    (["calibrate", "IDX"], "--min-precision", "2", "0<x<=1"),
    (["calibrate", "IDX"], "--min-precision", "0", "0<x<=1"),
    (["calibrate", "IDX"], "--min-precision", "nan", "not a finite number"),
    (["calibrate", "IDX"], "--precision", "1.5", "0<x<=1"),
    (["calibrate", "IDX"], "--guarantee", "1", "0<x<1"),
    (["calibrate", "IDX"], "--unanswerable", "0", "0<x<1"),
    (["calibrate", "IDX"], "--hybrid-weight", "1.5", "0<=x<=1"),
    (ABSTENTION, "--holdout", "1", "0<x<1"),
    (ABSTENTION, "--guarantee", "-1", "0<x<1"),
    (["tune", "-o", "OUT", "--pairs", "P"], "--held-back", "0", "0<x<1"),
    (["tune", "-o", "OUT", "--pairs", "P"], "--held-back", "1.5", "0<x<1"),
    (["tune", "-o", "OUT", "--pairs", "P"], "--held-back", "nan", "not a finite number"),
    (["tune", "-o", "OUT", "--pairs", "P"], "--learning-rate", "-1", "0<x<1"),
    (["tune", "-o", "OUT", "--pairs", "P"], "--max-minutes", "inf", "not a finite number"),
    (["index", "C", "-o", "OUT", "--also", "answer"], "--also-weight", "2", "0<=x<=1"),
]


@pytest.mark.parametrize(("command", "option", "value", "said"), FIXED_RANGES)
def test_an_option_outside_its_fixed_range_is_a_usage_error_naming_the_range(
    tmp_path, command, option, value, said
):
    """An option whose range does not depend on the data is checked by the parser: exit 2, the
    option and its range named, before any file is read or model loaded (the paths here are absent)."""
    from click.testing import CliRunner

    from search.cli import cli

    args = [str(tmp_path / a) if a.isupper() else a for a in command]
    result = CliRunner().invoke(cli, [*args, option, value])
    assert result.exit_code == 2, result.output
    assert option in result.output and said in result.output, result.output
    assert list(tmp_path.iterdir()) == []
