"""Keyword and hybrid search: the FTS5 table beside the vectors stays exact through every
change, user words are never FTS5 syntax, a mode an index cannot serve is one line, and hybrid
finds an exact error code among near-misses where dense does not."""

from __future__ import annotations

import functools
import json
import re
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from indexer import Strategy, build_index
from indexer.catalog import Catalog
from indexer.errors import BadInput
from indexer.reading.corpus import Entry
from indexer.store import live_version, open_index
from indexer.writing.update import add_to_index, compact_index, delete_from_index
from search import SearchEngine
from search.cli import cli
from search.read.hybrid import (
    DEFAULT_WEIGHT,
    MAX_TERMS,
    WEIGHTS,
    Words,
    fused,
    match_expression,
)
from search.studies.calibrate import store_hybrid_weight
from search.studies.evaluate import evaluate_retrieval, read_retrieval_set
from search.studies.sweep import retrieval_sweep
from tests.helpers import (
    BASE,
    assert_clean_failure,
    assert_keywords_exact,
    base_index,
    keyword_shares,
    run,
    write_csv,
)

HOSTILE = ['"', 'say "hi', "*", "bikes*", "NEAR(a b)", "a AND OR NOT b", "col:bikes", "(((", "^b", "-", "'"]


@pytest.fixture
def index(tmp_path, tiny_model, built_once) -> Path:
    return built_once("base flat", functools.partial(base_index, model=tiny_model), tmp_path / "idx")


def keyword_ids(index_dir: Path, query: str) -> set[str]:
    return {h.id for h in SearchEngine(index_dir).search(query, k=50, mode="keyword")}


def test_the_keyword_table_follows_add_delete_and_compact(index, tmp_path):
    assert_keywords_exact(index)
    word = BASE[1][1].split()[-1]
    assert BASE[1][0] in keyword_ids(index, word)
    changed = [(BASE[1][0], "zebra crossing", "app"), ("n1", "zebra", "app")]
    add_to_index(index, write_csv(tmp_path / "u.csv", changed))
    assert_keywords_exact(index)
    assert keyword_ids(index, "zebra") == {BASE[1][0], "n1"}
    delete_from_index(index, ["n1"])
    assert_keywords_exact(index)
    assert keyword_ids(index, "zebra") == {BASE[1][0]}
    compact_index(index)
    assert_keywords_exact(index)
    assert keyword_ids(index, "zebra") == {BASE[1][0]}
    assert open_index(index, vectors=False).info()["keywords"] is True


def test_user_words_are_never_fts_syntax(index):
    engine = SearchEngine(index)
    for query in HOSTILE:
        for mode in ("keyword", "hybrid"):
            engine.search(query, k=3, mode=mode)  # never an FTS5 syntax error
    assert match_expression("* ( ^") is None
    assert match_expression('say "hi') == '"say" OR """hi"'
    assert engine.search("***", k=3, mode="keyword") == []


def test_a_nul_in_a_word_is_a_separator_in_every_mode(index):
    engine = SearchEngine(index)
    word = BASE[1][1].split()[-1]
    for query in (f"a\x00{word}", f"{word}\x00", "a\x00\x00b\x1b"):
        for mode in ("keyword", "hybrid"):
            engine.search(query, k=3, mode=mode)  # never sqlite3's "unterminated string"
    assert keyword_ids(index, f"a\x00{word}") == keyword_ids(index, f"a {word}")


@pytest.fixture(scope="module")
def keyword_table(tmp_path_factory):
    """A real keyword table (the one an index keeps), emptied by each use."""
    catalog = Catalog.create(tmp_path_factory.mktemp("keywords") / "meta.db", {})
    yield catalog
    catalog.close()


ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=60)
"""Any string: NUL, control characters, lone surrogates, FTS5's own syntax."""


@settings(max_examples=250, deadline=None)
@given(query=st.one_of(ANY_TEXT, st.lists(st.sampled_from(HOSTILE + ["\x00", "a", "b1"])).map(" ".join)))
def test_any_string_gives_a_valid_match_expression_that_finds_its_own_words(keyword_table, query):
    expression = match_expression(query)
    if expression is None:
        return
    text = query.encode("utf-8", "replace").decode("utf-8").replace("\x00", " ")  # what a row can hold
    keyword_table.put([Entry("1", text, {})], [1], [1])
    try:
        found = keyword_table.keyword_search(expression, 5)  # never an FTS5 error
        terms = [term.lower() for term in re.findall(r'"(?:[^"]|"")*"', expression)]
        assert len(terms) == len(set(terms)) <= MAX_TERMS
        if re.search(r"(?<![^\s])[a-z0-9]+(?![^\s])", query.lower()):  # a plain word of it: found
            assert [rowid for rowid, _, _ in found] == [1]
    finally:
        keyword_table.delete([1])


def test_the_keyword_side_ors_each_word_once_and_at_most_max_terms_words():
    assert match_expression("bikes Bikes bikes, BIKES (bikes) " * 60 + "tyre") == '"bikes" OR "tyre"'
    many = [f"w{i}" for i in range(300)]
    assert match_expression(" ".join(many)) == " OR ".join(f'"{w}"' for w in many[:MAX_TERMS])


def test_the_best_possible_keyword_score_counts_the_terms_that_are_matched():
    """A query's share is its BM25 over the IDFs of the very terms its expression ORs: capped
    and deduplicated alike, a NUL splitting a word in both, so a long query's share is not read
    against words that were never searched."""
    for query in (" ".join(f"w{i}" for i in range(300)), "bikes Bikes, BIKES a\x00b tyre"):
        assert " OR ".join(Words(query, "hybrid").phrases) == match_expression(query)


def test_filters_and_group_by_work_in_every_mode(index):
    engine = SearchEngine(index)
    for mode in ("dense", "keyword", "hybrid"):
        hits = engine.search("bikes entry", k=5, where="category = 'billing'", mode=mode)
        assert hits and {h.fields["category"] for h in hits} == {"billing"}
        grouped = engine.search("bikes entry", k=3, group_by="category", mode=mode)
        assert len({h.fields["category"] for h in grouped}) == len(grouped)


def drop_keywords(index: Path) -> None:
    """What an index written before the keyword table holds."""
    db = sqlite3.connect(index / live_version(index) / "meta.db")
    db.executescript(
        "drop trigger keywords_insert; drop trigger keywords_delete; drop trigger keywords_update;"
        " drop table keywords;"
    )
    db.close()


@pytest.mark.slow
def test_the_cli_takes_hostile_words_and_refuses_a_mode_in_one_line(index):
    result = run("query", index, 'NEAR("bikes *', "--mode", "keyword")
    assert result.returncode == 0 and "Traceback" not in result.stderr
    drop_keywords(index)
    assert_clean_failure(run("query", index, "bikes", "--mode", "keyword"), "written before keyword search")
    assert "keywords:" in run("info", index).stdout


def test_an_index_written_before_the_keyword_table_refuses_keyword_modes_until_its_next_version(
    index, tmp_path
):
    drop_keywords(index)
    engine = SearchEngine(index)
    assert engine.search("bikes", k=1)  # the default falls back to dense
    with pytest.raises(BadInput, match="written before keyword search"):
        engine.search("bikes", k=1, mode="hybrid")
    assert open_index(index, vectors=False).info()["keywords"] is False
    add_to_index(index, write_csv(tmp_path / "u.csv", [("n1", "zebra", "app")]))
    assert_keywords_exact(index)
    assert keyword_ids(index, "zebra") == {"n1"}
    assert keyword_ids(index, BASE[1][1].split()[-1])  # the old rows are in it too


FAQ = [
    ("q1", "the screen stays dark", "check the cable; the display shows E04", "low"),
    ("q2", "the fan is loud", "clean the filter", "high"),
    ("q3", "it will not start", "hold the button", "Z99"),
]
"""Question, answer and a field named as FTS5 names its own columns: codes only in the also fields."""


def build_faq_with_also(tmp_path: Path, tiny_model: str) -> Path:
    corpus = write_csv(tmp_path / "faq.csv", FAQ, ("id", "question", "answer", "rank"))
    index = tmp_path / "faq-idx"
    also = ["question", "answer", "rank"]
    build_index(corpus, index, Strategy(model=tiny_model), text_fields=["question"], also=also)
    return index


def test_keyword_search_reads_every_also_field_through_add_delete_and_compact(tmp_path, tiny_model):
    index = build_faq_with_also(tmp_path, tiny_model)
    assert_keywords_exact(index)
    assert keyword_ids(index, "E04") == {"q1"} and keyword_ids(index, "z99") == {"q3"}
    assert keyword_ids(index, "dark") == {"q1"}  # the text field too
    added = [("q4", "no sound", "the error E07 means the speaker is off", "low")]
    add_to_index(index, write_csv(tmp_path / "u.csv", added, ("id", "question", "answer", "rank")))
    assert_keywords_exact(index)
    assert keyword_ids(index, "E07") == {"q4"}
    delete_from_index(index, ["q1"])
    assert_keywords_exact(index)
    assert keyword_ids(index, "E04") == set()
    compact_index(index)
    assert_keywords_exact(index)
    assert keyword_ids(index, "E07") == {"q4"} and keyword_ids(index, "Z99") == {"q3"}


def keep_text_only_keywords(index: Path) -> None:
    """What an index whose keyword table was written over its text alone holds."""
    db = sqlite3.connect(index / live_version(index) / "meta.db")
    db.executescript(
        "drop trigger keywords_insert; drop trigger keywords_delete; drop trigger keywords_update;"
        " drop table keywords; drop view keyword_texts;"
    )
    db.executescript(
        "create virtual table keywords using fts5(_text, content='entries', content_rowid='_rowid',"
        " tokenize='porter unicode61 remove_diacritics 2');"
        "insert into keywords(keywords) values ('rebuild');"
        "create trigger keywords_insert after insert on entries begin"
        " insert into keywords(rowid, _text) values (new._rowid, new._text); end;"
        "create trigger keywords_delete after delete on entries begin"
        " insert into keywords(keywords, rowid, _text) values ('delete', old._rowid, old._text); end;"
    )
    db.commit()
    db.close()


def test_a_keyword_table_over_the_text_alone_reads_the_also_fields_after_the_next_write(tmp_path, tiny_model):
    index = build_faq_with_also(tmp_path, tiny_model)
    keep_text_only_keywords(index)
    assert keyword_ids(index, "E04") == set()
    delete_from_index(index, ["q2"])
    assert_keywords_exact(index)
    assert keyword_ids(index, "E04") == {"q1"} and keyword_ids(index, "dark") == {"q1"}


def test_info_says_what_the_keyword_table_reads_until_its_next_write(tmp_path, tiny_model):
    index = build_faq_with_also(tmp_path, tiny_model)
    read = open_index(index, vectors=False).info()
    assert (read["keyword_fields"], read["keyword_fields_pending"]) == (["answer", "rank"], [])
    shown = CliRunner().invoke(cli, ["info", str(index)]).output
    assert "keywords:    FTS5 (BM25) over the text and answer, rank" in shown
    assert "keyword_fields: answer,rank\n" in shown and "[" not in shown  # a list as the others are
    keep_text_only_keywords(index)
    read = open_index(index, vectors=False).info()
    assert (read["keyword_fields"], read["keyword_fields_pending"]) == ([], ["answer", "rank"])
    shown = CliRunner().invoke(cli, ["info", str(index)]).output
    line = next(line for line in shown.splitlines() if line.startswith("keywords:"))
    assert "over the text alone" in line and "answer, rank from its next version" in line
    delete_from_index(index, ["q2"])
    read = open_index(index, vectors=False).info()
    assert (read["keyword_fields"], read["keyword_fields_pending"]) == (["answer", "rank"], [])


def test_min_score_works_in_every_mode_and_keeps_the_default_hybrid(index):
    engine = SearchEngine(index)
    assert engine.snapshot.mode(None) == "hybrid"
    for mode in ("dense", "keyword", "hybrid", None):
        hits = engine.search("7 billing", k=10, min_score=0.5, mode=mode)
        assert hits and all(h.answered == (h.score >= 0.5) for h in hits)
    assert engine.search("7 billing", k=1, min_score=0.4, mode="keyword")[0].answered is True
    with pytest.raises(BadInput, match=r"\[-1, 1\]"):
        engine.search("bikes", k=1, min_score=1.5, mode="hybrid")
    with pytest.raises(BadInput, match="mode"):
        engine.search("bikes", k=1, mode="sparse")


def test_the_cli_marks_hits_by_min_score_in_every_mode(index):
    for mode in ("dense", "keyword", "hybrid"):
        args = ["query", str(index), "7 billing", "--mode", mode, "--min-score", "0.5", "--json"]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        hits = json.loads(result.output.splitlines()[-1])["hits"]
        assert hits and all(h["answered"] == (h["score"] >= 0.5) for h in hits)


def test_the_keyword_share_is_the_share_of_the_query_words_an_entry_holds(index):
    engine = SearchEngine(index)
    shares = keyword_shares(engine, "7 billing")
    assert shares["e7"] == pytest.approx(1.0, abs=0.01)  # holds both words
    assert all(share == 0 for id, share in shares.items() if id != "e7")  # "billing": a third hold it
    assert keyword_shares(engine, "7 zebra")["e7"] < 0.5  # no entry holds "zebra"
    # keyword mode shows BM25 over the most the words could give: e7 holds each once, at about the
    # entries' average length, so about 1 / (k1 + 1) of it, and the entries holding "billing" alone less
    hits = engine.search("7 billing", k=10, mode="keyword")
    assert hits[0].id == "e7" and hits[0].score == pytest.approx(1 / 2.2, abs=0.02)
    assert all(0 < h.score < hits[0].score for h in hits[1:])


def test_the_hybrid_score_is_the_cosine_plus_bounded_keyword_evidence(index):
    engine = SearchEngine(index)
    for query in ("qwzx vbnm", "7 billing", "bikes"):
        dense = {h.id: h.score for h in engine.search(query, k=30, mode="dense")}
        keyword = keyword_shares(engine, query, 30)
        hits = engine.search(query, k=10, mode="hybrid")
        for hit in hits:
            fused = (1 - DEFAULT_WEIGHT) * dense[hit.id] + DEFAULT_WEIGHT * keyword.get(hit.id, 0.0)
            assert hit.score == pytest.approx(fused)
    # nothing is normalised per query: a query no entry shares a word with scores below its cosine
    nonsense = engine.search("qwzx vbnm", k=1, mode="hybrid")[0]
    cosine = engine.search("qwzx vbnm", k=1, mode="dense")[0].score
    assert nonsense.score == pytest.approx((1 - DEFAULT_WEIGHT) * cosine)


def test_fusion_adds_the_weighted_keyword_evidence_to_the_cosine():
    best = fused({1: 0.9, 2: 0.8, 3: 0.1}, {3: 1.0, 2: 0.5}, weight=0.6, k=3)
    assert list(best) == [3, 2, 1] and best == pytest.approx({3: 0.64, 1: 0.36, 2: 0.62})
    assert fused({1: 0.9, 2: 0.8}, {}, weight=0.15, k=2) == pytest.approx({1: 0.765, 2: 0.68})
    assert list(fused({1: 0.5, 2: 0.5, 3: 0.4}, {}, weight=0.15, k=2)) == [1, 2]  # ties in file order


TROUBLES = [
    "the pump pressure sensor reads low",
    "the door lock did not engage",
    "the fan speed is above its limit",
    "the battery voltage dropped",
    "the firmware checksum failed",
    "the water inlet is blocked",
    "the motor overheated",
    "the display lost its connection",
    "the heater did not reach temperature",
    "the filter needs replacing",
]


def error_faq() -> list[dict[str, str]]:
    """48 error codes, each one character from several others (E3353C, E3353D, E3453C...)."""
    codes = [f"E3{a}5{b}{c}" for a in "3456" for b in "3579" for c in "CDE"]
    return [{"id": code, "text": f"Error {code}: {TROUBLES[i % 10]}"} for i, code in enumerate(codes)]


@pytest.mark.slow
def test_hybrid_puts_the_exact_code_first_where_dense_does_not(tmp_path, bundled):
    corpus = tmp_path / "codes.jsonl"
    faq = error_faq()
    corpus.write_text("\n".join(json.dumps(row) for row in faq))
    build_index(corpus, tmp_path / "idx")
    engine = SearchEngine(tmp_path / "idx")
    firsts = {mode: 0 for mode in ("dense", "keyword", "hybrid")}
    for row in faq:
        for mode in firsts:
            firsts[mode] += engine.search(f"what does {row['id']} mean", k=1, mode=mode)[0].id == row["id"]
    assert firsts["hybrid"] == firsts["keyword"] == len(faq)
    assert firsts["dense"] < len(faq) * 0.6  # measured: 19 of 48


def test_the_server_searches_in_every_mode_and_answers_a_bad_one_with_400(index):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from search.server import create_app

    with TestClient(create_app(index)) as client:
        for mode in ("dense", "keyword", "hybrid"):
            for query in ("bikes", *HOSTILE):
                answer = client.post("/search", json={"query": query, "k": 3, "mode": mode})
                assert answer.status_code == 200, answer.text
        for mode in ("keyword", "hybrid"):
            batch = client.post("/search/batch", json={"queries": ["bikes", "NEAR(", "a\x00b"], "mode": mode})
            assert batch.status_code == 200, batch.text
        assert client.post("/search", json={"query": "bikes", "mode": "sparse"}).status_code == 400
        scored = client.post("/search", json={"query": "7 billing", "mode": "keyword", "min_score": 0.4})
        assert scored.status_code == 200 and scored.json()["hits"][0]["answered"] is True


def fused_ids(engine: SearchEngine, query: str, weight: float, k: int = 5) -> list[str]:
    """The top k of the fusion at ``weight``, computed from the dense and keyword rankings."""
    dense = {h.id: h.score for h in engine.search(query, k=100, mode="dense")}
    return list(fused(dense, keyword_shares(engine, query), weight, k))


def test_a_stored_weight_decides_the_fusion_and_outlives_updates(index, tmp_path):
    engine = SearchEngine(index)
    assert [h.id for h in engine.search("billing app", k=5)] == fused_ids(engine, "billing app", 0.15)
    assert fused_ids(engine, "billing app", 0.02) != fused_ids(engine, "billing app", 0.15)
    store_hybrid_weight(index, 0.02)
    engine = SearchEngine(index)
    assert [h.id for h in engine.search("billing app", k=5)] == fused_ids(engine, "billing app", 0.02)
    assert open_index(index, vectors=False).info()["hybrid_weight"] == 0.02
    add_to_index(index, write_csv(tmp_path / "u.csv", [("n1", "zebra", "app")]))
    assert open_index(index, vectors=False).info()["hybrid_weight"] == 0.02
    live = live_version(index)
    for bad in (1.5, -0.1):
        with pytest.raises(BadInput, match=r"\[0, 1\]"):
            store_hybrid_weight(index, bad)
    assert live_version(index) == live  # nothing written


@pytest.mark.slow
def test_calibrate_stores_a_hybrid_weight_that_info_shows_and_refuses_one_outside_0_1(index):
    assert "hybrid_weight: 0.15 (default" in run("info", index).stdout
    assert_clean_failure(run("calibrate", index, "--hybrid-weight", "1.5"), "0<=x<=1")
    assert_clean_failure(run("calibrate", index, "--hybrid-weight", "0.3", "--self"), "--hybrid-weight")
    stored = run("calibrate", index, "--hybrid-weight", "0.3")
    assert stored.returncode == 0 and "0.3" in stored.stdout, stored.stderr
    assert "hybrid_weight: 0.3 (stored" in run("info", index).stdout


def code_questions(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The error-code FAQ as a corpus, and a question on each of its first 12 codes."""
    faq = error_faq()
    corpus, queries, qrels = tmp_path / "codes.jsonl", tmp_path / "q.jsonl", tmp_path / "qrels.tsv"
    corpus.write_text("\n".join(json.dumps(row) for row in faq))
    asked = [{"id": f"q{i}", "text": f"my pump shows {row['id']}"} for i, row in enumerate(faq[:12])]
    queries.write_text("\n".join(json.dumps(q) for q in asked))
    qrels.write_text("".join(f"q{i}\t{row['id']}\t1\n" for i, row in enumerate(faq[:12])))
    return corpus, queries, qrels


def test_sweep_retrieval_measures_keyword_and_every_hybrid_weight_for_its_best_cell(tmp_path, tiny_model):
    corpus, queries, qrels = code_questions(tmp_path)
    data = read_retrieval_set(queries, qrels)
    sweep = retrieval_sweep(data, corpus, Strategy(model=tiny_model), poolings=("mean",))
    modes = sweep.modes
    assert modes.cell == sweep.cells[0]
    assert set(modes.hybrid) == set(WEIGHTS)
    best = modes.best_weight("mrr@10")
    assert modes.hybrid[best]["mrr@10"] == max(m["mrr@10"] for m in modes.hybrid.values())
    # what an index of the best cell's strategy answers, its weight stored
    build_index(corpus, tmp_path / "idx", replace(modes.cell.strategy, backend="torch"))
    for weight in (WEIGHTS[0], WEIGHTS[-1]):
        store_hybrid_weight(tmp_path / "idx", weight)
        measured = evaluate_retrieval(data, index_dir=tmp_path / "idx")
        assert measured["keyword mrr@10"] == pytest.approx(modes.keyword["mrr@10"])
        assert measured["dense mrr@10"] == pytest.approx(modes.cell.scores["mrr@10"])
        assert measured["hybrid mrr@10"] == pytest.approx(modes.hybrid[weight]["mrr@10"])


def test_sweep_retrieval_prints_the_modes_the_best_weight_and_how_to_store_it(tmp_path, tiny_model):
    corpus, queries, qrels = code_questions(tmp_path)
    args = ["sweep", "retrieval", "--corpus", corpus, "--queries", queries, "--qrels", qrels]
    result = CliRunner().invoke(cli, [*map(str, args), "--model", tiny_model, "--poolings", "mean"])
    assert result.exit_code == 0, result.output
    for row in ("dense", "keyword", *(f"hybrid {w:g}" for w in WEIGHTS)):
        assert f"\n{row} " in result.output
    assert "best keyword weight by mrr@10: " in result.output
    assert "store it, for an index built as the best cell: semsearch index " in result.output
    assert ", then semsearch calibrate INDEX --hybrid-weight " in result.output
