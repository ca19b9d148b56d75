"""Two vectors per entry (``--also``): the option, its storage in the index, the exact combined
score on every query path, updates keeping both vector sets in step, and misuse."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from indexer import build_index
from indexer.embedding.fields import FieldScoring
from indexer.errors import BadInput
from indexer.store import open_index
from indexer.vectors.entries import ALSO_ID, row_ids
from indexer.writing.update import add_to_index, delete_from_index
from search.read.confidence import FEATURES, NEIGHBOURS, Neighbourhood
from search.read.duplicates import find_duplicates
from search.read.engine import SearchEngine
from tests.helpers import assert_clean_failure, run

# Crafted so that each single field ranks a decoy first and only their combination the right entry:
# the question alone prefers "qdecoy" (same question, useless answer), question+answer alone
# prefers "adecoy" (an answer that repeats the query, an unrelated question).
ENTRIES = [
    {
        "id": "right",
        "text": "How do I get my money back for a ride?",
        "answer": "Refunds for cancelled rides are credited to your card within five days.",
        "lang": "en",
    },
    {
        "id": "qdecoy",
        "text": "How do I get money back for a cancelled ride?",
        "answer": "Our bikes are serviced every week at the depot by mechanics.",
        "lang": "en",
    },
    {
        "id": "adecoy",
        "text": "Is there a phone number I can call?",
        "answer": "Refund for a cancelled ride: a refund for a cancelled ride is credited to your card.",
        "lang": "fr",
    },
]
QUERY = "can I get a refund for a cancelled ride"
WEIGHT = 0.8


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write(tmp_path_factory.mktemp("fields") / "faq.jsonl", ENTRIES)


@pytest.fixture(scope="module")
def combined(tmp_path_factory, corpus) -> Path:
    index_dir = tmp_path_factory.mktemp("combined") / "idx"
    build_index(corpus, index_dir, also=FieldScoring(("text", "answer"), WEIGHT))
    return index_dir


def cosines(bundled, texts: list[str]) -> np.ndarray:
    vectors = bundled.embed([QUERY, *texts])
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors[1:] @ vectors[0]


@pytest.mark.slow
def test_only_the_combination_ranks_the_right_entry_first(tmp_path, corpus, combined):
    question, both = tmp_path / "q", tmp_path / "qa"
    build_index(corpus, question)
    build_index(corpus, both, text_fields=["text", "answer"])
    assert SearchEngine(question).search(QUERY, k=1, mode="dense")[0].id == "qdecoy"
    assert SearchEngine(both).search(QUERY, k=1, mode="dense")[0].id == "adecoy"
    ranked = SearchEngine(combined).search(QUERY, k=3, mode="dense")
    assert [h.id for h in ranked] == ["right", "qdecoy", "adecoy"]


@pytest.mark.slow
def test_the_score_is_the_weighted_sum_of_both_fields_cosines(bundled, combined):
    text = cosines(bundled, [e["text"] for e in ENTRIES])
    also = cosines(bundled, [f"{e['text']} {e['answer']}" for e in ENTRIES])
    expected = dict(zip([e["id"] for e in ENTRIES], (1 - WEIGHT) * text + WEIGHT * also, strict=True))
    hits = SearchEngine(combined).search(QUERY, k=3, mode="dense")
    assert {h.id: h.score for h in hits} == pytest.approx(expected, abs=1e-4)


@pytest.mark.slow
def test_the_option_is_stored_and_both_vector_sets_are_in_the_index(combined):
    index = open_index(combined)
    assert index.meta["source"]["also"] == {"fields": ["text", "answer"], "weight": WEIGHT}
    assert index.info()["also"] == {"fields": ["text", "answer"], "weight": WEIGHT}
    _, ids = index.vectors.stored()
    assert sorted(ids.tolist()) == [1, 2, 3, ALSO_ID + 1, ALSO_ID + 2, ALSO_ID + 3]


@pytest.mark.slow
def test_a_filter_keeps_the_combined_score(combined):
    engine = SearchEngine(combined)
    unfiltered = {h.id: h.score for h in engine.search(QUERY, k=3, mode="dense")}
    filtered = engine.search(QUERY, k=3, where="lang = 'en'", mode="dense")
    assert [h.id for h in filtered] == ["right", "qdecoy"]
    assert {h.id: h.score for h in filtered} == pytest.approx({k: unfiltered[k] for k in ("right", "qdecoy")})


@pytest.mark.slow
def test_calibration_features_use_the_combined_score(combined):
    snapshot = SearchEngine(combined).snapshot
    vectors = snapshot.embed([QUERY])
    [near] = snapshot.neighbourhoods(snapshot.plan([QUERY], NEIGHBOURS, mode="dense"), vectors)
    assert isinstance(near, Neighbourhood)
    [hits] = snapshot.run(snapshot.plan([QUERY], k=3, mode="dense"), vectors)
    assert near.scores.tolist() == pytest.approx([h.score for h in hits])


@pytest.mark.slow
def test_a_hits_text_feature_is_its_own_texts_cosine(bundled, combined):
    """The ``text`` feature of an entry is the query's cosine to its own text alone (its
    question), not the score that mixes in the answer: in a neighbourhood, and in what is left of
    it when entries are hidden (as calibration does)."""
    text = dict(zip([e["id"] for e in ENTRIES], cosines(bundled, [e["text"] for e in ENTRIES]), strict=True))
    snapshot = SearchEngine(combined).snapshot
    plan = snapshot.plan([QUERY], NEIGHBOURS, mode="dense")
    [near] = snapshot.neighbourhoods(plan, snapshot.embed([QUERY]))
    ids = snapshot.ids(near.rowids)
    column = FEATURES.index("text")
    found = dict(zip([ids[r] for r in near.rowids], near.features(3)[:, column].tolist(), strict=True))
    assert found == pytest.approx(text, abs=1e-4)
    assert near.features(3)[:, column].tolist() != pytest.approx(near.scores.tolist(), abs=1e-3)
    filtered = near.first(3, removed=[r for r in near.rowids if ids[r] == "adecoy"])
    expected = [text["right"], text["qdecoy"]]
    assert filtered.features(2)[:, column].tolist() == pytest.approx(expected, abs=1e-4)


@pytest.mark.slow
def test_add_and_delete_keep_both_vector_sets_in_step(tmp_path, corpus, bundled):
    index_dir = tmp_path / "idx"
    build_index(corpus, index_dir, also=FieldScoring(("text", "answer"), WEIGHT))
    # an answer-only change leaves the question's text (and hash) as it was: the also-vector
    # must still be embedded again
    changed = [{**ENTRIES[0], "answer": "Our bikes are serviced every week at the depot by mechanics."}]
    add_to_index(index_dir, write(tmp_path / "change.jsonl", changed))
    index = open_index(index_dir)
    assert index.vectors.count == 6
    new_also = cosines(bundled, [f"{changed[0]['text']} {changed[0]['answer']}"])[0]
    new_text = cosines(bundled, [changed[0]["text"]])[0]
    hit = next(h for h in SearchEngine(index_dir).search(QUERY, k=3, mode="dense") if h.id == "right")
    assert hit.score == pytest.approx((1 - WEIGHT) * new_text + WEIGHT * new_also, abs=1e-4)
    delete_from_index(index_dir, ["adecoy"])
    _, ids = open_index(index_dir).vectors.stored()
    assert sorted(ids.tolist()) == [1, 2, ALSO_ID + 1, ALSO_ID + 2]
    assert [h.id for h in SearchEngine(index_dir).search(QUERY, k=5)] == ["qdecoy", "right"]


@pytest.mark.slow
def test_duplicates_compare_the_texts_alone(tmp_path, combined):
    rows = [*ENTRIES, {**ENTRIES[1], "id": "twin", "answer": "Something else entirely."}]
    index_dir = tmp_path / "idx"
    build_index(write(tmp_path / "c.jsonl", rows), index_dir, also=FieldScoring(("answer",)))
    found = find_duplicates(open_index(index_dir), 0.99)
    assert found.groups == [["qdecoy", "twin"]]
    assert find_duplicates(open_index(combined), 0.99).groups == []


@pytest.mark.slow
def test_an_entry_with_empty_also_fields_uses_its_text(tmp_path, bundled):
    rows = [{"id": "a", "text": "Where do I park my bike?", "answer": ""}, {"id": "b", "text": "Pay by card"}]
    index_dir = tmp_path / "idx"
    build_index(write(tmp_path / "c.jsonl", rows), index_dir, also=FieldScoring(("answer",), 0.5))
    hits = SearchEngine(index_dir).search(QUERY, k=2, mode="dense")
    assert {h.id: h.score for h in hits} == pytest.approx(
        dict(zip("ab", cosines(bundled, [r["text"] for r in rows]), strict=True)), abs=1e-4
    )


@pytest.mark.parametrize(
    ("fields", "weight", "message"),
    [
        ((), 0.7, "--also: name the field"),
        (("",), 0.7, "--also: name the field"),
        (("answer",), 1.5, "--also-weight must be in [0, 1]"),
        (("answer",), -0.1, "--also-weight must be in [0, 1]"),
        (("answer",), float("nan"), "--also-weight must be in [0, 1]"),
    ],
)
def test_bad_scorings_are_refused(fields, weight, message):
    with pytest.raises(BadInput, match=message.replace("[", r"\[").replace("]", r"\]")):
        FieldScoring(fields, weight)


def test_a_weight_without_fields_is_refused():
    assert FieldScoring.asked([], None) is None
    with pytest.raises(BadInput, match="--also-weight needs --also"):
        FieldScoring.asked([], 0.5)


@pytest.mark.slow
def test_the_cli_builds_and_queries_a_combined_index_and_refuses_misuse(tmp_path, corpus):
    index_dir = tmp_path / "idx"
    built = run("index", corpus, "-o", index_dir, "--also", "text, answer", "--also-weight", str(WEIGHT))
    assert built.returncode == 0, built.stderr
    found = run("query", index_dir, QUERY, "-k", "1", "--json", "--mode", "dense")
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["hits"][0]["id"] == "right"
    missing = run("index", corpus, "-o", tmp_path / "x", "--also", "nope")
    assert_clean_failure(missing, "no entry has field 'nope'")
    assert_clean_failure(run("index", corpus, "-o", tmp_path / "y", "--also-weight", "0.5"), "needs --also")
    assert_clean_failure(
        run("index", corpus, "-o", index_dir, "--also", "answer", "--also-weight", "2"),
        "is not in the range 0<=x<=1",
    )
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
    assert open_index(index_dir).meta["source"]["also"]["weight"] == WEIGHT  # the failed run kept it


@pytest.mark.slow
def test_the_server_ranks_by_the_combined_score(combined):
    from fastapi.testclient import TestClient

    from search.server import create_app

    with TestClient(create_app(combined)) as client:
        hits = client.post("/search", json={"query": QUERY, "k": 3, "mode": "dense"}).json()["hits"]
        assert [h["id"] for h in hits] == ["right", "qdecoy", "adecoy"]
        assert client.get("/info").json()["also"] == {"fields": ["text", "answer"], "weight": WEIGHT}


@pytest.mark.slow
def test_info_names_the_also_fields(combined, tmp_path, corpus):
    shown = run("info", combined)
    assert shown.returncode == 0, shown.stderr
    assert "also:        text,answer (weight 0.8)" in shown.stdout
    build_index(corpus, tmp_path / "plain")
    assert "also:" not in run("info", tmp_path / "plain").stdout
    assert json.loads(run("info", tmp_path / "plain", "--json").stdout)["also"] is None


def test_faiss_padding_is_no_row():
    """FAISS pads a search that finds fewer vectors than asked with -1: that is no entry, and the
    engine counts only real rows (a made-up row id made it stop widening one hit short)."""
    found = np.array([[7, ALSO_ID + 7, ALSO_ID + 3, -1, -1]], dtype=np.int64)
    assert row_ids(found).tolist() == [[7, 7, 3, -1, -1]]


def test_also_field_names_match_whatever_their_case_and_a_miss_names_the_nearest():
    from indexer.reading.corpus import Entry

    entries = [Entry("1", "how to pay", {"Question": "how to pay", "Answer": "by card"})]
    assert FieldScoring(("question", "ANSWER")).texts(entries) == ["how to pay by card"]
    with pytest.raises(BadInput, match="no entry has field 'answr' \\(did you mean 'Answer'\\?\\)"):
        FieldScoring(("answr",)).texts(entries)


def test_also_fields_missing_or_null_in_an_entry_are_empty_parts():
    """As with --text-field: a missing or null field among the joined ones is an empty part; an
    entry with none of them uses its text."""
    from indexer.reading.corpus import Entry

    entries = [
        Entry("1", "t1", {"question": "how to pay", "answer": None}),
        Entry("2", "t2", {"answer": "by card"}),
        Entry("3", "t3", {"question": " ", "other": "x"}),
    ]
    assert FieldScoring(("question", "answer")).texts(entries) == ["how to pay", "by card", "t3"]
