"""``--trust-remote-code``: a model with code of its own (``auto_map`` in its ``config.json``) is
refused in one line naming the flag unless it is given (by ``index``, ``evaluate``, ``sweep``,
``tune`` and a shard's worker alike); with it, the model loads as transformers
loads it with ``trust_remote_code=True`` and its vectors equal sentence-transformers'
``SentenceTransformer(path, trust_remote_code=True)``. The index records it (its strategy's
``remote_code``, ``info``), and every later command on that index asks for the flag again, but a
keyword search, which runs no model. The
model's code is written here, tiny, nothing downloaded."""

from __future__ import annotations

import numpy as np
import pytest

from indexer.embedding.strategy import Strategy
from indexer.encoders.factory import encoder_for
from indexer.encoders.options import EmbeddingOptions
from indexer.errors import BadInput
from search.studies.evaluate import Pairs
from search.studies.sweep import sweep_sts
from tests.helpers import remote_code_folder, run

TEXTS = ["the bike station near the river", "a broken lock", "billing questions about the app and the map"]
TRUSTED = EmbeddingOptions(trust_remote_code=True)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A sentence-transformers folder (mean pooling, Normalize) of a network with its own code."""
    return remote_code_folder(tmp_path_factory.mktemp("remote") / "model")


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path_factory.getbasetemp() / "remote-cache"))


def reference(folder: str) -> tuple[np.ndarray, np.ndarray]:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(folder, device="cpu", local_files_only=True, trust_remote_code=True)
    return (
        model.encode_query(TEXTS, normalize_embeddings=True),
        model.encode_document(TEXTS, normalize_embeddings=True),
    )


def test_without_the_flag_the_model_is_refused_naming_it(folder):
    for backend in ("torch", "onnx"):
        with pytest.raises(
            BadInput, match=r"needs code of its own .* give --trust-remote-code if you trust it"
        ):
            encoder_for(Strategy(model=folder, backend=backend))


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_with_the_flag_its_vectors_equal_sentence_transformers_trusting_it(folder, backend):
    encoder = encoder_for(Strategy(model=folder, backend=backend), TRUSTED)
    assert encoder.strategy.remote_code and "remote-code" in encoder.strategy.describe()
    queries, documents = reference(folder)
    np.testing.assert_allclose(encoder.embed(TEXTS, role="query"), queries, atol=1e-4)
    np.testing.assert_allclose(encoder.embed(TEXTS, role="passage"), documents, atol=1e-4)


def test_the_index_records_it_and_every_later_command_asks_again(folder, tmp_path):
    from indexer import build_index
    from indexer.writing.update import add_to_index
    from search.read.encoding import Encoding
    from search.read.engine import SearchEngine

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    with pytest.raises(BadInput, match="--trust-remote-code"):
        build_index(corpus, tmp_path / "index", Strategy(model=folder))
    assert not (tmp_path / "index").exists()
    build_index(corpus, tmp_path / "index", Strategy(model=folder), options=TRUSTED)
    again = r"runs code of its own: give --trust-remote-code again to embed with it"
    with pytest.raises(BadInput, match=again):
        SearchEngine(tmp_path / "index").search("a broken lock")
    with pytest.raises(BadInput, match=again):
        Encoding.load(index=tmp_path / "index")
    more = tmp_path / "more.txt"
    more.write_text("a new line about the river\n", encoding="utf-8")
    with pytest.raises(BadInput, match=again):
        add_to_index(tmp_path / "index", more)
    engine = SearchEngine(tmp_path / "index", options=TRUSTED)
    assert engine.strategy.remote_code
    np.testing.assert_allclose(engine.snapshot.embed(TEXTS), reference(folder)[0], atol=1e-4)
    add_to_index(tmp_path / "index", more, options=TRUSTED)


def test_a_keyword_search_needs_no_flag_and_loads_no_model(folder, tmp_path, monkeypatch):
    """No model runs in keyword mode, so its searches answer without the flag (the engine, the
    server) and load nothing; every search that embeds its query still asks for the flag, and
    so does every server route that runs the model (a 400 naming it)."""
    from fastapi.testclient import TestClient

    from indexer import build_index
    from search.read import engine as engines
    from search.read.engine import SearchEngine
    from search.server import create_app

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    build_index(corpus, tmp_path / "index", Strategy(model=folder), options=TRUSTED)

    def no_model(*_: object, **__: object) -> None:
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(engines, "encoder_for", no_model)
    engine = SearchEngine(tmp_path / "index")
    assert engine.refused is not None and "--trust-remote-code" in engine.refused
    assert [h.text for h in engine.search("a broken lock", k=1, mode="keyword")] == ["a broken lock"]
    again = r"runs code of its own: give --trust-remote-code again to embed with it"
    for mode in (None, "dense", "hybrid"):
        with pytest.raises(BadInput, match=again):
            engine.search("a broken lock", mode=mode)
    with TestClient(create_app(tmp_path / "index")) as client:
        found = client.post("/search", json={"query": "a broken lock", "k": 1, "mode": "keyword"})
        assert found.status_code == 200 and found.json()["hits"][0]["text"] == "a broken lock", found.text
        batch = client.post("/search/batch", json={"queries": ["a broken lock", "river"], "mode": "keyword"})
        assert batch.status_code == 200, batch.text
        assert client.get("/info").status_code == 200
        for path, body in (
            ("/search", {"query": "a broken lock"}),
            ("/search", {"query": "a broken lock", "mode": "dense"}),
            ("/similar", {"sentence": "x", "candidates": ["x", "y"]}),
            ("/v1/embeddings", {"input": ["x"]}),
        ):
            refused = client.post(path, json=body)
            assert refused.status_code == 400 and "--trust-remote-code again" in refused.text, refused.text


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_the_cli_asks_for_the_flag_on_every_command(folder, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    index = tmp_path / "index"
    refused = run("index", corpus, "-o", index, "--model", folder)
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.returncode != 0 and len(lines) == 1 and "--trust-remote-code" in lines[0], refused.stderr
    built = run("index", corpus, "-o", index, "--model", folder, "--trust-remote-code")
    assert built.returncode == 0, built.stderr
    assert "remote-code" in run("info", index).stdout
    for command in (
        ["query", index, "a broken lock"],
        ["query", index, "a broken lock", "--mode", "hybrid"],
        ["add", index, corpus],
    ):
        without = run(*command)
        said = [line for line in without.stderr.splitlines() if line.strip()]
        assert without.returncode != 0 and "Traceback" not in without.stderr, without.stderr
        assert said[-1].startswith("Error: ") and "--trust-remote-code again" in said[-1], without.stderr
    answered = run("query", index, "a broken lock", "--json", "--trust-remote-code")
    assert answered.returncode == 0 and "a broken lock" in answered.stdout, answered.stderr
    keyword = run("query", index, "a broken lock", "--json", "--mode", "keyword")  # no model runs
    assert keyword.returncode == 0 and '"text": "a broken lock"' in keyword.stdout, keyword.stderr


def test_a_shard_embeds_it_under_the_flag_and_merges_into_an_index_that_asks_for_it(folder, tmp_path):
    from indexer.reading.corpus import Entry
    from indexer.writing.shards import embed_shard, merge_shards
    from search.read.engine import SearchEngine

    entries = [Entry(f"e{i}", text, {}) for i, text in enumerate(TEXTS)]
    with pytest.raises(BadInput, match="--trust-remote-code"):
        embed_shard(entries, tmp_path / "refused", Strategy(model=folder))
    shard = embed_shard(entries, tmp_path / "shard", Strategy(model=folder), options=TRUSTED)
    merge_shards([shard], tmp_path / "index")
    engine = SearchEngine(tmp_path / "index", options=TRUSTED)
    assert engine.strategy.remote_code
    assert engine.search(TEXTS[1], k=1)[0].id == "e1"


PAIRS = Pairs(
    [TEXTS[0], TEXTS[1], TEXTS[2], "a lock that broke"],
    ["the river bike station", "the app's map", "questions about billing", TEXTS[1]],
    np.array([4.5, 0.5, 3.0, 4.8]),
)


def test_a_sweep_reads_it_under_the_flag_and_refuses_it_without(folder):
    with pytest.raises(BadInput, match="--trust-remote-code"):
        sweep_sts(PAIRS, Strategy(model=folder))
    cells = sweep_sts(PAIRS, Strategy(model=folder), options=TRUSTED)
    assert {c.strategy.layers for c in cells} >= {(0,), (1,), (2,)}  # every hidden state of its own code
    own = next(c for c in cells if c.strategy.layers == (2,) and c.strategy.pooling == "mean")
    encoder = encoder_for(Strategy(model=folder, backend="torch"), TRUSTED)
    first = encoder.embed(PAIRS.first, role="query")
    second = encoder.embed(PAIRS.second, role="query")
    from scipy.stats import spearmanr

    expected = 100 * spearmanr((first * second).sum(1), PAIRS.gold)[0]
    assert own.scores["spearman"] == pytest.approx(expected, abs=1e-6)


def test_tune_trains_it_under_the_flag_and_its_tuned_folder_asks_for_it_again(folder, tmp_path):
    from search.studies.tuning import read_labels, tune
    from tests.helpers import sentence

    scored = tmp_path / "scored.tsv"
    rows = [f"{sentence(i)}\t{sentence(i, 1 + i % 2)}\t{i % 6}" for i in range(40)]
    scored.write_text("sentence1\tsentence2\tscore\n" + "\n".join(rows) + "\n", encoding="utf-8")
    labels = read_labels(pairs=scored)
    with pytest.raises(BadInput, match="--trust-remote-code"):
        tune(labels, tmp_path / "refused", Strategy(model=folder), epochs=1)
    tuned_dir = tmp_path / "tuned"
    done = tune(labels, tuned_dir, Strategy(model=folder), epochs=1, learning_rate=0.1, options=TRUSTED)
    assert done.steps > 0 and done.options.endswith("--trust-remote-code")
    with pytest.raises(BadInput, match="--trust-remote-code"):
        encoder_for(Strategy(model=str(tmp_path / "tuned")))
    from indexer.embedding.models import strategy_request

    asked, _ = strategy_request({"model": str(tuned_dir)})  # `index --model TUNED`: no index is involved
    with pytest.raises(BadInput, match="needs code of its own") as refused:
        encoder_for(asked)
    assert "index" not in str(refused.value)
    tuned = encoder_for(Strategy(model=str(tmp_path / "tuned")), TRUSTED)
    assert tuned.strategy.remote_code
    before = encoder_for(Strategy(model=folder), TRUSTED).embed(TEXTS, role="query")
    assert np.abs(tuned.embed(TEXTS, role="query") - before).max() > 1e-3  # its own weights, trained


@pytest.mark.slow
def test_the_study_commands_take_the_flag(folder, tmp_path):
    import csv

    from tests.helpers import run

    pairs = tmp_path / "pairs.csv"
    with pairs.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["sentence1", "sentence2", "score"])
        writer.writerows(zip(PAIRS.first, PAIRS.second, PAIRS.gold, strict=True))
    refused = run("sweep", "sts", pairs, "--model", folder)
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.returncode != 0 and len(lines) == 1 and "--trust-remote-code" in lines[0], refused.stderr
    swept = run("sweep", "sts", pairs, "--model", folder, "--trust-remote-code")
    assert swept.returncode == 0, swept.stderr
    assert "--trust-remote-code" in swept.stdout  # the index options that reproduce the best cell
    scored = run("evaluate", "sts", pairs, "--model", folder, "--trust-remote-code", "--json")
    assert scored.returncode == 0 and '"spearman"' in scored.stdout, scored.stderr


def test_its_code_rewritten_to_the_same_size_and_time_is_refused_naming_the_file_before_it_runs(
    folder, tmp_path
):
    """A model's code is hashed on every load: a file rewritten to the same length with its old
    modification time set back is a changed model, named before any of its code runs."""
    import os
    import shutil

    from indexer.errors import StrategyConflict

    copy = tmp_path / "swapped"
    shutil.copytree(folder, copy)
    stored = encoder_for(Strategy(model=str(copy), backend="torch"), TRUSTED).strategy
    code = copy / "modeling_tiny.py"
    before = code.stat()
    marker = tmp_path / "swapped-code-ran"
    swapped = f"open({str(marker)!r}, 'w').write('ran')\nraise ImportError('swapped')\n"
    code.write_text(swapped + "#" * (before.st_size - len(swapped) - 1) + "\n")
    os.utime(code, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert code.stat().st_size == before.st_size and code.stat().st_mtime_ns == before.st_mtime_ns
    with pytest.raises(StrategyConflict, match=r"has changed .*modeling_tiny\.py"):
        encoder_for(stored, TRUSTED)
    assert not marker.exists()
