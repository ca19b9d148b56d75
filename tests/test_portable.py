"""An index is self-contained: each version holds the graph its queries run and the model's
tokenizer and config (``indexer.store.held``), so a copy answers on a machine with an empty cache,
no torch and no model, and ``semsearch export-encoder`` hands the index's whole strategy to other
programs as one ONNX model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from indexer import Strategy, build_index
from indexer.embedding.graphs import HELD_FILES, graph_spec
from indexer.errors import IndexDamaged
from indexer.store import open_index
from indexer.writing.update import compact_index
from search.read.info import index_info
from tests.helpers import ROOT, assert_keywords_exact, random_bert, write_csv

pytest.importorskip("onnxruntime")

QUESTIONS = [
    ("q1", "How do I pay for a ride with my card?"),
    ("q2", "Where can I leave the bike at night?"),
    ("q3", "Can I get my money back after a cancelled trip?"),
    ("q4", "Is there a phone app for booking?"),
    ("q5", "What happens when the lock is broken?"),
    ("q6", "How far can I ride on one charge?"),
]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "home-cache"
    monkeypatch.setenv("SEMSEARCH_CACHE", str(cache))
    return cache


def faq_index(directory: Path, model: str, **strategy: object) -> Path:
    corpus = write_csv(directory / "faq.csv", QUESTIONS, ("id", "text"))
    build_index(corpus, directory / "idx", Strategy(model=model, **strategy))
    return directory / "idx"


def held_names(index: Path) -> list[str]:
    stored = open_index(index, vectors=False)
    assert stored.meta.graph is not None
    return [f"{stored.meta.graph}.onnx", f"{stored.meta.graph}.onnx.data", *HELD_FILES]


def test_a_version_holds_its_query_graph_as_links_of_the_cache_and_its_tokenizer(tmp_path):
    model = random_bert(tmp_path / "model")
    index = faq_index(tmp_path, model, layers=(1, 3), pooling="mean")
    stored = open_index(index, vectors=False)
    spec = graph_spec(stored.strategy)
    assert stored.meta.graph == spec.key()
    for name in held_names(index):
        assert (stored.version / name).is_file(), name
        assert name in stored.meta.files  # sizes and checksums, like every file of the version
    # hard links: the weights cost their bytes once on a disk, however many indexes hold them
    assert (stored.version / spec.weights.name).stat().st_ino == spec.weights.stat().st_ino
    info = index_info(index)
    assert info["encoder"] == "onnx"
    held = sum((stored.version / name).stat().st_size for name in held_names(index))
    assert info["graph_bytes"] == held and info["size_bytes"] > held


def test_a_change_carries_the_graph_into_the_new_version_without_the_cache(tmp_path, private_cache):
    model = random_bert(tmp_path / "model")
    index = faq_index(tmp_path, model, layers=(2,), pooling="cls")
    before = open_index(index, vectors=False)
    weights = before.version / f"{before.meta.graph}.onnx.data"
    shutil.rmtree(private_cache)
    compact_index(index)
    after = open_index(index, vectors=False)
    assert after.version != before.version and after.meta.graph == before.meta.graph
    assert (after.version / weights.name).stat().st_ino == weights.stat().st_ino
    assert index_info(index)["encoder"] == "onnx"


def test_a_copied_index_takes_additions_without_its_model_or_the_cache(tmp_path, private_cache):
    """What is added to an index is embedded by the graph it holds (the network its vectors came
    from), so a copy can grow where the model and the cache are not."""
    from indexer.writing.update import add_to_index
    from search.read.engine import SearchEngine

    model = random_bert(tmp_path / "model")
    index = faq_index(tmp_path, model, layers=(-1,), pooling="mean")
    copy = tmp_path / "elsewhere" / "idx"
    shutil.copytree(index, copy)
    shutil.rmtree(model)
    shutil.rmtree(private_cache)
    more = write_csv(tmp_path / "more.csv", [("q7", "Do you lend helmets to riders?")], ("id", "text"))
    add_to_index(copy, more)
    hits = SearchEngine(copy).search("Do you lend helmets to riders?", k=1, mode="dense")
    assert hits[0].id == "q7" and hits[0].score > 0.999
    assert_keywords_exact(copy)  # the copy's keyword table came with it and took the addition
    assert SearchEngine(copy).search("helmets", k=1, mode="keyword")[0].id == "q7"
    # and it gives its vectors away as its own queries see them
    from search.read.encoding import encode

    engine = SearchEngine(copy)
    texts = [q for _, q in QUESTIONS]
    assert abs(encode(texts, index=copy) - engine.snapshot.embed(texts)).max() < 1e-5


def test_a_damaged_held_graph_is_named_when_the_index_opens(tmp_path):
    model = random_bert(tmp_path / "model")
    index = faq_index(tmp_path, model, layers=(1,))
    stored = open_index(index, vectors=False)
    weights = stored.version / f"{stored.meta.graph}.onnx.data"
    copy = weights.read_bytes()
    weights.unlink()  # a link: the cache's file stays whole
    weights.write_bytes(copy[: len(copy) // 2])
    with pytest.raises(IndexDamaged, match=weights.name):
        open_index(index)


BLOCK_TORCH = """
import sys
for name in ("torch", "transformers", "sentence_transformers"):
    sys.modules[name] = None  # importing it now raises ImportError, as where it is not installed
from search.cli import main
sys.argv = ["semsearch", "query", sys.argv[1], sys.argv[2], "-k", "1", "--json"]
main()
"""


def query_elsewhere(index: Path, question: str, cache: Path) -> subprocess.CompletedProcess:
    """`semsearch query --json` in a process that cannot import torch, with ``cache`` as its cache."""
    return subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH, str(index), question],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "SEMSEARCH_CACHE": str(cache)},
        timeout=300,
    )


def first_answer(result: subprocess.CompletedProcess) -> tuple[str, float]:
    """The first hit's id and score, from the process that must have answered."""
    assert result.returncode == 0, result.stderr
    hit = json.loads(result.stdout)["hits"][0]
    return hit["id"], round(hit["score"], 5)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["tiny", "bundled"])
def test_a_copied_index_answers_with_an_empty_cache_no_torch_and_no_model(tmp_path, which, private_cache):
    if which == "tiny":
        model = random_bert(tmp_path / "model")
        index = faq_index(tmp_path, model, layers=(-1,), pooling="mean")
    else:
        model = None
        index = faq_index(tmp_path, Strategy().model)
    question = "can I have a refund for a cancelled trip?"
    home = first_answer(query_elsewhere(index, question, private_cache))
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(index, elsewhere / "idx")  # a plain copy: the links become files of their own
    if model is not None:
        shutil.rmtree(model)  # the other machine has no model at that path
    empty = tmp_path / "empty-cache"
    result = query_elsewhere(elsewhere / "idx", question, empty)
    assert first_answer(result) == home
    assert not empty.exists() or not any(empty.rglob("*.onnx*"))  # nothing exported there
