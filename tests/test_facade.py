"""``import semsearch``: the facade hands on the library's own names, and ``build_index``/``add``
take rows given in Python (dicts, strings, a pandas DataFrame) as well as a file, and ``also=`` a
list of field names."""

from __future__ import annotations

import gc
import math
from datetime import datetime
from importlib import import_module
from pathlib import Path

import numpy as np
import pytest

import semsearch
from indexer.errors import BadInput
from indexer.reading.corpus import CorpusReader, Entry, Rejection
from indexer.store import open_index
from tests.helpers import ROWS, write_csv

FAQ = [
    {"id": "a1", "question": "How do I pay for a ride?", "answer": "With a card in the app.", "price": 2},
    {"id": "a2", "question": "Where can I park the bike?", "answer": "At any station.", "price": 0},
    {"id": "a3", "question": "Can I get a refund?", "answer": "Within 14 days.", "price": 1.5},
]


def read(rows) -> list[Entry | Rejection]:
    return list(CorpusReader(rows, text_fields=["question"]))


def test_every_name_is_the_library_object_and_says_what_it_is_for():
    assert len(semsearch.__all__) == len(set(semsearch.__all__))
    for name in semsearch.__all__:
        value = getattr(semsearch, name)
        module, attr = semsearch._SOURCES[name].split(":")
        assert value is getattr(import_module(module), attr), name
        assert module.split(".")[0] in ("indexer", "search"), name
        assert (value.__doc__ or "").strip(), f"{name} has no docstring"
    assert {"Strategy", "build_index", "add", "delete", "SearchEngine", "rank_similar"} <= set(dir(semsearch))
    assert semsearch.SearchEngine.search.__doc__
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        semsearch.nothing  # noqa: B018


def test_every_error_kind_the_errors_page_names_is_a_name_of_semsearch():
    """docs/errors.md names the kinds a caller catches as ``semsearch.<Kind>``: each one is there,
    the class the library raises."""
    from indexer import errors

    for kind in (
        "SemsearchError",
        "BadInput",
        "FilterError",
        "StrategyConflict",
        "IndexLocked",
        "IndexMoved",
        "IndexDamaged",
        "DiskFull",
        "ModelFailed",
        "WorkerFailed",
    ):
        assert getattr(semsearch, kind) is getattr(errors, kind), kind
        assert issubclass(getattr(semsearch, kind), errors.SemsearchError), kind


def test_rows_are_read_as_the_same_rows_of_a_file_are():
    from_rows = read(FAQ)
    reader = CorpusReader(FAQ)
    path = reader.path
    assert path.exists()
    del reader
    gc.collect()
    assert not path.exists()  # the spool goes with its reader
    assert [e.id for e in from_rows] == ["a1", "a2", "a3"]
    assert from_rows[0] == Entry("a1", "How do I pay for a ride?", FAQ[0])
    # a plain string is a text row, as a line of a text file is; an unusable row is reported by number
    assert list(CorpusReader(["How do I pay?", {"text": ""}])) == [
        Entry("1", "How do I pay?", {"text": "How do I pay?"}),
        Rejection(2, "empty text"),
    ]


def test_a_dataframe_gives_plain_values_and_missing_cells_are_missing():
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame(
        {
            "id": np.array([7, 8], dtype=np.int64),
            "question": ["How do I pay?", "Where do I park?"],
            "price": [2.5, math.nan],
            "since": [pd.Timestamp("2024-05-01"), pd.NaT],
            "tag": pd.array(["a", pd.NA], dtype="string"),
        }
    )
    first, second = read(frame)
    assert first == Entry(
        "7",
        "How do I pay?",
        {"id": 7, "question": "How do I pay?", "price": 2.5, "since": "2024-05-01T00:00:00", "tag": "a"},
    )
    assert second.fields == {
        "id": 8,
        "question": "Where do I park?",
        "price": None,
        "since": None,
        "tag": None,
    }


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"question": "q", "when": object()}], "row 1: field 'when' holds a object"),
        ([{"question": "q"}, 42], "row 2 is a int: give dicts (field -> value) or strings"),
        ([], "empty corpus: no usable rows in the rows given"),
        # before: UnicodeEncodeError from writing the spool
        ([{"question": "q"}, {"question": "bad \ud800"}], "row 2: field 'question' is not valid UTF-8 text"),
        ([{"question": "q", "f\udcff": 1}], "row 1: field 'f\\udcff' is not valid UTF-8 text"),
        ([{"answer": "a"}], "no row of the rows given has field 'question'"),
        # before: a TypeError, and bytes read as rows of ints
        (None, "corpus: give a file's path or rows (dicts, strings, a DataFrame), not NoneType"),
        (b"faq.csv", "corpus: give a file's path or rows (dicts, strings, a DataFrame), not bytes"),
    ],
)
def test_rows_that_cannot_be_used_are_one_clear_error(rows, message):
    with pytest.raises(BadInput) as caught:
        read(rows)
    assert message in str(caught.value)
    assert "/tmp" not in str(caught.value) and ".jsonl" not in str(caught.value)


@pytest.fixture(scope="module")
def from_file(tmp_path_factory, tiny_model) -> Path:
    directory = tmp_path_factory.mktemp("from-file")
    corpus = write_csv(directory / "faq.csv", ROWS)
    semsearch.build_index(corpus, directory / "idx", semsearch.Strategy(model=tiny_model))
    return directory / "idx"


def entries(index_dir: Path) -> list[tuple]:
    return list(open_index(index_dir).db.execute("select _id, _text, category from entries order by _id"))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["list", "generator", "dataframe"])
def test_an_index_built_from_rows_is_the_index_built_from_their_file(tmp_path, tiny_model, from_file, kind):
    dicts = [{"id": i, "text": t, "category": c} for i, t, c in ROWS]
    rows = {"list": dicts, "generator": (d for d in dicts), "dataframe": None}[kind]
    if kind == "dataframe":
        rows = pytest.importorskip("pandas").DataFrame(dicts)
    report = semsearch.build_index(rows, tmp_path / "idx", semsearch.Strategy(model=tiny_model))
    assert report.entries == len(ROWS)
    assert entries(tmp_path / "idx") == entries(from_file)
    assert open_index(tmp_path / "idx").info()["source"] == "rows given in Python"
    ours = semsearch.SearchEngine(tmp_path / "idx").search("paying for a ride", k=4)
    theirs = semsearch.SearchEngine(from_file).search("paying for a ride", k=4)
    assert [(h.id, round(h.score, 5)) for h in ours] == [(h.id, round(h.score, 5)) for h in theirs]


@pytest.mark.slow
def test_add_and_delete_take_rows_too(tmp_path, tiny_model):
    index_dir = tmp_path / "idx"
    semsearch.build_index(
        [{"id": i, "text": t, "category": c} for i, t, c in ROWS],
        index_dir,
        semsearch.Strategy(model=tiny_model),
    )
    report = semsearch.add(
        index_dir,
        [
            {"id": "a5", "text": "Do you rent helmets?", "category": "safety"},
            {"id": "a1", "text": "How do I pay for a ride?", "category": "money"},
        ],
    )
    assert (report.added, report.updated) == (1, 1)
    semsearch.delete(index_dir, ["a2"])
    assert [row[0] for row in entries(index_dir)] == ["a1", "a3", "a4", "a5"]
    assert dict((row[0], row[2]) for row in entries(index_dir))["a1"] == "money"


@pytest.mark.slow
@pytest.mark.parametrize("also", [["question", "answer"], ("question", "answer"), "question,answer"])
def test_also_takes_field_names(tmp_path, tiny_model, also):
    # before: a list of names ended in AttributeError: 'list' object has no attribute 'to_dict'
    semsearch.build_index(
        FAQ, tmp_path / "idx", semsearch.Strategy(model=tiny_model), text_fields=["question"], also=also
    )
    assert open_index(tmp_path / "idx").info()["also"] == {"fields": ["question", "answer"], "weight": 0.7}
    assert semsearch.SearchEngine(tmp_path / "idx").search("refund", k=1)[0].id


@pytest.mark.slow
def test_also_with_a_field_no_row_has_is_bad_input(tmp_path, tiny_model):
    with pytest.raises(BadInput, match="answr"):
        semsearch.build_index(
            FAQ,
            tmp_path / "idx",
            semsearch.Strategy(model=tiny_model),
            text_fields=["question"],
            also=["question", "answr"],
        )
    assert not (tmp_path / "idx").exists()


def test_a_built_corpus_at_a_given_time_keeps_timestamps_as_text():
    (entry,) = read([{"question": "q", "at": datetime(2024, 1, 2, 3, 4, 5)}])
    assert entry.fields["at"] == "2024-01-02T03:04:05"


@pytest.mark.slow
def test_importing_semsearch_costs_nothing_and_searching_needs_no_torch():
    import subprocess
    import sys

    probe = (
        "import sys, semsearch\n"
        "print(sorted(m for m in ('numpy', 'faiss', 'torch', 'search.read.engine') if m in sys.modules))\n"
        "semsearch.SearchEngine, semsearch.build_index, semsearch.add\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[]", "[]"]


@pytest.mark.parametrize(
    ("candidates", "k", "message"),
    [
        # before: a string was ranked character by character, None ended in a TypeError, and
        # k=-1 dropped the last hit (a slice from the end) while k=0 returned them all
        ("A dog runs.", None, "candidates: give a list of strings, not one string (wrap it: [text])"),
        (["A dog runs.", None], None, "sentence 2 is not text but NoneType"),
        (["A dog runs.", "A cat."], -1, "k must be at least 1, not -1"),
        (["A dog runs.", "A cat."], 0, "k must be at least 1, not 0"),
        (["A dog runs.", "A cat."], "1", "k must be a whole number, not '1'"),
    ],
)
def test_ranking_what_is_not_a_list_of_sentences_or_a_k_is_one_line(candidates, k, message, tiny_model):
    with pytest.raises(BadInput) as caught:
        semsearch.rank_similar("A man plays guitar.", candidates, semsearch.Strategy(model=tiny_model), k=k)
    assert message in str(caught.value)


def test_text_fields_as_one_string_are_names_as_on_the_command_line_and_a_stray_keyword_says_so():
    from indexer.reading.corpus import CorpusOptions

    # before: "question" was read as the fields 'q', 'u', 'e'..., 5 and model= were TypeErrors
    # (model= naming CorpusOptions.__init__, which the caller never called)
    assert CorpusOptions.of(text_fields="question").text_fields == ("question",)
    assert CorpusOptions.of(text_fields="question, answer").text_fields == ("question", "answer")
    with pytest.raises(BadInput, match="text fields: give field names, not int"):
        CorpusOptions.of(text_fields=5)
    with pytest.raises(BadInput, match=r"unknown option 'model': .*Strategy\(model=...\)"):
        CorpusOptions.of(model="x")
    assert read([{"question": "q"}]) == list(CorpusReader([{"question": "q"}], text_fields="question"))


@pytest.mark.parametrize("where", [None, 5, ["idx"]])
def test_an_engine_of_no_folder_is_one_line_naming_what_it_takes(where):
    said = r"^index_dir: give the path of an index folder \(a str or Path\), not "
    with pytest.raises(BadInput, match=said + type(where).__name__):
        semsearch.SearchEngine(where)


@pytest.mark.parametrize("ids", [[], ["", "  "]])
def test_a_delete_of_no_ids_says_so_in_python_terms_and_the_cli_in_its_own(tmp_path, ids):
    from click.testing import CliRunner

    from search.cli import cli

    with pytest.raises(BadInput, match=r"^no ids given to delete$"):
        semsearch.delete(tmp_path / "idx", ids)
    said = CliRunner().invoke(cli, ["delete", str(tmp_path / "idx"), *(f"--id={i}" for i in ids)])
    assert said.exit_code == 1, said.output
    assert "no ids to delete: give --id ID or --ids-file FILE" in said.output, said.output
