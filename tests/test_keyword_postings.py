"""Keyword rankings summed from the phrases' kept postings (``indexer.catalog.postings``) are
FTS5's own: the same entries in the same order with the same held weights, and the same hybrid
hits and scores, on random queries over hostile entries; the kept postings follow an update."""

from __future__ import annotations

import random

import pytest

from indexer import Strategy, build_index
from indexer.catalog import Catalog
from indexer.reading.corpus import Entry
from search import SearchEngine
from search.read.hybrid import Words, word_weight
from tests.helpers import write_csv

COMMON = ["how", "do", "I", "the", "it"]
RARE = ["paused", "phones", "e-mail", "E3453C", "v2", "café", "naïve", "running", "runs", "x_y"]
ABSENT = ["blork", "tump", '"quoted"', "NEAR(a b)", "col:x", "OR", "*"]


def hostile_entries(rng: random.Random, n: int) -> list[str]:
    """Short, long and repetitive entries over common and rare words, codes, hyphenated and
    accented words: many entries tie, many hold every common word."""
    texts = []
    for _ in range(n):
        words = [w for w in COMMON if rng.random() < 0.6] + rng.sample(RARE, rng.choice([0, 1, 1, 2, 3]))
        if words and rng.random() < 0.3:
            words += [rng.choice(words)] * rng.randint(1, 8)
        words += ["filler"] * rng.choice([0, 0, 5, 40])
        rng.shuffle(words)
        texts.append(" ".join(words) or "nothing")
    return texts


def random_query(rng: random.Random) -> str:
    words = rng.sample(COMMON + RARE + ABSENT, rng.randint(1, 9))
    return " ".join(w.upper() if rng.random() < 0.2 else w for w in words)


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    rng = random.Random(11)
    texts = hostile_entries(rng, 160)
    catalog = Catalog.create(tmp_path_factory.mktemp("postings") / "meta.db", {})
    catalog.put([Entry(str(i), t, {}) for i, t in enumerate(texts)], range(len(texts)), [1] * len(texts))
    catalog.commit()
    yield catalog
    catalog.close()


def plain(catalog: Catalog, words: Words, k: int, allowed: list[int] | None):
    """The ranking as FTS5 gives it: its frequencies, then its BM25 order, outside a checked read."""
    total, holding = catalog.keyword_frequencies(words.phrases)
    weights = [word_weight(total, n) for n in holding]
    return holding, catalog.keyword_search(words.match, k, allowed, words.phrases, weights), weights


@pytest.mark.parametrize("span", [8, 0])  # 0: summed by position, as row ids spread far apart are
def test_random_queries_rank_as_fts5_ranks_them(table, monkeypatch, span):
    import indexer.catalog.postings as postings

    monkeypatch.setattr(postings, "SPAN", span)
    rng = random.Random(3)
    fast_used = 0
    for _ in range(400):
        words = Words(random_query(rng), "hybrid")
        if words.match is None:
            continue
        k = rng.choice([1, 5, 40, 100, 1000])
        allowed = sorted(rng.sample(range(160), rng.randint(0, 160))) if rng.random() < 0.3 else None
        holding, expected, weights = plain(table, words, k, allowed)
        with table.reading_at(table.generation()):
            kept = table._postings()
            total, counted = table.keyword_frequencies(words.phrases)
            found = table.keyword_ranking(words.phrases, k, allowed, weights)
            fast_used += all(kept.posting(table.db, p).terms is not None for p in words.phrases)
        assert counted == holding, words.text
        assert found == expected, words.text  # the same entries, order and held weights, bit for bit
    assert fast_used > 300


def test_a_phrase_too_many_entries_hold_is_ranked_by_fts5(table, monkeypatch):
    import indexer.catalog.postings as postings

    words = Words("how do I pay with phones", "hybrid")
    holding, expected, weights = plain(table, words, 30, None)
    fresh = Catalog(table.path)
    monkeypatch.setattr(fresh, "_kept", postings.Postings(rows=20))
    with fresh.reading_at(fresh.generation()):
        assert fresh.keyword_frequencies(words.phrases)[1] == holding
        assert fresh._postings().posting(fresh.db, '"how"').terms is None
        assert fresh.keyword_ranking(words.phrases, 30, None, weights) == expected
    fresh.close()


def test_kept_postings_follow_an_update_that_commits_a_new_generation(tmp_path):
    texts = ["phones paused", "phones", "how do I pay", "paused again"] * 5
    writer = Catalog.create(tmp_path / "meta.db", {})
    writer.put([Entry(str(i), t, {}) for i, t in enumerate(texts)], range(len(texts)), [1] * len(texts))
    writer.commit()
    reader = Catalog(tmp_path / "meta.db")
    words = Words("phones paused", "hybrid")
    with reader.reading_at(0):
        before = reader.keyword_frequencies(words.phrases)
    more = [Entry(f"n{i}", "phones everywhere", {}) for i in range(10)]
    writer.put(more, range(100, 110), [1] * 10)
    writer.write_meta({"generation": 1})
    writer.commit()
    holding, expected, weights = plain(reader, words, 50, None)
    with reader.reading_at(1):
        after = reader.keyword_frequencies(words.phrases)
        assert reader.keyword_ranking(words.phrases, 50, None, weights) == expected
    assert before == (20, [10, 10]) and after == (30, holding) == (30, [20, 10])
    reader.close()
    writer.close()


@pytest.mark.parametrize("also", [False, True])
def test_hybrid_hits_and_scores_are_those_of_fts5s_own_ranking(tmp_path, tiny_model, monkeypatch, also):
    rng = random.Random(23 + also)
    rows = [(f"e{i}", text, rng.choice(RARE)) for i, text in enumerate(hostile_entries(rng, 240))]
    fields = {"text_fields": ["text"], "also": ["text", "topic"]} if also else {}
    corpus = write_csv(tmp_path / "c.csv", rows, ("id", "text", "topic"))
    build_index(corpus, tmp_path / "idx", Strategy(model=tiny_model), **fields)
    queries = [random_query(rng) for _ in range(60)]
    searches = [
        dict(k=k, where=where, group_by=group_by, mode=mode)
        for k, where, group_by in ((5, None, None), (20, "topic != 'v2'", None), (3, None, "topic"))
        for mode in ("hybrid", "keyword")
    ]
    engine = SearchEngine(tmp_path / "idx")  # one engine: its kept postings serve every search
    kept = [engine.search_many(queries, **how) for how in searches]
    monkeypatch.setattr(Catalog, "_postings", lambda self: None)
    engine = SearchEngine(tmp_path / "idx")
    whole = [engine.search_many(queries, **how) for how in searches]
    assert kept == whole


def test_the_kept_postings_stay_within_their_bytes_whatever_words_are_asked(table):
    """Each kept posting counts its bytes against the bound, its word's included, and words no
    entry holds, or too many do, are kept too (their counts): a stream of long made-up words
    cannot grow the store past the bound, measured by what Python allocates."""
    import tracemalloc

    from indexer.catalog.postings import Postings

    bound = 1 << 20
    kept = Postings(rows=20, kept=bound)
    tracemalloc.start()
    try:
        kept.posting(table.db, '"how"')
        before = tracemalloc.get_traced_memory()[0]
        for i in range(2_000):
            kept.posting(table.db, '"' + f"{i:04d}" + "madeup" * 333 + '"')  # 2,004 characters, made now
            kept.posting(table.db, '"phones"' if i % 2 else '"filler"')
            assert kept.held <= bound
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 100 < len(kept) < 2_000
    assert grown <= bound * 1.25, grown
