"""``--ray``: an index embedded by Ray actors is the index a local build makes, a dead worker is
retried or fails the run before anything is written, and Ray stays optional.

One local Ray runtime (2 CPUs, 127.0.0.1 only) serves the whole module: starting one costs
seconds, so every test reuses it (``embed_on_ray`` joins a runtime already up in the process)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from indexer import BadInput, Strategy, build_index
from indexer.encoders.factory import encoder_for
from indexer.encoders.options import EmbeddingOptions
from indexer.errors import WorkerFailed
from indexer.store import live_version, open_index
from indexer.writing.update import add_to_index
from search import SearchEngine
from search.cli import cli
from tests.helpers import DATA

SIGTERM_BEFORE_RAY: list = []
"""The SIGTERM handler the process had before the module's Ray runtime started."""
QUESTIONS = ("can I pay with apple pay", "lost my phone on a bike", "helmet rules", "ünïcödé 🚲")
FIELDS = ["question", "answer"]


@pytest.fixture(scope="module")
def ray_runtime():
    if importlib.util.find_spec("ray") is None:  # not importorskip: Ray must be first imported by semsearch
        pytest.skip("Ray is not installed")
    from indexer.encoders.on_ray import connected

    SIGTERM_BEFORE_RAY.append(signal.getsignal(signal.SIGTERM))
    with connected("local", workers=2) as ray:
        yield ray


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The demo FAQ plus a row with no text, which both builds must reject and report."""
    path = tmp_path_factory.mktemp("corpus") / "faq.csv"
    text = (DATA / "demo_faq.csv").read_text(encoding="utf-8").rstrip("\n")
    header = text.splitlines()[0].split(",")
    path.write_text(text + "\n" + ",".join("empty-row" if h == "id" else "" for h in header) + "\n", "utf-8")
    return path


@pytest.fixture(scope="module")
def single(tmp_path_factory, tiny_model, corpus) -> Path:
    index = tmp_path_factory.mktemp("single") / "index"
    build_index(corpus, index, Strategy(model=tiny_model), text_fields=FIELDS)
    return index


def on_ray(strategy: Strategy, workers: int):
    """The factory's encoder for ``strategy`` on the module's local Ray runtime."""
    return encoder_for(strategy, EmbeddingOptions(device="cpu", ray="local", ray_workers=workers))


def assert_same_answers(a: Path, b: Path) -> None:
    one, other = SearchEngine(a), SearchEngine(b)
    for question in QUESTIONS:
        x, y = one.search(question, k=10), other.search(question, k=10)
        assert [h.id for h in x] == [h.id for h in y]
        np.testing.assert_allclose([h.score for h in x], [h.score for h in y], atol=1e-5)


@pytest.mark.slow
def test_the_local_runtime_stays_on_loopback(ray_runtime):
    """Every Ray server of a local runtime binds the node address, which must be 127.0.0.1."""
    assert ray_runtime.util.get_node_ip_address() == "127.0.0.1"
    assert ray_runtime.cluster_resources()["CPU"] == 2


@pytest.mark.slow
def test_a_running_ray_leaves_sigterm_to_the_process(ray_runtime):
    """Ray's driver swaps in a SIGTERM handler of its own (``sys.exit``): under pytest a ``kill``
    was one failing test and the suite ran on. The process keeps the handler it had."""
    assert signal.getsignal(signal.SIGTERM) is SIGTERM_BEFORE_RAY[0]


@pytest.mark.slow
def test_ray_build_ranks_like_a_single_build(ray_runtime, tmp_path, tiny_model, corpus, single):
    report = build_index(
        corpus,
        tmp_path / "ray",
        Strategy(model=tiny_model),
        text_fields=FIELDS,
        options=EmbeddingOptions(ray="local"),
    )
    assert report.entries == open_index(single).meta["count"]
    assert [r.row for r in report.rejected] and len(report.rejected) == 1  # the empty row, reported
    assert report.strategy.to_dict() == open_index(single).strategy.to_dict()
    assert_same_answers(tmp_path / "ray", single)


@pytest.mark.slow
def test_the_ray_encoder_embeds_as_the_local_one(ray_runtime, tiny_model, single):
    """An ``Encoder`` like the local one: queries truncated, documents chunked."""
    strategy = open_index(single).strategy.chunked(8)
    local, workers = encoder_for(strategy), on_ray(strategy, 2)
    texts = [*QUESTIONS, " ".join(["word"] * 300)]
    np.testing.assert_allclose(workers.embed(texts), local.embed(texts), atol=1e-5)
    vectors, owners = workers.embed_documents(texts)
    expected, expected_owners = local.embed_documents(texts)
    assert owners.tolist() == expected_owners.tolist() and len(owners) > len(texts)
    np.testing.assert_allclose(vectors, expected, atol=1e-5)


@pytest.mark.slow
def test_a_worker_killed_mid_run_is_restarted_and_its_partition_retried(
    ray_runtime, tmp_path, tiny_model, corpus, single
):
    marker = tmp_path / "died-once"

    def die_once(partition: int) -> None:
        if partition == 3 and not marker.exists():
            marker.touch()
            os._exit(1)

    from indexer.reading.corpus import read_corpus

    entries = read_corpus(corpus, text_fields=FIELDS).entries
    encoder = on_ray(open_index(single).strategy, 2)
    encoder.before_partition = die_once
    vectors, owners = encoder.embed_documents([e.text for e in entries])
    assert marker.exists()  # the worker did die on its partition
    assert len(vectors) == len(entries) and owners.tolist() == list(range(len(entries)))
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


@pytest.mark.slow
def test_a_worker_that_keeps_dying_fails_the_build_and_the_old_index_survives(
    ray_runtime, tmp_path, tiny_model, corpus, single, monkeypatch
):
    index = tmp_path / "index"
    shutil.copytree(single, index)
    before = live_version(index)

    def always_die(partition: int) -> None:
        if partition == 1:
            os._exit(1)

    from indexer.encoders import on_ray as distributed

    real = distributed.embed_on_ray
    monkeypatch.setattr(distributed, "RETRIES", 0)
    monkeypatch.setattr(
        distributed, "embed_on_ray", lambda *a, **k: real(*a, **{**k, "before_partition": always_die})
    )
    with pytest.raises(WorkerFailed, match="Ray worker"):
        build_index(
            corpus,
            index,
            Strategy(model=tiny_model),
            text_fields=FIELDS,
            options=EmbeddingOptions(ray="local", ray_workers=1),
        )
    assert live_version(index) == before and sorted(
        p.name for p in index.iterdir() if p.name.startswith("v-")
    ) == [before]
    assert_same_answers(index, single)


@pytest.mark.slow
def test_an_error_in_a_worker_comes_back_as_its_own_class(ray_runtime, tiny_model, corpus, single):
    def refuse(partition: int) -> None:
        raise BadInput(f"partition {partition} refused")

    from indexer.reading.corpus import read_corpus

    texts = [e.text for e in read_corpus(corpus, text_fields=FIELDS).entries]
    encoder = on_ray(open_index(single).strategy, 1)
    encoder.before_partition = refuse
    with pytest.raises(BadInput, match="refused"):
        encoder.embed_documents(texts[:5])
    with pytest.raises(BadInput, match="at least 1"):
        on_ray(open_index(single).strategy, 0)
    with pytest.raises(BadInput, match="nothing to embed"):
        on_ray(open_index(single).strategy, 1).embed_documents([])


@pytest.mark.slow
def test_info_records_what_the_ray_workers_embedded_with(
    ray_runtime, tmp_path, tiny_model, corpus, monkeypatch
):
    """The decision a Ray build records is the one its workers made: runtime, device, precision
    and batching, each worker's reported back with its partition (one that differs fails the run)."""
    from indexer.encoders import on_ray as distributed

    used = []
    real = distributed.embed_on_ray

    def reported(*args, **kwargs):
        vectors, owners, made = real(*args, **kwargs)
        used.extend(made)
        return vectors, owners, made

    monkeypatch.setattr(distributed, "embed_on_ray", reported)
    asked = Strategy(model=tiny_model)
    build_index(
        corpus,
        tmp_path / "ray",
        asked,
        text_fields=FIELDS,
        options=EmbeddingOptions(ray="local", ray_workers=1),
    )
    recorded = open_index(tmp_path / "ray").info()["embedded"]
    assert used and (recorded["ray"], recorded["workers"]) == ("local", 1)
    work = ("runtime", "device", "precision", "batching")
    for decision in used:
        assert decision.ray is None  # each worker embeds where it runs
        assert {k: decision.record()[k] for k in work} == {k: recorded[k] for k in work}


@pytest.mark.slow
def test_ray_add_and_cli(ray_runtime, tmp_path, tiny_model, corpus, single):
    """``semsearch index --ray --ray-workers 1`` then ``add --ray`` of new rows: the same index as
    the same add done locally."""
    extra = tmp_path / "extra.csv"
    extra.write_text(
        "id,question,answer\nnew-1,Can I ride in the rain?,Yes: brakes need more distance.\n"
        "new-2,Puis-je payer en espèces ?,Non 💳\n",
        encoding="utf-8",
    )
    runner = CliRunner()
    model = ["--model", tiny_model]
    made = runner.invoke(
        cli,
        [
            "index",
            str(corpus),
            "-o",
            str(tmp_path / "ray"),
            "--text-field",
            "question,answer",
            *model,
            "--ray",
            "--ray-workers",
            "1",
        ],
    )
    assert made.exit_code == 0, made.output
    added = runner.invoke(cli, ["add", str(tmp_path / "ray"), str(extra), "--ray"])
    assert added.exit_code == 0, added.output
    local = tmp_path / "local"
    shutil.copytree(single, local)
    add_to_index(local, extra)
    assert_same_answers(tmp_path / "ray", local)
    assert open_index(tmp_path / "ray").meta["count"] == open_index(single).meta["count"] + 2


def test_without_ray_installed_it_is_one_line(tmp_path, tiny_model, corpus, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if it were not installed
    result = CliRunner().invoke(
        cli,
        ["index", str(corpus), "-o", str(tmp_path / "i"), "--text-field", "question,answer"]
        + ["--model", tiny_model, "--ray"],
    )
    assert result.exit_code == 1 and "pip install 'semsearch[ray]'" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "i").exists()


@pytest.mark.slow
def test_an_address_where_nothing_listens_is_one_line_at_once(tmp_path, tiny_model, corpus):
    """Joining a cluster where nothing answers: Ray itself retries for minutes and shrugs off
    SIGTERM meanwhile; semsearch says so in one line well before (the guard below is no timing)."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed")
    import socket
    import subprocess

    with socket.socket() as probe:  # a port of this machine that nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        result = subprocess.run(
            [sys.executable, "-m", "search.cli", "index", str(corpus), "-o", str(tmp_path / "i")]
            + ["--text-field", "question,answer", "--model", tiny_model, "--ray", address],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 1, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "unexpected" not in lines[0], lines
        assert not (tmp_path / "i").exists()
