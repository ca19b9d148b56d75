"""A build streams its corpus: bounded parts embedded and written, every guarantee of a whole-corpus
build kept (rejections with row numbers, duplicate ids across parts, typed fields, the transform
fitted on the whole corpus, the previous index surviving a failure); `info` needs no FAISS."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import indexer.reading.corpus
import indexer.store.writer
import indexer.writing.build
from indexer import Strategy, build_index
from indexer.catalog import Catalog
from indexer.embedding.transform import Transform
from indexer.encoders.factory import encoder_for
from indexer.encoders.tokens import TextTokenizer
from indexer.errors import BadInput, SemsearchError
from indexer.store import CURRENT, DATABASE, TRANSFORM, open_index
from indexer.writing.update import add_to_index
from search import SearchEngine
from tests.helpers import ROOT, assert_clean_failure, run, write_csv

ROWS = [
    ("a1", "How do I reset my password?", ""),
    ("a2", "Which cards do you accept?", ""),
    ("a3", "", "4"),  # empty text: rejected
    ("a4", "Where can I park my bike?", "12"),
    ("a1", "A second row with the first id", "3"),  # duplicate of row 1, two parts later
    ("a5", "Can I take my dog on the train?", "7"),
    ("a6", "What happens if I return the bike late?", "9"),
    ("a7", "Is there a night bus to the airport?", "15"),
]


def corpus(tmp_path: Path, rows=ROWS) -> Path:
    return write_csv(tmp_path / "c.csv", rows, ("id", "text", "stock"))


@pytest.fixture
def small_parts(monkeypatch):
    """Parts of 2 entries and spool reads of 3 vectors: every boundary is crossed."""
    monkeypatch.setattr(indexer.writing.build, "PART_ENTRIES", 2)
    monkeypatch.setattr(indexer.store.writer, "PART_ROWS", 3)


def test_streamed_build_keeps_every_row_check_across_parts(tmp_path, tiny_model, small_parts, monkeypatch):
    calls = []
    embed = indexer.writing.build.embed_entries  # whichever encoder the backend gives, it embeds a part here

    def spy(on, part, also, **options):
        calls.append(len(part))
        return embed(on, part, also, **options)

    monkeypatch.setattr(indexer.writing.build, "embed_entries", spy)
    report = build_index(corpus(tmp_path), tmp_path / "idx", Strategy(model=tiny_model))
    assert calls == [2, 2, 2]  # 6 entries, never more than a part at once
    assert [(r.row, r.reason.split(":")[0]) for r in report.rejected] == [
        (3, "empty text"),
        (5, "duplicate id"),
    ]
    assert "first at row 1" in report.rejected[1].reason
    assert (report.entries, report.vectors) == (6, 6)
    index = open_index(tmp_path / "idx")
    rows = index.rows(range(1, 7))
    assert [rows[r]["_id"] for r in range(1, 7)] == ["a1", "a2", "a4", "a5", "a6", "a7"]
    # typed from the whole corpus: the first part's stock cells are empty, the later ones numbers
    assert index.catalog.field_types()["stock"] == "integer" and rows[3]["stock"] == 12
    assert rows[1]["stock"] is None
    assert index.meta["source"]["rows"] == 8 and index.meta["source"]["rejected"] == 2
    texts = [rows[r]["_text"] for r in range(1, 7)]
    expected = encoder_for(Strategy(model=tiny_model)).embed(texts)
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    vectors, ids = index.vectors.stored()
    stored = vectors[np.argsort(ids)]
    assert sorted(ids.tolist()) == [1, 2, 3, 4, 5, 6]
    np.testing.assert_allclose(stored, expected, atol=1e-5)
    assert not [p for p in index.version.iterdir() if p.name.startswith(".")]  # no spool left


def test_whitening_is_fitted_on_the_whole_corpus_from_parts(tmp_path, tiny_model, small_parts):
    strategy = Strategy(model=tiny_model, postprocess="whiten", whiten_dims=4)
    report = build_index(corpus(tmp_path), tmp_path / "idx", strategy)
    index = open_index(tmp_path / "idx")
    texts = [index.rows([r])[r]["_text"] for r in range(1, 7)]
    raw = encoder_for(strategy).embed(texts)
    whole = Transform.fit("whiten", raw, 4)
    stored = Transform.load(index.version / TRANSFORM)
    np.testing.assert_allclose(stored.mean, whole.mean, atol=1e-5)
    np.testing.assert_allclose(np.abs(stored.matrix), np.abs(whole.matrix), atol=1e-3)
    assert report.dimension == 4 and index.vectors.dimension == 4


def test_transform_fitted_on_parts_equals_one_fit():
    rng = np.random.default_rng(0)
    vectors = (rng.normal(size=(500, 8)) * 0.05 + 0.5).astype(np.float32)  # a large common mean
    parts = [vectors[:1], vectors[1:200], vectors[200:200], vectors[200:]]
    for kind in ("center", "whiten"):
        one, many = Transform.fit(kind, vectors), Transform.fit_parts(kind, iter(parts))
        np.testing.assert_allclose(many.apply(vectors), one.apply(vectors), atol=1e-5)
    with pytest.raises(BadInput, match="at least 2"):
        Transform.fit_parts("center", [vectors[:1], vectors[:0]])


def test_failure_in_a_later_part_leaves_the_previous_index(tmp_path, tiny_model, small_parts, monkeypatch):
    build_index(corpus(tmp_path, ROWS[:2]), tmp_path / "idx", Strategy(model=tiny_model))
    before = (tmp_path / "idx" / CURRENT).read_text()
    calls = []
    embed = indexer.writing.build.embed_entries

    def fails_on_the_third_part(on, part, also, **options):
        calls.append(len(part))
        if len(calls) == 3:
            raise MemoryError("out of memory in the third part")
        return embed(on, part, also)

    monkeypatch.setattr(indexer.writing.build, "embed_entries", fails_on_the_third_part)
    with pytest.raises(MemoryError):
        build_index(corpus(tmp_path), tmp_path / "idx", Strategy(model=tiny_model))
    assert (tmp_path / "idx" / CURRENT).read_text() == before
    assert [p.name for p in (tmp_path / "idx").iterdir() if p.name.startswith("v-")] == [before.strip()]
    assert SearchEngine(tmp_path / "idx").search("cards", k=1)[0].id in ("a1", "a2")


def test_corpus_changed_during_the_build_is_an_error(tmp_path, tiny_model, small_parts, monkeypatch):
    """Rows appended before the second read that retyped columns need: the build stops, the
    previous index stays."""
    path = corpus(tmp_path)
    build_index(path, tmp_path / "idx", Strategy(model=tiny_model))
    before = (tmp_path / "idx" / CURRENT).read_text()
    settle = indexer.store.writer.VersionWriter.settle

    def append_a_row_then_settle(*args, **kwargs):
        with path.open("a", encoding="utf-8") as f:
            f.write("a9,a row written while indexing,1\n")
        return settle(*args, **kwargs)

    monkeypatch.setattr(indexer.store.writer.VersionWriter, "settle", append_a_row_then_settle)
    with pytest.raises(BadInput, match="changed while it was being indexed"):
        build_index(path, tmp_path / "idx", Strategy(model=tiny_model))
    assert (tmp_path / "idx" / CURRENT).read_text() == before
    assert open_index(tmp_path / "idx").meta["count"] == 6


def test_ivf_index_built_from_parts(tmp_path, tiny_model, monkeypatch):
    """Above the exact limit the index is IVF, trained on a sample read from the spool; info
    shows its kind and probes from the meta, as FAISS has them."""
    monkeypatch.setattr(indexer.writing.build, "PART_ENTRIES", 300)
    monkeypatch.setattr(indexer.store.writer, "PART_ROWS", 700)
    monkeypatch.setattr("indexer.vectors.factory.EXACT_LIMIT", 1000)
    path = tmp_path / "c.txt"
    path.write_text("\n".join(f"line {i} about bikes, trains and {i % 37} dogs" for i in range(2000)))
    build_index(path, tmp_path / "idx", Strategy(model=tiny_model))
    index = open_index(tmp_path / "idx")
    assert index.vectors.count == 2000 and index.meta["vector_kind"] == "ivf"
    assert index.meta["nprobe"] == index.vectors.nprobe
    info = open_index(tmp_path / "idx", vectors=False).info()
    assert (info["index_kind"], info["nprobe"], info["vectors"]) == ("ivf", index.vectors.nprobe, 2000)
    assert SearchEngine(tmp_path / "idx").search("line 17 about bikes", k=1)


@pytest.mark.slow
def test_info_imports_no_faiss(tmp_path, tiny_model):
    build_index(corpus(tmp_path), tmp_path / "idx", Strategy(model=tiny_model))
    code = (
        "import sys; from search.cli import cli\n"
        "try:\n    cli(['info', sys.argv[1], '--json'])\n"
        "except SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('faiss', 'torch')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "idx")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    info, modules = result.stdout.splitlines()
    assert json.loads(info)["entries"] == 6 and json.loads(info)["index_kind"] == "flat"
    assert modules == "[]"


def test_info_of_an_index_written_before_the_kind_was_in_meta(tmp_path, tiny_model):
    build_index(corpus(tmp_path), tmp_path / "idx", Strategy(model=tiny_model))
    version = open_index(tmp_path / "idx").version
    catalog = Catalog(version / DATABASE, readonly=False)
    catalog.db.execute("delete from meta where key in ('vector_kind', 'nprobe')")
    catalog.commit()
    catalog.close()
    info = open_index(tmp_path / "idx", vectors=False).info()
    assert info["index_kind"] == "flat" and info["entries"] == 6


def test_info_detects_a_vector_file_that_does_not_match(tmp_path, tiny_model):
    build_index(corpus(tmp_path), tmp_path / "idx", Strategy(model=tiny_model))
    version = open_index(tmp_path / "idx").version
    (version / "vectors.faiss").write_bytes(b"IxMp")
    with pytest.raises(SemsearchError, match="cannot read vectors.faiss"):
        open_index(tmp_path / "idx", vectors=False)
    (version / "vectors.faiss").write_bytes(b"IxMp" + (32).to_bytes(4, "little") + (5).to_bytes(8, "little"))
    with pytest.raises(SemsearchError, match="vectors.faiss: it has 16 bytes"):  # the size recorded at commit
        open_index(tmp_path / "idx", vectors=False)
    import sqlite3

    with sqlite3.connect(version / DATABASE) as db:  # as an index written before sizes were recorded
        db.execute("delete from meta where key = 'files'")
    with pytest.raises(SemsearchError, match="6 entries and 5 vectors"):  # the header's count
        open_index(tmp_path / "idx", vectors=False)


def test_a_corpus_is_read_once_unless_a_later_part_retypes_a_column(tmp_path, tiny_model, monkeypatch):
    """Columns typed by the first part as the whole corpus types them: the file is read once, in
    parts. Where a later part retypes one (``stock``, empty in a first part of two entries, then
    numbers), the rows are written again from a second read, typed by the whole corpus."""
    reads = []
    parse = indexer.reading.corpus.parse_rows

    def counted(*args, **kwargs):
        reads.append(1)
        return parse(*args, **kwargs)

    monkeypatch.setattr(indexer.reading.corpus, "parse_rows", counted)
    for size, expected_reads in ((4, 1), (2, 2)):
        reads.clear()
        monkeypatch.setattr(indexer.writing.build, "PART_ENTRIES", size)
        report = build_index(corpus(tmp_path), tmp_path / "idx", Strategy(model=tiny_model))
        assert len(reads) == expected_reads and report.entries == 6
        index = open_index(tmp_path / "idx")
        rows = index.rows(range(1, 7))
        assert [rows[r]["_id"] for r in range(1, 7)] == ["a1", "a2", "a4", "a5", "a6", "a7"]
        assert index.catalog.field_types()["stock"] == "integer" and rows[3]["stock"] == 12


def test_a_build_fills_its_keyword_table_once_and_keeps_it_exact_after(tmp_path, tiny_model, monkeypatch):
    """A new version's SQLite file is synced by the store, not by SQLite at every statement, and its
    keyword table is filled from the rows at the commit: the same table and triggers as row by row."""
    synchronous = []
    create = Catalog.create

    def spied(*args, **kwargs):
        catalog = create(*args, **kwargs)
        synchronous.append(catalog.db.execute("pragma synchronous").fetchone()[0])
        return catalog

    monkeypatch.setattr(Catalog, "create", spied)
    build_index(corpus(tmp_path), tmp_path / "idx", Strategy(model=tiny_model))
    assert synchronous == [0]  # off
    catalog = open_index(tmp_path / "idx").catalog
    assert catalog.keyword_coverage() == ([], [])  # the schema of a table kept row by row
    assert [rowid for rowid, *_ in catalog.keyword_search("bike", 5)] == [3, 5]
    add_to_index(tmp_path / "idx", write_csv(tmp_path / "u.csv", [("n1", "a bike for rent", "1")]))
    catalog = open_index(tmp_path / "idx").catalog
    assert sorted(rowid for rowid, *_ in catalog.keyword_search("bike", 5)) == [3, 5, 7]  # the triggers'


def test_an_error_in_the_writing_stage_stops_every_stage(tmp_path, tiny_model, small_parts, monkeypatch):
    """A part that cannot be written stops the reading and embedding too: the error is raised as
    it was raised, no stage's thread is left behind, the previous index stays."""
    build_index(corpus(tmp_path, ROWS[:2]), tmp_path / "idx", Strategy(model=tiny_model))
    before = (tmp_path / "idx" / CURRENT).read_text()
    threads = threading.active_count()
    put = indexer.store.writer.VersionWriter.put_entries

    def fails_on_the_second_part(self, entries, chunks):
        if self.entries:
            raise BadInput("disk full on the second part")
        return put(self, entries, chunks)

    monkeypatch.setattr(indexer.store.writer.VersionWriter, "put_entries", fails_on_the_second_part)
    with pytest.raises(BadInput, match="disk full on the second part"):
        build_index(corpus(tmp_path), tmp_path / "idx", Strategy(model=tiny_model))
    assert threading.active_count() == threads
    assert (tmp_path / "idx" / CURRENT).read_text() == before
    assert open_index(tmp_path / "idx").meta["count"] == 2


def test_each_part_is_tokenised_once_on_a_stage_of_its_own(tmp_path, tiny_model, small_parts, monkeypatch):
    """The Rust tokenizer's batch call releases the GIL: a build tokenises the next part on a
    stage of its own while the network embeds this one (on torch and ONNX Runtime alike), never
    on the thread that runs the network."""
    calls = []
    documents = TextTokenizer.documents

    def spy(self, texts):
        calls.append((threading.current_thread().name, len(texts)))
        return documents(self, texts)

    monkeypatch.setattr(TextTokenizer, "documents", spy)
    for backend in ("torch", "onnx"):
        calls.clear()
        build_index(corpus(tmp_path), tmp_path / backend, Strategy(model=tiny_model, backend=backend))
        assert calls == [("tokenise", 2)] * 3, backend  # 6 entries in parts of 2


def test_a_text_without_tokens_in_a_later_part_stops_every_stage(tmp_path, tiny_model, small_parts):
    """A text the tokenizer makes nothing of, found on the tokenising stage two parts in, is the
    build's one error: no stage's thread is left behind, the previous index stays."""
    build_index(corpus(tmp_path, ROWS[:2]), tmp_path / "idx", Strategy(model=tiny_model))
    before = (tmp_path / "idx" / CURRENT).read_text()
    threads = threading.active_count()
    path = write_csv(tmp_path / "z.csv", [*ROWS, ("z1", "[SEP]", "1")], ("id", "text", "stock"))
    with pytest.raises(BadInput, match="no tokens the model reads"):
        build_index(path, tmp_path / "idx", Strategy(model=tiny_model))
    assert threading.active_count() == threads
    assert (tmp_path / "idx" / CURRENT).read_text() == before


@pytest.mark.slow
def test_an_error_in_the_reading_stage_is_a_one_line_error(tmp_path, tiny_model):
    """A corpus found wrong by its reading stage (here at its end: no row has the text field) is
    the command's one-line error, raised on the pipeline's thread, with no index written."""
    path = write_csv(tmp_path / "c.csv", [(f"q{i}", f"question {i}") for i in range(50)], ("id", "question"))
    threads = threading.active_count()
    with pytest.raises(BadInput, match="has field 'text'"):
        build_index(path, tmp_path / "idx", Strategy(model=tiny_model))
    assert threading.active_count() == threads and not (tmp_path / "idx").exists()
    result = run("index", path, "-o", tmp_path / "idx", "--model", tiny_model)
    assert_clean_failure(result, "has field 'text'")
    assert not (tmp_path / "idx").exists()


@pytest.mark.parametrize("also", [None, ("note",)], ids=["text", "also"])
def test_an_add_embeds_part_by_part_as_one_call_would(tmp_path, tiny_model, small_parts, also):
    """An add's texts are embedded in parts, each tokenised beside the one before: the same
    vectors, owners and also-flags as one call over them all."""
    from indexer.embedding.fields import FieldScoring, embed_entries
    from indexer.progress import Progress
    from indexer.reading.corpus import Entry
    from indexer.writing.build import embed_parts

    scoring = FieldScoring.given(list(also)) if also else None
    entries = [
        Entry(f"e{i}", f"text number {i} " + "word " * (i % 5), {"note": f"note {i % 4}"}) for i in range(9)
    ]
    encoder = encoder_for(Strategy(model=tiny_model))
    with Progress(len(entries), "embedding", enabled=False) as bar:
        parted = embed_parts(encoder, entries, scoring, bar)
    whole = embed_entries(encoder, entries, scoring)
    order, again = np.lexsort((parted[2], parted[1])), np.lexsort((whole[2], whole[1]))
    np.testing.assert_array_equal(parted[1][order], whole[1][again])
    np.testing.assert_array_equal(parted[2][order], whole[2][again])
    np.testing.assert_allclose(parted[0][order], whole[0][again], atol=1e-6)


def test_an_add_in_parts_finds_each_added_text_first(tmp_path, tiny_model, small_parts):
    """The vectors of an add embedded part by part are stored under their own entries."""
    build_index(corpus(tmp_path), tmp_path / "idx", Strategy(model=tiny_model))
    added = [(f"n{i}", f"an added text number {i} " + "word " * (i % 4), str(i)) for i in range(9)]
    add_to_index(tmp_path / "idx", write_csv(tmp_path / "u.csv", added, ("id", "text", "stock")))
    with SearchEngine(tmp_path / "idx") as engine:
        for key, text, _ in added:
            assert engine.search(text, k=1, mode="dense")[0].id == key
