"""The index on disk: round trip, FAISS ids = SQLite rows, chunked documents, the atomic swap,
runs killed mid-way, and damage detected at load."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from indexer import Strategy, build_index
from indexer.errors import SemsearchError
from indexer.store import CURRENT, DATABASE, VECTORS, open_index
from search import SearchEngine
from tests.helpers import kill_during, whole_run

TEXTS = [
    "How do I reset my password?",
    "Which cards do you accept?",
    "Where can I park my bike?",
    "Can I take my dog on the train?",
    "What happens if I return the bike late?",
]


def faq(tmp_path: Path, texts=TEXTS, name="faq.csv") -> Path:
    lines = ["id,question,category"] + [f'k{i},"{t}",cat{i % 2}' for i, t in enumerate(texts)]
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_round_trip(tmp_path, tiny_model):
    strategy = Strategy(model=tiny_model, layers=(-4, -3, -2, -1), combine="sum", pooling="mean-max")
    report = build_index(faq(tmp_path), tmp_path / "idx", strategy, text_fields=["question"])
    assert (report.entries, report.vectors, report.dimension) == (5, 5, 64)
    index = open_index(tmp_path / "idx")
    assert index.strategy == report.strategy and index.strategy.max_length == 128
    assert index.meta["count"] == 5 and index.vectors.count == 5
    # FAISS ids are the SQLite row ids: each stored vector maps to its own row's text
    rows = index.rows([1, 2, 3, 4, 5])
    assert [rows[i]["_text"] for i in range(1, 6)] == TEXTS
    engine = SearchEngine(tmp_path / "idx")
    for i, text in enumerate(TEXTS):
        top = engine.search(text, k=3, mode="dense")[0]  # the cosine of a text to itself
        assert (top.id, top.text, top.fields["category"]) == (f"k{i}", text, f"cat{i % 2}")
        assert top.score == pytest.approx(1.0, abs=1e-4)
    hits = engine.search("password", k=10)
    assert [h.rank for h in hits] == [1, 2, 3, 4, 5]
    assert all(a.score >= b.score for a, b in zip(hits, hits[1:], strict=False))


def test_chunked_document_is_one_hit_scored_by_best_window(tmp_path, tiny_model):
    long_doc = " ".join(["filler words about nothing in particular"] * 40) + " " + TEXTS[0]
    path = tmp_path / "docs.jsonl"
    docs = [{"id": "long", "text": long_doc}] + [{"id": f"s{i}", "text": t} for i, t in enumerate(TEXTS[1:])]
    path.write_text("\n".join(json.dumps(d) for d in docs), encoding="utf-8")
    strategy = Strategy(model=tiny_model, max_length=32, chunk_overlap=8)
    report = build_index(path, tmp_path / "idx", strategy)
    assert report.entries == 5 and report.vectors > 5
    engine = SearchEngine(tmp_path / "idx")
    hits = engine.search("filler words about nothing", k=5)
    assert [h.id for h in hits].count("long") == 1 and len(hits) == 5
    assert engine.index.rows([1])[1]["_chunks"] == report.vectors - 4


def test_failed_rebuild_leaves_previous_index_answering(tmp_path, tiny_model):
    strategy = Strategy(model=tiny_model)
    build_index(faq(tmp_path), tmp_path / "idx", strategy, text_fields=["question"])
    before = (tmp_path / "idx" / CURRENT).read_text()
    empty = tmp_path / "empty.csv"
    empty.write_text("id,question\n1,\n", encoding="utf-8")
    with pytest.raises(SemsearchError, match="empty corpus"):
        build_index(empty, tmp_path / "idx", strategy, text_fields=["question"])
    with pytest.raises(SemsearchError, match="out of range"):
        build_index(
            faq(tmp_path), tmp_path / "idx", Strategy(model=tiny_model, layers=(9,)), text_fields=["question"]
        )
    assert (tmp_path / "idx" / CURRENT).read_text() == before
    assert SearchEngine(tmp_path / "idx").search(TEXTS[1], k=1)[0].id == "k1"
    assert len([p for p in (tmp_path / "idx").iterdir() if p.name.startswith("v-")]) == 1


def test_refuses_to_overwrite_a_directory_that_is_not_an_index(tmp_path, tiny_model):
    target = tmp_path / "precious"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    with pytest.raises(SemsearchError, match="refusing to overwrite"):
        build_index(faq(tmp_path), target, Strategy(model=tiny_model), text_fields=["question"])
    assert (target / "notes.txt").read_text() == "keep me"


@pytest.mark.slow
def test_run_killed_at_any_point_leaves_last_complete_index(tmp_path, tiny_model):
    """SIGKILL a real `semsearch index` at several points: the old index always loads and answers."""
    build_index(faq(tmp_path), tmp_path / "idx", Strategy(model=tiny_model), text_fields=["question"])
    big = tmp_path / "big.txt"
    big.write_text("\n".join(f"sentence number {i} about bikes and parking" for i in range(30000)))
    command = ["index", str(big), "-o", str(tmp_path / "idx"), "--model", tiny_model, "--format", "text"]
    took = whole_run([*command[:2], "-o", str(tmp_path / "measured"), *command[4:]])
    killed = 0
    for when in (*(took * share for share in (0.2, 0.4, 0.6, 0.8)), "writing"):
        killed += kill_during(command, tmp_path / "idx", when)
        index = open_index(tmp_path / "idx")
        assert index.meta["count"] in (5, 30000)
        assert SearchEngine(tmp_path / "idx").search("bikes", k=1)
    assert killed >= 3


def test_damaged_index_is_detected_at_load(tmp_path, tiny_model):
    build_index(faq(tmp_path), tmp_path / "idx", Strategy(model=tiny_model), text_fields=["question"])
    version = open_index(tmp_path / "idx").version
    with pytest.raises(SemsearchError, match="no index"):
        open_index(tmp_path / "nowhere")
    with pytest.raises(SemsearchError, match="not a semsearch index"):
        open_index(tmp_path)
    vectors = (version / VECTORS).read_bytes()
    (version / VECTORS).write_bytes(vectors[: len(vectors) // 2])
    with pytest.raises(SemsearchError, match="cannot read vectors.faiss"):
        open_index(tmp_path / "idx")
    (version / VECTORS).write_bytes(vectors)
    with sqlite3.connect(version / DATABASE) as db:
        db.execute("delete from entries where _rowid = 1")
    with pytest.raises(SemsearchError, match="4 entries and 5 vectors"):
        open_index(tmp_path / "idx")
    with sqlite3.connect(version / DATABASE) as db:
        db.execute("update meta set value = '99' where key = 'format_version'")
    with pytest.raises(SemsearchError, match="format version 99"):
        open_index(tmp_path / "idx")
    (version / DATABASE).write_bytes(b"garbage" * 100)
    with pytest.raises(SemsearchError, match="cannot read meta.db"):
        open_index(tmp_path / "idx")


def test_query_side_refuses_another_strategy(tmp_path, tiny_model):
    build_index(faq(tmp_path), tmp_path / "idx", Strategy(model=tiny_model), text_fields=["question"])
    with pytest.raises(SemsearchError, match="built with .*layers=-2"):
        SearchEngine(tmp_path / "idx", strategy={"layers": (-1,)})
    engine = SearchEngine(tmp_path / "idx", strategy={"layers": (-2,), "pooling": "mean"})
    with pytest.raises(SemsearchError, match="empty query"):
        engine.search("   ")
    assert np.isfinite([h.score for h in engine.search("bike", k=2)]).all()
