"""Keeping an index alive: upserts, deletes, stable ids, filters before the search, the writer
lock, SIGKILL during add/delete, and a corpus of bad rows whose counts add up."""

from __future__ import annotations

import functools
import io
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from indexer import Strategy, build_index
from indexer.errors import SemsearchError
from indexer.reading.corpus import read_corpus
from indexer.store import open_index, writer_lock
from indexer.writing.update import add_to_index, compact_index, delete_from_index
from search import SearchEngine
from tests.helpers import (
    BASE,
    assert_keywords_exact,
    base_index,
    kill_during,
    leave_hot_journal,
    rowids,
    whole_run,
    write_csv,
)


@pytest.fixture
def index(tmp_path, tiny_model, built_once) -> Path:
    write_csv(tmp_path / "base.csv", BASE)
    return built_once("base flat", functools.partial(base_index, model=tiny_model), tmp_path / "idx")


def faiss_ids(index_dir: Path) -> set[int]:
    """The ids of the live vectors (base and segments, minus what tombstones hide)."""
    return set(open_index(index_dir).vectors.stored()[1].tolist())


def test_upsert_counts_and_stable_ids(index, tmp_path):
    before = rowids(index)
    update = [
        ("e0", BASE[0][1], "bikes"),  # unchanged
        ("e1", "a completely new text", "billing"),  # text changed: embedded again
        ("e2", BASE[2][1], "moved"),  # only metadata changed
        ("n1", "a brand new entry", "app"),
        ("n2", "", "app"),
    ]  # new; empty text rejected
    report = add_to_index(index, write_csv(tmp_path / "u.csv", update))
    assert (report.added, report.updated, report.unchanged, len(report.rejected)) == (1, 2, 1, 1)
    assert report.count == len(BASE) + 1
    after = rowids(index)
    assert all(after[k] == v for k, v in before.items())  # ids never shift
    assert after["n1"] == max(before.values()) + 1
    engine = SearchEngine(index)
    top = engine.search("a completely new text", k=1)[0]
    assert (top.id, top.score) == ("e1", pytest.approx(1.0, abs=1e-4))
    assert engine.search(BASE[2][1], k=1)[0].fields["category"] == "moved"
    assert faiss_ids(index) == set(after.values())  # one vector per entry, none left over
    again = add_to_index(index, write_csv(tmp_path / "u.csv", update))
    assert (again.added, again.updated, again.unchanged) == (0, 0, 4)


def test_delete_removes_rows_and_vectors_and_ids_are_not_reused(index, tmp_path):
    before = rowids(index)
    report = delete_from_index(index, ["e3", "e5", "missing"])
    assert (report.deleted, report.not_found, report.count) == (2, ["missing"], len(BASE) - 2)
    after = rowids(index)
    assert "e3" not in after and faiss_ids(index) == set(after.values())
    assert {h.id for h in SearchEngine(index).search(BASE[3][1], k=len(BASE))} == set(after)  # not e3, e5
    add_to_index(index, write_csv(tmp_path / "n.csv", [("e3", "back again", "app")]))
    assert rowids(index)["e3"] > max(before.values())
    size = compact_index(index)
    assert size > 0 and open_index(index).meta["count"] == len(BASE) - 1
    with pytest.raises(SemsearchError, match="no ids"):
        delete_from_index(index, [])


@pytest.mark.parametrize(("ids", "said"), [("e3", "not one string (wrap it: [id])"), (None, "not NoneType")])
def test_delete_of_one_string_or_no_list_is_refused_and_deletes_nothing(index, ids, said):
    # before: "e3" deleted the ids "e" and "3" (a string is a sequence of characters), None a TypeError
    before = rowids(index)
    with pytest.raises(SemsearchError, match=rf"ids: give a list of ids, {re.escape(said)}"):
        delete_from_index(index, ids)
    assert rowids(index) == before


def test_filter_runs_before_the_search(index):
    engine = SearchEngine(index)
    hits = engine.search("entry about bikes", k=8, where="category = 'billing'")
    assert len(hits) == 8 and {h.fields["category"] for h in hits} == {"billing"}
    hits = engine.search("bikes", k=50, where="category IN ('app', 'parking') AND NOT id = 'e2'")
    assert len(hits) == 9 and "e2" not in {h.id for h in hits}
    assert engine.search("bikes", k=5, where="category = 'none such'") == []
    quote = engine.search("x", k=3, where="category = 'it''s'")
    assert quote == []
    for bad in (
        "category = 'a' OR 1=1",
        "category = 'x'; drop table entries",
        "_text = 'x'",
        "nosuch = 1",
        "category = (select 1)",
    ):
        with pytest.raises(SemsearchError, match="filter"):
            engine.search("x", k=3, where=bad)
    assert open_index(index).meta["count"] == len(BASE)


def test_second_writer_fails_clearly_while_readers_go_on(index, tmp_path, tiny_model):
    with writer_lock(index):
        with pytest.raises(SemsearchError, match="another semsearch process is writing"):
            add_to_index(index, write_csv(tmp_path / "u.csv", [("z", "new text", "app")]))
        with pytest.raises(SemsearchError, match="another semsearch process is writing"):
            build_index(tmp_path / "base.csv", index, Strategy(model=tiny_model))
        assert SearchEngine(index).search("bikes", k=1)  # readers are never blocked


def test_a_writer_killed_mid_transaction_blocks_no_later_writer(index, tmp_path):
    """A killed add leaves a hot journal in the live version's ``meta.db``: the next add and
    delete roll it back and go on from the last committed state; nothing calls it damage."""
    texts = {i: t for i, t, _ in BASE}
    leave_hot_journal(index)
    report = add_to_index(index, write_csv(tmp_path / "u.csv", [("n1", "a brand new entry", "app")]))
    assert (report.added, report.count) == (1, len(BASE) + 1)
    stored = dict(open_index(index).db.execute("select _id, _text from entries"))
    assert stored == {**texts, "n1": "a brand new entry"}  # the killed change is undone
    assert_keywords_exact(index)
    leave_hot_journal(index)
    assert delete_from_index(index, ["n1"]).count == len(BASE)
    leave_hot_journal(index)
    assert compact_index(index) > 0 and open_index(index).meta["count"] == len(BASE)


@pytest.mark.slow
@pytest.mark.parametrize("operation", ["add", "delete"])
def test_sigkill_during_add_or_delete_leaves_last_complete_state(index, tmp_path, tiny_model, operation):
    big = tmp_path / "big.csv"
    big.write_text(
        "id,text,category\n" + "".join(f"b{i},sentence {i} about bikes,bulk\n" for i in range(30000))
    )
    if operation == "add":
        command = ["add", str(index), str(big)]
    else:
        add_to_index(index, big)
        ids = tmp_path / "ids.txt"
        ids.write_text("\n".join(f"b{i}" for i in range(30000)))
        command = ["delete", str(index), "--ids-file", str(ids)]
    states = {len(BASE), len(BASE) + 30000}
    killed = 0
    # kills at shares of one whole run of the same command, measured on a copy of the index
    shutil.copytree(index, tmp_path / "measured")
    took = whole_run([command[0], str(tmp_path / "measured"), *command[2:]])
    shares = (0.1, 0.3, 0.5, 0.7) if operation == "add" else (0.2, 0.5)
    delays: tuple[float | str, ...] = (*(took * share for share in shares), "writing", "writing")
    for when in delays:
        if operation == "delete" and open_index(index).meta["count"] == len(BASE):
            add_to_index(index, big)  # the last delete finished: give the next one work again
        killed += kill_during(command, index, when)
        live = open_index(index)  # loads, counts agree (checked at open), and answers
        assert live.meta["count"] in states
        assert SearchEngine(index).search("bikes", k=1)
        assert_keywords_exact(index)  # the keyword table committed, or rolled back, with the rows
    assert killed >= 2


def test_bad_rows_on_purpose_every_row_accounted_for(tmp_path, tiny_model):
    rng = np.random.default_rng(1)
    good = [
        json.dumps({"id": f"g{i}", "text": f"row {i} talks about {rng.integers(1000)}"}) for i in range(10000)
    ]
    bad = [
        "",
        "   ",  # empty lines
        json.dumps({"id": "huge", "text": "word " * 200_000}),  # a 1 MB text: indexed (truncated)
        json.dumps({"id": "g5", "text": "duplicate id"}),
        json.dumps({"id": "cols", "question": "mixed-up columns", "answer": "no text field"}),
        json.dumps({"id": "empty", "text": ""}),
        json.dumps({"id": "obj", "text": {"nested": True}}),
        "[1, 2, 3]",
        "{not json",
        json.dumps({"text": "no id"}),
    ]
    raw = ("\n".join(good[:5000] + bad + good[5000:])).encode("utf-8")
    raw += b"\n" + bytes(rng.integers(0, 256, 300, dtype=np.uint8)).replace(b"\n", b" ")  # binary garbage
    raw += b'\n{"id": "latin1", "text": "caf\xe9"}\n'  # invalid UTF-8
    path = tmp_path / "torture.jsonl"
    path.write_bytes(raw)
    lines = len(io.StringIO(raw.decode("utf-8", "replace"), newline=None).readlines())  # JSON Lines: \n, \r
    corpus = read_corpus(path)
    assert len(corpus.entries) + len(corpus.rejected) == lines
    report = build_index(path, tmp_path / "idx", Strategy(model=tiny_model))
    assert report.entries == 10001 and len(report.rejected) == lines - 10001
    reasons = report.rejection_summary
    for kind in (
        "empty line",
        "duplicate id",
        "missing text",
        "empty text",
        "text not a string",
        "not a JSON object",
        "invalid JSON",
        "missing id",
    ):
        assert kind in reasons, reasons
    assert "invalid UTF-8" in reasons or "(not UTF-8)" in " ".join(r.reason for r in report.rejected)
    top = SearchEngine(tmp_path / "idx").search("word " * 300, k=1)[0]  # both truncated alike
    assert top.id == "huge" and len(top.text) == len("word " * 200_000) - 1


def entry_ids(index_dir: Path) -> dict[str, str]:
    """External id -> text of every live entry."""
    return dict(open_index(index_dir).db.execute("select _id, _text from entries"))


def test_add_to_an_index_built_on_row_numbers_appends_with_fresh_ids(tmp_path, tiny_model):
    """Row-number ids are the index's own: an added file's rows get ids after every id the index
    has given (deleted ones included), whatever fields they have; only an id field named with
    ``id_field`` upserts."""
    (tmp_path / "a.txt").write_text("one\ntwo\nthree\n", encoding="utf-8")
    build_index(tmp_path / "a.txt", tmp_path / "idx", Strategy(model=tiny_model))
    idx = tmp_path / "idx"
    (tmp_path / "more.txt").write_text("four\n\nfive\n", encoding="utf-8")  # row 2 rejected: empty
    report = add_to_index(idx, tmp_path / "more.txt")
    assert (report.added, report.updated, len(report.rejected), report.count) == (2, 0, 1, 5)
    assert entry_ids(idx) == {"1": "one", "2": "two", "3": "three", "4": "four", "6": "five"}
    with pytest.raises(SemsearchError, match="an id is a string or an integer, not 6.0"):
        delete_from_index(idx, [6.0])  # the id rule holds for deletes too: 6.0 is not the id 6
    assert delete_from_index(idx, [6]).deleted == 1
    (tmp_path / "c.csv").write_text("id,text\n1,six\n", encoding="utf-8")  # an id column is a field here
    assert add_to_index(idx, tmp_path / "c.csv").added == 1
    assert entry_ids(idx)["7"] == "six" and entry_ids(idx)["1"] == "one"
    (tmp_path / "u.csv").write_text("id,text\n2,two again\n100,hundred\n", encoding="utf-8")
    upsert = add_to_index(idx, tmp_path / "u.csv", id_field="id")
    assert (upsert.added, upsert.updated) == (1, 1) and entry_ids(idx)["2"] == "two again"
    add_to_index(idx, tmp_path / "more.txt")  # fresh ids pass the upserted 100 too
    assert {i: t for i, t in entry_ids(idx).items() if int(i) > 100} == {"101": "four", "103": "five"}


def test_index_given_ids_keeps_upserting(tmp_path, tiny_model):
    (tmp_path / "a.jsonl").write_text('{"text": "no id"}\n{"id": "1", "text": "one"}\n', encoding="utf-8")
    build_index(tmp_path / "a.jsonl", tmp_path / "idx", Strategy(model=tiny_model))
    (tmp_path / "b.jsonl").write_text('{"id": "1", "text": "one again"}\n{"text": "x"}\n', encoding="utf-8")
    report = add_to_index(tmp_path / "idx", tmp_path / "b.jsonl")
    assert (report.added, report.updated, [r.reason.split(":")[0] for r in report.rejected]) == (
        0,
        1,
        ["missing id"],
    )


def test_row_number_index_written_before_the_counter_appends_past_its_ids(tmp_path, tiny_model):
    (tmp_path / "a.txt").write_text("one\ntwo\nthree\n", encoding="utf-8")
    idx = tmp_path / "idx"
    build_index(tmp_path / "a.txt", idx, Strategy(model=tiny_model))
    add_to_index(idx, tmp_path / "a.txt")  # ids 4-6
    live = open_index(idx)
    source = {k: v for k, v in live.meta["source"].items() if k != "next_row_id"}
    import sqlite3

    with sqlite3.connect(live.version / "meta.db") as db:  # as an earlier semsearch wrote it
        db.execute("update meta set value = ? where key = 'source'", (json.dumps(source),))
    assert add_to_index(idx, tmp_path / "a.txt").added == 3
    assert sorted(map(int, entry_ids(idx))) == list(range(1, 10))


@pytest.mark.slow
def test_add_past_the_field_limit_is_one_clear_error_and_changes_nothing(index, tmp_path):
    """The index's fields and the file's new ones together must fit SQLite's table: checked before
    anything is written (SQLite's own "too many columns" came mid-write)."""
    from indexer.columns import MAX_FIELDS
    from tests.helpers import assert_clean_failure, run

    names = ["id", "text", *(f"x{i}" for i in range(MAX_FIELDS - 2))]  # as wide as a file may be
    wide = tmp_path / "wide.csv"
    wide.write_text(",".join(names) + "\n" + ",".join(["w1", "wide", *["v"] * (MAX_FIELDS - 2)]) + "\n")
    before = open_index(index).version
    with pytest.raises(SemsearchError, match=f"adds {MAX_FIELDS - 2} fields to the index's 3"):
        add_to_index(index, wide)
    assert_clean_failure(run("add", index, wide), "at most")
    assert open_index(index).version == before and open_index(index).meta["count"] == len(BASE)
    assert open_index(index).meta.get("generation", 0) == 0 and "w1" not in rowids(index)
