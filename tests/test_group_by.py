"""``group_by``: the best hit per value of a stored field (one FAQ question with several answers
shows once), k groups, each hit with the count of the other entries of its group. A library
feature (``Snapshot.run``) the CLI, ``/search`` and the page pass through."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from indexer import Strategy, build_index
from indexer.errors import BadInput
from search.cli import cli
from search.read.engine import SearchEngine
from tests.helpers import write_csv

THREADS = ["pay", "park", "refund", "app", "lock", "helmet"]
ROWS = [
    (f"e{i}", f"answer {i} about {thread} and rides", "" if i % 7 == 0 else thread, "xy"[i % 2])
    for i, thread in ((i, THREADS[(i * i + i // 10) % 6]) for i in range(40))
]
"""Forty entries in six threads of unequal sizes; every seventh has no thread (its own group)."""


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, tiny_model: str) -> Path:
    directory = tmp_path_factory.mktemp("groups")
    corpus = write_csv(directory / "faq.csv", ROWS, ("id", "text", "thread", "half"))
    build_index(corpus, directory / "idx", Strategy(model=tiny_model))
    return directory / "idx"


@pytest.fixture(scope="module")
def engine(index: Path) -> SearchEngine:
    return SearchEngine(index)


def expected(engine: SearchEngine, query: str, k: int, where: str | None = None) -> list[tuple[str, int]]:
    """(id, others) of the grouped answer, derived from the whole ungrouped ranking: the first
    entry of each thread in rank order, and how many more entries the filter admits in it."""
    ranked = engine.search(query, k=len(ROWS), where=where)
    sizes = Counter(h.fields.get("thread") for h in ranked)
    heads, seen = [], set()
    for hit in ranked:
        value = hit.fields.get("thread")
        if value is None:
            heads.append((hit.id, 0))
        elif value not in seen:
            seen.add(value)
            heads.append((hit.id, sizes[value] - 1))
    return heads[:k]


@pytest.mark.parametrize("k", [1, 3, 6, 20])
def test_the_best_hit_of_each_group_with_its_others_counted(engine, k):
    hits = engine.search("where do I pay for rides", k=k, group_by="thread")
    assert [(h.id, h.others) for h in hits] == expected(engine, "where do I pay for rides", k)
    assert [h.rank for h in hits] == list(range(1, len(hits) + 1))
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    valued = [h.fields["thread"] for h in hits if h.fields.get("thread") is not None]
    assert len(valued) == len(set(valued))


def test_groups_count_only_what_the_filter_admits(engine):
    where = "half = 'y'"
    hits = engine.search("refund", k=10, where=where, group_by="thread")
    assert [(h.id, h.others) for h in hits] == expected(engine, "refund", 10, where)
    assert hits and all(h.fields["half"] == "y" for h in hits)


def test_ungrouped_hits_carry_no_count(engine):
    assert {h.others for h in engine.search("refund", k=5)} == {None}


def test_an_unknown_field_names_the_fields(engine):
    named = r"group by: unknown field 'thred'; fields are: half, id, text, thread"
    with pytest.raises(BadInput, match=named):
        engine.search("refund", group_by="thred")


def test_cli_groups_and_says_how_many_more(index, engine):
    result = CliRunner().invoke(cli, ["query", str(index), "refund", "-k", "6", "--group-by", "thread"])
    assert result.exit_code == 0, result.output
    said = [line.split()[0] for line in result.output.splitlines() if line.endswith("more in this thread")]
    hits = engine.search("refund", k=6, group_by="thread")
    assert said == [f"+{h.others}" for h in hits if h.others]
    bad = CliRunner().invoke(cli, ["query", str(index), "refund", "--group-by", "nope"])
    assert bad.exit_code != 0 and "fields are: half, id, text, thread" in bad.output


def test_server_groups_and_refuses_an_unknown_field(index, engine):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from search.server import create_app

    with TestClient(create_app(index), raise_server_exceptions=False) as client:
        answer = client.post("/search", json={"query": "refund", "k": 4, "group_by": "thread"})
        assert answer.status_code == 200, answer.text
        assert [(h["id"], h["others"]) for h in answer.json()["hits"]] == expected(engine, "refund", 4)
        batch = client.post("/search/batch", json={"queries": ["refund"], "k": 4, "group_by": "thread"})
        assert batch.json()["results"][0]["hits"] == answer.json()["hits"]
        bad = client.post("/search", json={"query": "refund", "group_by": "nope"})
        assert bad.status_code == 400 and "fields are" in bad.json()["error"]
