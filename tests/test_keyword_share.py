"""The keyword share is the rarity-weighted share of the question's words an entry holds, in
[0, 1] with no cap (keyword mode shows BM25 over its bound instead, in BM25's order); hybrid mixes
the share with the cosine by the index's one weight for every query;
entries that tie rank in file order in every mode."""

from __future__ import annotations

import json
import math
import random

import pytest

from indexer import Strategy, build_index
from indexer.catalog import Catalog
from indexer.errors import BadInput
from indexer.reading.corpus import Entry
from search import SearchEngine
from search.read.hybrid import DEFAULT_WEIGHT, Words, keyword_scores
from tests.helpers import BASE, assert_clean_failure, keyword_shares, run, write_csv

COMMON = ["zorb", "plim"]
"""Words most entries hold: they weigh nothing."""
RARE = ["quax", "vunt", "drel", "mosk", "glin", "fesk", "yolb", "wrax", "snib", "e3453c"]
ABSENT = ["blork", "tump"]
"""Words no entry holds: a question's words the entries lack count against every entry."""


def random_entries(rng: random.Random, n: int = 40) -> list[str]:
    """Short, long and repetitive entries (where BM25 over the IDFs exceeded 1)."""
    texts = []
    for _ in range(n):
        words = [w for w, p in ((COMMON[0], 0.8), (COMMON[1], 0.65)) if rng.random() < p]
        words += rng.sample(RARE, rng.choice([0, 1, 1, 2, 3]))
        if words and rng.random() < 0.3:
            words += [rng.choice(words)] * rng.randint(1, 6)  # repeated
        rng.shuffle(words)
        texts.append(" ".join(words) or "nothing")
    return texts


def idf(n: int, holding: float) -> float:
    return math.log(1 + (n - holding + 0.5) / (holding + 0.5))


def held_share(texts: list[str], text: str, query: list[str]) -> float:
    """The share computed from the texts alone: the weights (BM25's IDF, Lucene's positive form,
    above that of a word a quarter of the entries hold, floored at 0, counted here) of the query's
    distinct words the entry holds over the weights of all of them."""
    n = len(texts)
    words = {w.lower() for w in query}
    common = min(max(n / 4, 1.5), n)
    weight = {w: max(0.0, idf(n, sum(w in t.split() for t in texts)) - idf(n, common)) for w in words}
    total = sum(weight.values())
    return sum(weight[w] for w in words if w in text.split()) / total if total else 0.0


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    rng = random.Random(39)
    texts = random_entries(rng)
    catalog = Catalog.create(tmp_path_factory.mktemp("share") / "meta.db", {})
    catalog.put([Entry(str(i), t, {}) for i, t in enumerate(texts)], range(len(texts)), [1] * len(texts))
    yield catalog, texts
    catalog.close()


def test_random_two_word_queries_score_the_held_share(table):
    catalog, texts = table
    rng = random.Random(7)
    vocabulary = COMMON + RARE + ABSENT
    for _ in range(300):
        query = [rng.choice(vocabulary), rng.choice(vocabulary)]
        query = [w.upper() if rng.random() < 0.2 else w for w in query]
        found = keyword_scores(catalog, Words(" ".join(query), "keyword"), len(texts))
        holding = {i for i, t in enumerate(texts) if {w.lower() for w in query} & set(t.split())}
        assert set(found) == holding, query  # every entry holding a word, none other
        for rowid, score in found.items():
            expected = held_share(texts, texts[rowid], query)
            assert score == pytest.approx(expected, abs=1e-9), (query, texts[rowid])


def test_a_question_of_words_a_quarter_of_the_entries_hold_is_no_keyword_evidence(tmp_path):
    """"how do I do it" on a FAQ where each of its words stands in about a third of the entries
    scores no keyword evidence; a rare word beside them still counts whole."""
    texts = [
        " ".join(w for w, every in (("how", 3), ("do", 3), ("it", 3), ("i", 2)) if (i + len(w)) % every == 0)
        + f" topic{i}"
        for i in range(120)
    ]
    catalog = Catalog.create(tmp_path / "meta.db", {})
    catalog.put([Entry(str(i), t, {}) for i, t in enumerate(texts)], range(len(texts)), [1] * len(texts))
    shares = [sum(w in t.split() for t in texts) / len(texts) for w in ("how", "do", "it", "i")]
    assert all(0.3 <= share <= 0.55 for share in shares)
    for query in ("how do I do it", "is it", "how", "do it"):
        found = keyword_scores(catalog, Words(query, "keyword"), len(texts))
        assert found and max(found.values()) == 0, query
    found = keyword_scores(catalog, Words("how do I do topic7", "keyword"), len(texts))
    assert found[7] == pytest.approx(1.0) and sorted(found.values())[-2] == 0
    catalog.close()


def test_a_question_of_words_most_entries_hold_is_no_keyword_evidence(tmp_path, tiny_model):
    """``entry``, ``number`` and ``about`` are in every entry of BASE: holding them says nothing."""
    build_index(write_csv(tmp_path / "base.csv", BASE), tmp_path / "idx", Strategy(model=tiny_model))
    engine = SearchEngine(tmp_path / "idx")
    for query in ("entry", "about the number", "Entry about"):
        hits = engine.search(query, k=5, mode="keyword")
        assert hits and all(h.score < 1e-5 for h in hits)  # FTS5's IDF of a word every entry holds: 1e-6
        assert all(share == 0 for share in keyword_shares(engine, query).values())
        dense = {h.id: h.score for h in engine.search(query, k=30, mode="dense")}
        for hit in engine.search(query, k=5, mode="hybrid"):
            assert hit.score == pytest.approx((1 - DEFAULT_WEIGHT) * dense[hit.id])
        assert all(not h.answered for h in engine.search(query, k=5, mode="keyword", min_score=0.4))
    # an entry holding one of two rare words holds half their weight, not all of it
    one = engine.search("7 11", k=3, mode="keyword")
    assert {h.id for h in one[:2]} == {"e7", "e11"}
    shares = keyword_shares(engine, "7 11")
    assert shares["e7"] == pytest.approx(0.5) and shares["e11"] == pytest.approx(0.5)


def test_where_no_word_of_a_question_weighs_anything_the_hits_say_so(tmp_path, tiny_model):
    """Every keyword score 0 is no ranking by the share: the note printed with the hits says every
    word weighs 0 (in a quarter of the entries or more) and the hits stand in BM25's order; a
    question with a word that weighs something, or searched in another mode, has no such note."""
    from click.testing import CliRunner

    from search.cli import cli

    build_index(write_csv(tmp_path / "base.csv", BASE), tmp_path / "idx", Strategy(model=tiny_model))
    engine = SearchEngine(tmp_path / "idx")
    notes = engine.keyword_notes(["entry about", "entry 7", "?!"], "keyword")
    assert notes[0] is not None and notes[1:] == [None, None]
    assert "every word of this question is in a quarter of the entries or more" in notes[0]
    assert "every keyword score is 0" in notes[0] and "BM25" in notes[0]
    assert engine.keyword_notes(["entry about"], "hybrid") == [None]
    assert engine.keyword_notes(["entry about"], "dense") == [None]

    def query(*args: str) -> str:
        said = CliRunner().invoke(cli, ["query", str(tmp_path / "idx"), *args, "--mode", "keyword"])
        assert said.exit_code == 0, said.output
        return said.stdout

    lines = query("entry about").splitlines()
    assert lines[lines.index("query: entry about") + 1] == notes[0]
    assert json.loads(query("entry about", "--json"))["note"] == notes[0]
    assert "note" not in json.loads(query("entry 7", "--json"))

    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from search.server import create_app

    with TestClient(create_app(tmp_path / "idx")) as client:
        one = client.post("/search", json={"query": "entry about", "mode": "keyword"}).json()
        other = client.post("/search", json={"query": "entry 7", "mode": "keyword"}).json()
        batch = client.post("/search/batch", json={"queries": ["entry about", "entry 7"], "mode": "keyword"})
    assert one["note"] == notes[0] and "note" not in other
    assert [r.get("note") for r in batch.json()["results"]] == [notes[0], None]


def test_a_query_holding_a_code_is_fused_with_the_index_weight(tmp_path, tiny_model):
    build_index(write_csv(tmp_path / "base.csv", BASE), tmp_path / "idx", Strategy(model=tiny_model))
    engine = SearchEngine(tmp_path / "idx")
    for query in ("billing v2", "E3453C bikes", "parking 7b"):
        dense = {h.id: h.score for h in engine.search(query, k=30, mode="dense")}
        keyword = keyword_shares(engine, query, 30)
        for hit in engine.search(query, k=10, mode="hybrid"):
            fused = (1 - DEFAULT_WEIGHT) * dense[hit.id] + DEFAULT_WEIGHT * keyword.get(hit.id, 0.0)
            assert hit.score == pytest.approx(fused), query


TIES = ["alpha bikes", "beta parking", "alpha bikes", "gamma app", "alpha bikes", "beta parking"] * 4
"""Entries with the same text: the same cosine, the same keyword share."""


@pytest.mark.parametrize("also", [False, True])
def test_entries_that_tie_rank_in_file_order_in_every_mode(tmp_path, tiny_model, also):
    rows = [(f"r{i}", text, text.split()[1]) for i, text in enumerate(TIES)]
    corpus = write_csv(tmp_path / "ties.csv", rows, ("id", "text", "topic"))
    fields = {"text_fields": ["text"], "also": ["text", "topic"]} if also else {}
    build_index(corpus, tmp_path / "idx", Strategy(model=tiny_model), **fields)
    engine = SearchEngine(tmp_path / "idx")
    position = {row[0]: i for i, row in enumerate(rows)}
    for mode in ("dense", "keyword", "hybrid"):
        for query in ("alpha bikes", "beta parking", "gamma"):
            whole = engine.search(query, k=len(rows), mode=mode)
            expected = [h.id for h in sorted(whole, key=lambda h: (-h.score, position[h.id]))]
            assert [h.id for h in whole] == expected, (mode, query)
            for k in (1, 2, 5):
                assert [h.id for h in engine.search(query, k=k, mode=mode)] == expected[:k], (mode, query, k)
            within = engine.search(query, k=3, mode=mode, where="topic != 'app'")
            allowed = [i for i in expected if TIES[position[i]] != "gamma app"]
            assert [h.id for h in within] == allowed[:3], (mode, query)


def test_a_k_beyond_any_count_is_one_line_in_every_mode(tmp_path, tiny_model):
    build_index(write_csv(tmp_path / "base.csv", BASE), tmp_path / "idx", Strategy(model=tiny_model))
    engine = SearchEngine(tmp_path / "idx")
    for mode in ("dense", "keyword", "hybrid"):
        with pytest.raises(BadInput, match="k must be at most"):
            engine.search("bikes", k=2**63, mode=mode)
        assert engine.search("bikes", k=2**63 - 1, mode=mode)  # the largest k SQLite counts to


@pytest.mark.slow
def test_the_cli_refuses_a_k_beyond_any_count_in_one_line(tmp_path, tiny_model):
    build_index(write_csv(tmp_path / "base.csv", BASE), tmp_path / "idx", Strategy(model=tiny_model))
    for mode in ("keyword", "hybrid"):
        result = run("query", tmp_path / "idx", "bikes", "-k", str(2**63), "--mode", mode)
        assert_clean_failure(result, f"is not in the range 1<=x<={2**63 - 1}")
        assert result.returncode == 2  # a usage error, as -k 0 is


def test_group_by_names_a_field_whatever_its_case_as_where_does(tmp_path, tiny_model):
    build_index(write_csv(tmp_path / "base.csv", BASE), tmp_path / "idx", Strategy(model=tiny_model))
    engine = SearchEngine(tmp_path / "idx")
    for mode in ("dense", "keyword", "hybrid"):
        asked = engine.search("bikes entry", k=3, group_by="CateGory", mode=mode, where="CATEGORY != 'app'")
        named = engine.search("bikes entry", k=3, group_by="category", mode=mode, where="category != 'app'")
        assert asked == named
        assert len({h.fields["category"] for h in asked}) == 3


@pytest.mark.parametrize("size", [2, 3, 4, 5, 7])
def test_in_a_small_index_a_word_one_entry_holds_counts(tmp_path, size):
    """A quarter of a few entries is less than two: a word a single entry holds still tells it from
    the others, so a question of that entry's own words is whole keyword evidence."""
    texts = [f"where do I park spot{i}" if i == 0 else f"how do I pay case{i}" for i in range(size)]
    catalog = Catalog.create(tmp_path / "meta.db", {})
    catalog.put([Entry(str(i), t, {}) for i, t in enumerate(texts)], range(len(texts)), [1] * len(texts))
    found = keyword_scores(catalog, Words("Where do I park?", "keyword"), size)
    assert found[0] == pytest.approx(1.0)
    catalog.close()


def test_hybrid_leaves_unscored_only_entries_that_could_not_be_among_the_best(
    tmp_path, tiny_model, monkeypatch
):
    """Keyword-only candidates whose share cannot lift the dense ranking's last cosine to the k-th
    fused score are never scored: the hits are those of scoring every candidate, and some are
    left out."""
    import search.read.hybrid  # the hybrid ranker prunes with it

    rng = random.Random(5)
    words = sorted({"".join(rng.choice("bcdfghjklmnpqrstvwxz") for _ in range(5)) for _ in range(60)})
    rows = [(f"e{i}", " ".join(rng.sample(words, 4)), "x") for i in range(260)]  # no code: plain words
    build_index(write_csv(tmp_path / "many.csv", rows), tmp_path / "idx", Strategy(model=tiny_model))
    queries = [" ".join(rng.sample(words, rng.choice([1, 2, 3]))) for _ in range(40)]
    left_out = []
    real = search.read.hybrid.reachable

    def counted(dense, keyword, candidates, *args):
        kept = real(dense, keyword, candidates, *args)
        left_out.append(len(candidates) - len(kept))
        return kept

    monkeypatch.setattr(search.read.hybrid, "reachable", counted)
    pruned = SearchEngine(tmp_path / "idx").search_many(queries, k=5, mode="hybrid")
    monkeypatch.setattr(search.read.hybrid, "reachable", lambda dense, keyword, candidates, *args: candidates)
    whole = SearchEngine(tmp_path / "idx").search_many(queries, k=5, mode="hybrid")
    assert [[(h.id, h.score) for h in hits] for hits in pruned] == [
        [(h.id, h.score) for h in hits] for hits in whole
    ]
    assert sum(left_out) > 0


FTS5_K1 = 1.2
"""FTS5's bm25() k1."""
SHOWN = [
    *("7", "7 billing", "billing", "bikes", "parking app", "bikes bikes", "7 7 billing", "Bikes bikes BIKES"),
    *("entry", "entry entry number", "entry 7", "about 12 bikes", "zebra 7", "zebra", "app 3 23 13"),
    *("number about parking 2 8 14 20 26", "billing billing 1 3 9", "the entry about app", "29 bikes app"),
]
"""Questions on BASE: repeated words, words every entry holds, words no entry holds."""


def fts5_ranking(catalog: Catalog, words: Words, k: int) -> tuple[list[int], list[float], float]:
    """FTS5's own order (bm25, then row id) of the OR of the question's phrases, each entry's BM25
    and the most BM25 the phrases could give: each one's IDF (FTS5's, 1e-6 where it is not
    positive) times k1 + 1."""
    found = catalog.db.execute(
        "select rowid, -bm25(keywords) from keywords where keywords match ? order by bm25(keywords), rowid"
        " limit ?",
        (words.match, k),
    ).fetchall()
    total = catalog.db.execute("select count(*) from entries").fetchone()[0]
    count = "select count(*) from keywords where keywords match ?"
    most = 0.0
    for phrase in words.phrases:
        n = catalog.db.execute(count, (phrase,)).fetchone()[0]
        idf = math.log((total - n + 0.5) / (n + 0.5))
        most += (idf if idf > 0 else 1e-6) * (FTS5_K1 + 1)
    return [r for r, _ in found], [s for _, s in found], most


@pytest.fixture(scope="module")
def base_index(tmp_path_factory, tiny_model):
    where = tmp_path_factory.mktemp("shown")
    build_index(write_csv(where / "base.csv", BASE), where / "idx", Strategy(model=tiny_model))
    return where / "idx"


def test_keyword_hits_show_scores_in_their_order_in_0_1(base_index):
    """A keyword hit's score is its BM25 over the most the question's words could give: hits are
    listed by the score they show (never one above the hit before it), each in [0, 1)."""
    engine = SearchEngine(base_index)
    rng = random.Random(17)
    vocabulary = sorted({w for _, text, _ in BASE for w in text.split()} | {"zebra"})
    questions = SHOWN + [" ".join(rng.choices(vocabulary, k=rng.randint(1, 6))) for _ in range(60)]
    for query in questions:
        scores = [h.score for h in engine.search(query, k=len(BASE), mode="keyword")]
        assert all(0 <= s < 1 for s in scores), (query, scores)
        assert all(b <= a for a, b in zip(scores, scores[1:], strict=False)), (query, scores)


def test_keyword_hits_stand_in_fts5s_order_scored_by_bm25_over_its_bound(base_index):
    """The order is FTS5's bm25() order, as it was; the score is that BM25 over the sum, over the
    question's phrases, of FTS5's IDF times k1 + 1 (0 where no word of the question weighs
    anything: no keyword evidence)."""
    from indexer.store import open_index

    engine = SearchEngine(base_index)
    index = open_index(base_index, vectors=False)
    catalog = index.catalog
    rng = random.Random(4)
    vocabulary = sorted({w for _, text, _ in BASE for w in text.split()} | {"zebra"})
    questions = SHOWN + [" ".join(rng.choices(vocabulary, k=rng.randint(1, 6))) for _ in range(60)]
    for query in questions:
        words = Words(query, "keyword")
        for k in (1, 3, len(BASE)):
            hits = engine.search(query, k=k, mode="keyword")
            rowids, bm25, most = fts5_ranking(catalog, words, k)
            ids = engine.snapshot.ids(rowids)
            assert [h.id for h in hits] == [ids[r] for r in rowids], (query, k)
            weighs = any(keyword_scores(catalog, Words(query, "hybrid"), len(BASE)).values())
            expected = [s / most if weighs else 0.0 for s in bm25]
            assert [h.score for h in hits] == pytest.approx(expected, rel=1e-12, abs=1e-15), (query, k)


def test_hybrid_still_fuses_the_share(base_index):
    """Hybrid scores are the cosine mixed with the share of the question's words an entry holds
    (computed from the texts here), not with the keyword mode's BM25 score."""
    engine = SearchEngine(base_index)
    texts = [text for _, text, _ in BASE]
    position = {row[0]: i for i, row in enumerate(BASE)}
    for query in SHOWN:
        dense = {h.id: h.score for h in engine.search(query, k=len(BASE), mode="dense")}
        hits = engine.search(query, k=10, mode="hybrid")
        assert hits, query
        for hit in hits:
            share = held_share(texts, texts[position[hit.id]], query.split())
            fused = (1 - DEFAULT_WEIGHT) * dense[hit.id] + DEFAULT_WEIGHT * share
            assert hit.score == pytest.approx(fused, abs=1e-6), (query, hit.id)


def test_a_keyword_rule_fitted_on_the_share_is_not_applied(base_index, tmp_path):
    """A keyword-mode rule stored before the keyword score was BM25 over its bound was fitted on
    the share: it is not applied (the hits are unmarked, and the note says to refit it); one
    fitted on the score it reads is."""
    import shutil

    from indexer.store import Change, apply_change
    from search.read.confidence import Rule

    index = tmp_path / "idx"
    shutil.copytree(base_index, index)
    rule = Rule(("score",), (0.5,), (0.1,), (10.0,), 0.0, 0.5, 0.95, 1.0, 1.0, 10, mode="keyword")
    old = rule.to_dict()
    old.pop("keyword_score", None)
    apply_change(index, Change(meta={"calibration": {"keyword": old}}))
    engine = SearchEngine(index)
    hits = engine.search("7 billing", k=3, mode="keyword")
    assert hits and all(h.answered is None and h.confidence is None for h in hits)
    note = engine.no_rule_note("keyword")
    assert note is not None and "semsearch calibrate INDEX --mode keyword" in note
    assert engine.snapshot.rules == {}
    apply_change(index, Change(meta={"calibration": {"keyword": rule.to_dict()}}))
    engine = SearchEngine(index)
    hits = engine.search("7 billing", k=3, mode="keyword")
    assert hits and all(h.answered is not None and h.confidence is not None for h in hits)
    assert engine.no_rule_note("keyword") is None
