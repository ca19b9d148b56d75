"""Vectors for other programs: ``search.read.encoding.encode`` and ``semsearch encode`` give exactly the
vectors an index compares (its strategy and fitted whitening), in input order, streamed in
bounded memory, and refuse bad input with one line."""

from __future__ import annotations

import functools
import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from indexer.embedding.strategy import Strategy
from indexer.errors import BadInput
from search.read.encoding import PART_TEXTS, Encoding, check_texts, encode
from search.read.engine import SearchEngine
from tests.helpers import ROWS, assert_clean_failure, build_faq, run, write_csv

TEXTS = ["How do I pay for a ride?", "a bike", "Where can I park the bike near the station?"]


@pytest.fixture
def whitened(tmp_path, tiny_model, built_once):
    write_csv(tmp_path / "faq.csv", ROWS, ("id", "text", "category"))  # beside the index, as built
    build = functools.partial(build_faq, model=tiny_model, postprocess="whiten", whiten_dims=3)
    return built_once("faq whitened", build, tmp_path / "idx")


def test_encode_with_an_index_gives_its_query_vectors(whitened):
    vectors = encode(TEXTS, index=whitened)
    expected = SearchEngine(whitened).snapshot.embed(TEXTS)
    assert vectors.dtype == np.float32 and vectors.shape == (3, 3)  # whitened to 3 dimensions
    np.testing.assert_allclose(vectors, expected, atol=1e-5)


def test_encode_with_a_strategy_gives_the_query_vectors_of_an_index_of_it(tmp_path, tiny_model):
    strategy = Strategy(model=tiny_model, pooling="max", layers=(-1, -2), combine="concat")
    index = build_faq(tmp_path, tiny_model, pooling="max", layers=(-1, -2), combine="concat")
    vectors = encode(TEXTS, strategy)
    np.testing.assert_allclose(vectors, SearchEngine(index).snapshot.embed(TEXTS), atol=1e-5)
    # one at a time or all together, from a generator: the same rows in the same order
    one_by_one = np.concatenate([encode([text], strategy) for text in TEXTS])
    np.testing.assert_allclose(encode(iter(TEXTS), strategy), one_by_one, atol=1e-5)


def test_parts_read_only_what_they_encode(tiny_model):
    """An endless iterator of texts: the first part comes after reading one part past it (the
    next part is tokenised while this one embeds), no more."""
    read = []

    def endless():
        for n in itertools.count():
            read.append(n)
            yield f"text number {n}"

    parts = Encoding.load(Strategy(model=tiny_model)).parts(endless())
    first = next(parts)
    parts.close()
    assert len(first) == PART_TEXTS
    assert len(read) <= 2 * PART_TEXTS + 1


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        ("one string", "not one string"),
        (["fine", 3], "text 2 is not a string"),
        (["fine", "  "], "text 2 is empty"),
        (["\ud800"], "text 1 is not valid UTF-8"),
        (["fine", "\0"], "text 2 is empty"),
        (["\x01\x02 \x7f"], "text 1 is empty"),
        (["fine", "ok", "\u200b\u200c\u2060"], "text 3 is empty"),
        (["\ufeff"], "text 1 is empty"),
    ],
)
def test_bad_texts_are_refused_naming_them(texts, message):
    with pytest.raises(BadInput, match=message):
        check_texts(texts)


def test_bad_requests_of_the_library(whitened, tiny_model):
    with pytest.raises(BadInput, match="no texts"):
        encode([], index=whitened)
    with pytest.raises(BadInput, match="not both"):
        encode(TEXTS, Strategy(model=tiny_model), index=whitened)
    with pytest.raises(BadInput, match="post-processing needs statistics"):
        encode(TEXTS, Strategy(model=tiny_model, postprocess="center"))


@pytest.mark.slow
def test_cli_writes_npy_and_json_lines_in_input_order(whitened, tmp_path):
    """More rows than one part, through a file and through stdin: row i is text i, as the index
    would embed it as a query."""
    texts = [f"{text} {n}" for n in range(PART_TEXTS // 2 + 3) for text in TEXTS[:2]]
    corpus = write_csv(tmp_path / "texts.csv", [(f"r{i}", t, "x") for i, t in enumerate(texts)])
    expected = SearchEngine(whitened).snapshot.embed(texts)

    out = tmp_path / "out.npy"
    result = run("encode", corpus, "--index", whitened, "-o", out)
    assert result.returncode == 0, result.stderr
    matrix = np.load(out)
    assert matrix.dtype == np.float32 and matrix.shape == (len(texts), 3)
    np.testing.assert_allclose(matrix, expected, atol=1e-5)

    result = run("encode", "--index", whitened, stdin="\n".join(texts) + "\n")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["id"] for row in rows] == [str(n) for n in range(1, len(texts) + 1)]
    np.testing.assert_allclose(np.array([row["vector"] for row in rows]), expected, atol=1e-5)

    result = run("encode", corpus, "--index", whitened, "--text-field", "text", "-o", tmp_path / "out.jsonl")
    assert result.returncode == 0, result.stderr
    ids = [json.loads(line)["id"] for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert ids == [f"r{i}" for i in range(len(texts))]


@pytest.mark.slow
def test_cli_bad_input_is_one_line_and_leaves_no_file(whitened, tmp_path, tiny_model):
    model = ["--model", tiny_model]
    assert_clean_failure(run("encode", *model, stdin=""), "no texts to encode")
    assert_clean_failure(run("encode", *model, stdin="one\n\nthree\n"), "text 2 is empty")
    assert_clean_failure(run("encode", *model, "--to", "npy", stdin="x\n"), "needs a file")
    assert_clean_failure(run("encode", "--index", whitened, "--pooling", "cls", stdin="x\n"), "drop the")
    assert_clean_failure(run("encode", *model, "--postprocess", "whiten", stdin="x\n"), "post-processing")
    assert_clean_failure(run("encode", tmp_path / "missing.txt", *model), "no such file")
    # a bad row past the first part: the run fails, and neither the file nor a partial one is left
    rows = [(f"r{i}", f"text {i}", "x") for i in range(PART_TEXTS + 5)] + [("r-last", "", "x")]
    corpus = write_csv(tmp_path / "bad.csv", rows)
    assert_clean_failure(run("encode", corpus, *model, "-o", tmp_path / "out.npy"), "empty text")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["bad.csv", "faq.csv", "idx"])


def test_an_output_that_is_not_a_regular_file_is_refused_and_left_alone(whitened, tmp_path):
    """The output is written beside its place and renamed over it: over a device or a pipe that
    rename would replace the special file itself (as root, ``-o /dev/full`` replaced the device)."""
    import os
    import stat

    from search.read.encoding import encode_file

    source = tmp_path / "texts.txt"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    pipe = tmp_path / "pipe.npy"
    os.mkfifo(pipe)
    with pytest.raises(BadInput, match="not a regular file"):
        encode_file(str(source), pipe, Encoding.load(index=whitened))
    assert stat.S_ISFIFO(pipe.stat().st_mode)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".pipe")] == []


def test_a_misspelt_field_is_named_with_the_nearest_one(tmp_path):
    """As ``index`` says it: the nearest of the file's own fields is suggested."""
    from search.read.encoding import read_texts

    rows = [("q1", "How do I pay?", "By card.")]
    corpus = write_csv(tmp_path / "faq.csv", rows, ("id", "question", "answer"))
    with pytest.raises(BadInput, match=r"field 'questoin' \(did you mean 'question'\?\)"):
        list(read_texts(str(corpus), text_fields=["questoin"]))
    with pytest.raises(BadInput, match=r"field 'idd' \(did you mean 'id'\?\)"):
        list(read_texts(str(corpus), text_fields=["question"], id_field="idd"))


def test_fields_whose_names_differ_only_in_case_are_two_fields(tmp_path):
    """Nothing is stored, so SQLite's case-insensitive column names do not matter: each name
    reads its own column (an exact match first)."""
    from search.read.encoding import read_texts

    corpus = write_csv(tmp_path / "tt.csv", [("1", "How do I pay?", "By card.")], ("id", "Text", "text"))
    assert list(read_texts(str(corpus))) == [("1", "By card.")]
    assert list(read_texts(str(corpus), text_fields=["Text"])) == [("1", "How do I pay?")]


def test_a_utf16_file_read_in_another_encoding_names_utf16(tmp_path):
    """Not "the header row is not valid UTF-8": the byte order mark says what the file is,
    whichever encoding was asked for."""
    from search.read.encoding import read_texts

    corpus = tmp_path / "faq.tsv"
    corpus.write_bytes("id\ttext\n1\thello\n".encode("utf-16"))
    for asked in ("utf-7", "latin-1", "utf-8"):
        with pytest.raises(BadInput, match=rf"byte order mark \(it is not {asked}\): try --encoding utf-16"):
            list(read_texts(str(corpus), encoding=asked))
    assert list(read_texts(str(corpus), encoding="utf-16")) == [("1", "hello")]


def test_an_output_in_a_folder_that_makes_no_files_says_so(whitened, tmp_path):
    """``/proc`` exists but makes no new file (ENOENT): not "no such folder"."""
    from pathlib import Path

    from search.read.encoding import encode_file

    if not Path("/proc/self").is_dir():
        pytest.skip("needs Linux's /proc")
    source = tmp_path / "texts.txt"
    source.write_text("a bike\n", encoding="utf-8")
    with pytest.raises(BadInput, match=r"^cannot write /proc/x\.npy: /proc takes no new files$"):
        encode_file(str(source), "/proc/x.npy", Encoding.load(index=whitened))
    with pytest.raises(BadInput, match=r"^cannot write /proc/new/x\.npy: /proc takes no new files$"):
        encode_file(str(source), "/proc/new/x.npy", Encoding.load(index=whitened))


def test_a_bad_text_in_a_later_part_is_told_by_its_number(tiny_model):
    """Texts are checked a part ahead of the model: a bad one in the second part
    still stops the encoding with its own number, and no vectors of the parts after it."""
    texts = [f"text {n}" for n in range(PART_TEXTS + 5)]
    texts[PART_TEXTS + 2] = "   "
    parts = Encoding.load(Strategy(model=tiny_model)).parts(iter(texts))
    with pytest.raises(BadInput, match=f"text {PART_TEXTS + 3} is empty"):
        list(parts)


def _encode_cli(*args: object, stdin: str = "a text\nanother text\n"):
    """``semsearch encode ARGS`` in this process (a usage error is told before any model loads)."""
    from click.testing import CliRunner

    from search.cli import cli

    return CliRunner().invoke(cli, ["encode", *map(str, args)], input=stdin)


def _usage_error(result) -> str:
    """The one ``Error:`` line of a usage error (exit 2)."""
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    return errors[0]


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("vectors.txt", "'.txt'"),
        ("vectors.csv", "'.csv'"),
        ("vectors.jsonl.gz", "'.gz'"),
        ("vectors", "no extension"),
    ],
)
def test_an_output_whose_extension_names_no_format_is_a_usage_error(tmp_path, name, said):
    """``-o vectors.txt`` is not JSON lines written under another name: exit 2, one line naming the
    extension and the ones taken, and nothing written."""
    error = _usage_error(_encode_cli("-o", tmp_path / name))
    assert said in error and ".npy" in error and ".jsonl" in error and "--to" in error, error
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("name", "to"), [("vectors.jsonl", "npy"), ("vectors.NPY", "jsonl"), ("v.ndjson", "npy")]
)
def test_an_explicit_format_the_extension_contradicts_is_a_usage_error(tmp_path, name, to):
    error = _usage_error(_encode_cli("-o", tmp_path / name, "--to", to))
    assert f"--to {to}" in error and repr(Path(name).suffix) in error, error
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("output", [(), ("-o", "-")])
def test_npy_to_stdout_is_a_usage_error(tmp_path, output):
    """``--to npy`` with no file (stdout takes JSON lines) is refused as the other contradictions of
    ``-o`` and ``--to`` are: exit 2 and one line, before the model loads."""
    error = _usage_error(_encode_cli(*output, "--to", "npy"))
    assert "needs a file" in error and "-o FILE.npy" in error, error


def test_the_format_follows_a_known_extension_and_an_explicit_one_wins_over_an_unknown(tmp_path, tiny_model):
    model = ("--model", tiny_model)
    for name, to in [("v.npy", None), ("v.NPY", None), ("v.dat", "npy")]:
        result = _encode_cli("-o", tmp_path / name, *model, *(("--to", to) if to else ()))
        assert result.exit_code == 0, result.output
        assert np.load(tmp_path / name).shape[0] == 2
    for name, to in [("v.jsonl", None), ("v.ndjson", None), ("v.txt", "jsonl"), ("v.jsonl", "jsonl")]:
        result = _encode_cli("-o", tmp_path / name, *model, *(("--to", to) if to else ()))
        assert result.exit_code == 0, result.output
        lines = (tmp_path / name).read_text(encoding="utf-8").splitlines()
        assert [json.loads(line)["id"] for line in lines] == ["1", "2"]
    for output in ((), ("-o", "-")):  # stdout: JSON lines
        result = _encode_cli(*output, *model)
        assert result.exit_code == 0, result.output
        assert [json.loads(line)["id"] for line in result.stdout.splitlines()] == ["1", "2"]


def test_the_library_refuses_an_output_it_cannot_name_a_format_for(whitened, tmp_path):
    from search.read.encoding import encode_file

    source = tmp_path / "texts.txt"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    with pytest.raises(BadInput, match=r"'\.txt'"):
        encode_file(str(source), tmp_path / "out.txt", Encoding.load(index=whitened))
    with pytest.raises(BadInput, match="to='npy'"):
        encode_file(str(source), tmp_path / "out.jsonl", Encoding.load(index=whitened), to="npy")
    report = encode_file(str(source), tmp_path / "out.vec", Encoding.load(index=whitened), to="npy")
    assert report.texts == 3 and np.load(tmp_path / "out.vec").shape == (3, 3)
