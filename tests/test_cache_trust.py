"""What semsearch keeps beside a model is never trusted blindly: a model file's cached hash is
keyed by what no rewrite keeps (inode and change time beside size and modification time), an
index owns copies of the model's config and tokenizer (nothing done to the model's folder changes
or breaks it), and a cached graph is checked against the sums its export wrote before an index
holds it or an encoder loads it; what an export killed half-way left in the cache is cleared."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from indexer import Strategy, build_index
from indexer.embedding.graphs import graph_spec
from indexer.embedding.models import identified, model_fingerprint
from indexer.errors import StrategyConflict
from indexer.store import open_index, verify
from tests.helpers import random_bert, write_csv

pytest.importorskip("onnxruntime")

QUESTIONS = [
    ("q1", "How do I pay for a ride with my card?"),
    ("q2", "Where can I leave the bike at night?"),
    ("q3", "Can I get my money back after a cancelled trip?"),
]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("SEMSEARCH_CACHE", str(cache))
    return cache


def faq_index(directory: Path, model: str, **strategy: object) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    corpus = write_csv(directory / "faq.csv", QUESTIONS, ("id", "text"))
    build_index(corpus, directory / "idx", Strategy(model=model, layers=(-1,), pooling="mean", **strategy))
    return directory / "idx"


def rewrite_keeping_size_and_time(path: Path, change: bytes, at: int) -> None:
    """``change`` written over ``path`` at byte ``at``, its modification time then set back."""
    before = path.stat()
    with path.open("r+b") as f:
        f.seek(at)
        f.write(change)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size and path.stat().st_mtime_ns == before.st_mtime_ns


def test_weights_rewritten_to_the_same_size_and_time_are_another_model_named(tmp_path):
    model = random_bert(tmp_path / "model")
    stored = identified(Strategy(model=model))
    weights = Path(model) / "model.safetensors"
    rewrite_keeping_size_and_time(weights, b"\x7f" * 64, weights.stat().st_size // 2)
    assert model_fingerprint(model) != stored.model_fingerprint
    with pytest.raises(StrategyConflict, match=r"has changed .*\(model\.safetensors: "):
        identified(stored)


def test_a_changed_model_is_named_whichever_cache_the_process_fingerprinted_it_in(tmp_path, monkeypatch):
    """The same model fingerprinted under one cache, then another (as each test, or each
    ``$SEMSEARCH_CACHE`` of a long-lived process): the second cache keeps its file hashes too."""
    model = random_bert(tmp_path / "model")
    identified(Strategy(model=model))
    monkeypatch.setenv("SEMSEARCH_CACHE", str(tmp_path / "another-cache"))
    stored = identified(Strategy(model=model))
    weights = Path(model) / "model.safetensors"
    rewrite_keeping_size_and_time(weights, b"\x7f" * 64, weights.stat().st_size // 2)
    with pytest.raises(StrategyConflict, match=r"has changed .*\(model\.safetensors: "):
        identified(stored)


def test_nothing_done_to_the_model_folder_changes_or_breaks_an_index(tmp_path):
    from search.read.engine import SearchEngine

    model = random_bert(tmp_path / "model")
    index = faq_index(tmp_path, model)
    version = open_index(index, vectors=False).version
    for name in ("config.json", "tokenizer.json"):  # the index's own copies
        assert (version / name).stat().st_ino != (Path(model) / name).stat().st_ino
    question = "where do I leave my bike"
    before = [(h.id, round(h.score, 5)) for h in SearchEngine(index).search(question, k=3, mode="dense")]
    tokenizer = Path(model) / "tokenizer.json"
    rewrite_keeping_size_and_time(tokenizer, b'"bikx":', tokenizer.read_bytes().index(b'"bike":'))
    with (Path(model) / "config.json").open("a", encoding="utf-8") as f:
        f.write("\n")
    verify(index)  # every file of the index as it was written
    after = [(h.id, round(h.score, 5)) for h in SearchEngine(index).search(question, k=3, mode="dense")]
    assert after == before


@pytest.mark.parametrize(("backend", "damage"), [("onnx", "garbled"), ("onnx-int8", "truncated")])
def test_a_damaged_cached_graph_is_exported_again_with_a_note(tmp_path, backend, damage, capsys):
    model = random_bert(tmp_path / "model")
    first = open_index(faq_index(tmp_path / "a", model, backend=backend), vectors=False)
    spec = graph_spec(first.strategy)
    assert spec.exported and spec.sums.is_file()
    whole = spec.weights.read_bytes()
    if damage == "truncated":
        os.truncate(spec.weights, len(whole) // 2)
    else:
        rewrite_keeping_size_and_time(spec.weights, bytes(b ^ 0x10 for b in whole[-4096:]), len(whole) - 4096)
    capsys.readouterr()
    second = open_index(faq_index(tmp_path / "b", model, backend=backend), vectors=False)
    notes = [line for line in capsys.readouterr().err.splitlines() if spec.weights.name in line]
    assert len(notes) == 1 and "exporting it again" in notes[0], notes
    assert second.meta.graph == spec.key()
    assert (second.version / spec.weights.name).read_bytes() == whole == spec.weights.read_bytes()
    verify(second.path)


def gone_pid() -> int:
    """A process id no process has now."""
    pid = int(Path("/proc/sys/kernel/pid_max").read_text()) - 1
    while Path(f"/proc/{pid}").exists():
        pid -= 1
    return pid


def test_what_an_export_killed_half_way_left_is_cleared_and_a_running_ones_kept(tmp_path, private_cache):
    from indexer.encoders.factory import encoder_for

    onnx = private_cache / "onnx"
    host = socket.gethostname()
    made = {
        "dead": onnx / f"export-{gone_pid()}-{host}-a1b2",
        "running": onnx / f"export-{os.getppid()}-{host}-c3d4",
        "old": onnx / "tmpk2j3h4",  # an export's left-over of before, two days old
        "recent": onnx / "tmpq9w8e7",
    }
    for folder in made.values():
        folder.mkdir(parents=True)
        (folder / "plain.onnx").write_bytes(b"half")
    two_days = made["old"].stat().st_mtime - 2 * 86400
    os.utime(made["old"], (two_days, two_days))
    encoder_for(Strategy(model=random_bert(tmp_path / "model"), layers=(-1,), pooling="mean"))
    assert {name for name, folder in made.items() if folder.exists()} == {"running", "recent"}
