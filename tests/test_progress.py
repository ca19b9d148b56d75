"""Progress that moves: every long command shows one bar per task on a terminal, moving per batch
(not per 4,096-entry part) with its rate and time left; nothing in a pipe or with --quiet. The
commands run under a pseudo-terminal (``pty``), as a person at a terminal runs them."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import numpy as np
import pytest

from indexer import Strategy, build_index
from indexer.embedding.batching import Batching
from indexer.progress import Progress
from search.read.duplicates import range_pairs
from tests.helpers import clustered, run, write_csv

BAR = re.compile(
    r"(?P<desc>[a-z]+): +\d+%\|[^|\r\n]*\| *(?P<n>\d+)/(?P<total>\d+) \[[\d:]+<(?P<left>[\d:?]+), +\S+/s\]"
)
TOPICS = ["bikes", "billing", "parking", "app", "helmets"]
ENTRIES = 120
BATCH = 1  # --batch-size: a pass of at most 256 padded tokens, so 120 short texts take many
DEFAULT_BATCH = 32  # texts per forward pass where a command has no --batch-size


def on_terminal(*args: str) -> str:
    """`semsearch ARGS` with stdout and stderr on a pseudo-terminal: everything it wrote there.
    TQDM_MININTERVAL=0 and TQDM_MINITERS=1 draw every update (a fast tiny model would otherwise
    finish between two redraws, and tqdm's adaptive step would skip a pass smaller than the last)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # 24 x 120
    env = {**os.environ, "TQDM_MININTERVAL": "0", "TQDM_MINITERS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "search.cli", *args],
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=follower,
        env=env,
    )
    os.close(follower)
    written = bytearray()
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        written += chunk
    process.wait(timeout=300)
    os.close(leader)
    assert process.returncode == 0, written.decode(errors="replace")
    return written.decode(errors="replace")


def bars(output: str) -> dict[str, list[tuple[int, int]]]:
    """Each bar's (done, total) states in the order drawn, by its name."""
    drawn: dict[str, list[tuple[int, int]]] = {}
    for match in BAR.finditer(output):
        drawn.setdefault(match["desc"], []).append((int(match["n"]), int(match["total"])))
    return drawn


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, tiny_model: str) -> dict[str, Path]:
    """A FAQ of 120 entries in five topics, 40 more, 120 sentence pairs, 40 judged questions and
    an index of the FAQ, on the tiny model."""
    directory = tmp_path_factory.mktemp("progress")
    rows = [
        (f"e{i}", f"entry {i} about {TOPICS[i % 5]} and more words {i * 7}", TOPICS[i % 5])
        for i in range(ENTRIES)
    ]
    more = [(f"n{i}", f"new entry {i} about {TOPICS[i % 5]}", TOPICS[i % 5]) for i in range(40)]
    pairs = directory / "pairs.csv"
    write_csv(
        pairs,
        [(f"a sentence {i}", f"another one {i * 3}", i % 5) for i in range(ENTRIES)],
        ("sentence1", "sentence2", "score"),
    )
    queries = directory / "queries.jsonl"
    queries.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "text": f"question {i} on {TOPICS[i % 5]}"}) + "\n" for i in range(40)
        )
    )
    qrels = directory / "qrels.tsv"
    qrels.write_text("".join(f"q{i}\te{j}\t1\n" for i in range(40) for j in range(i % 5, ENTRIES, 25)))
    corpus = write_csv(directory / "faq.csv", rows)
    for index in ("idx", "added"):  # "added" is the one `add` changes
        build_index(corpus, directory / index, Strategy(model=tiny_model))
    return {
        "corpus": corpus,
        "more": write_csv(directory / "more.csv", more),
        "pairs": pairs,
        "queries": queries,
        "qrels": qrels,
        "index": directory / "idx",
        "added": directory / "added",
        "model": Path(tiny_model),
        "out": directory,
    }


JUDGED = ["--corpus", "{corpus}", "--queries", "{queries}", "--qrels", "{qrels}", "--model", "{model}"]
COMMANDS: dict[str, tuple[list[str], dict[str, int | None]]] = {  # arguments, bars and their totals
    "index": (
        ["index", "{corpus}", "-o", "{out}/built", "--model", "{model}", "--batch-size", str(BATCH)],
        {"embedding": ENTRIES},
    ),
    "add": (["add", "{added}", "{more}", "--batch-size", str(BATCH)], {"embedding": 40}),
    "evaluate sts": (["evaluate", "sts", "{pairs}", "--model", "{model}"], {"embedding": 2 * ENTRIES}),
    "evaluate retrieval": (
        ["evaluate", "retrieval", *JUDGED],
        {"embedding": ENTRIES, "questions": 40},
    ),
    "sweep sts": (["sweep", "sts", "{pairs}", "--model", "{model}"], {"embedding": 2 * ENTRIES}),
    "sweep retrieval": (
        ["sweep", "retrieval", *JUDGED],
        {"embedding": ENTRIES + 40},
    ),
    "evaluate abstention": (
        ["evaluate", "abstention", *JUDGED, "--min-precision", "0.05"],
        {"embedding": ENTRIES, "questions": None},  # the whole corpus once; its judged questions
    ),
    "calibrate": (["calibrate", "{index}", "--self"], {"paraphrases": ENTRIES}),
    "duplicates": (["duplicates", "{index}", "--min-score", "0.99"], {"comparing": ENTRIES}),
}


def arguments(command: str, files: dict[str, Path]) -> list[str]:
    return [part.format(**files) for part in COMMANDS[command][0]]


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_bars_move_per_batch_on_a_terminal(files, command):
    drawn = bars(on_terminal(*arguments(command, files)))
    expected = COMMANDS[command][1]
    assert set(drawn) == set(expected), drawn
    for name, total in expected.items():
        states = drawn[name]
        total = total or states[-1][1]
        assert {t for _, t in states} == {total}
        done = [n for n, _ in states]
        assert done == sorted(done) and done[-1] == total
        if name != "comparing":  # a scan of 120 vectors is one tile
            size = BATCH if "--batch-size" in COMMANDS[command][0] else DEFAULT_BATCH
            runtime = "torch" if command.startswith("sweep") else "onnx"  # a sweep runs torch
            batch = Batching.on(True, size, runtime=runtime).rows  # short texts: passes by a token budget
            between = {n for n in done if 0 < n < total}
            assert len(between) >= -(-total // batch) - 1, states  # it moved batch by batch
    if command == "index":
        done = sorted({n for n, _ in drawn["embedding"]})  # a state may be drawn twice (the close)
        steps = [b - a for a, b in zip(done, done[1:], strict=False)]
        assert max(steps) <= Batching.on(True, BATCH).rows, done  # one step per pass of at most a batch


@pytest.mark.slow
@pytest.mark.parametrize("command", ["index", "calibrate"])
def test_quiet_on_a_terminal_and_silent_in_a_pipe(files, command):
    assert bars(on_terminal(*arguments(command, files), "--quiet")) == {}
    piped = run(*arguments(command, files))
    assert piped.returncode == 0, piped.stderr
    assert not BAR.search(piped.stderr) and "%|" not in piped.stderr


@pytest.fixture
def terminal(monkeypatch) -> None:
    """stderr taken for a terminal: progress is a bar."""
    monkeypatch.setattr("indexer.progress._on_terminal", lambda: True)


def test_steps_report_shares_in_the_task_unit(terminal):
    """A step done in pieces of another unit (token windows, also texts) moves the bar by whole
    units of the task, and the task ends complete."""
    with Progress(10, "embedding", enabled=True) as bar:
        step = bar.step(4)  # 4 entries embedded as 6 windows
        for _ in range(6):
            step(1 / 6)
        assert bar.bar.n == 4
        bar.step(6)(0.5)
        assert bar.bar.n == 7
        bar.reach(8)
        assert bar.bar.n == 8
    assert bar.bar.n == 10


def test_a_quiet_build_imports_no_bar(tmp_path, tiny_model, monkeypatch, terminal):
    """Work that shows no bar (``-q``, a pipe) never imports tqdm (a twentieth of a second of
    every quiet command); one that shows a bar counts every entry."""
    import sys

    import indexer.writing.build

    made: list[Progress] = []

    def spied(*args, **kwargs):
        made.append(Progress(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(indexer.writing.build, "Progress", spied)
    rows = [(f"e{i}", f"entry {i} about {TOPICS[i % 5]}") for i in range(12)]
    corpus = write_csv(tmp_path / "faq.csv", rows, ("id", "text"))
    with monkeypatch.context() as without:
        without.setitem(sys.modules, "tqdm", None)  # importing it fails
        build_index(corpus, tmp_path / "quiet", Strategy(model=tiny_model), progress=False)
    assert [bar.bar for bar in made] == [None]
    build_index(corpus, tmp_path / "shown", Strategy(model=tiny_model), progress=True)
    assert (made[-1].bar.n, made[-1].bar.total) == (12, 12)


@pytest.mark.parametrize("exact", [True, False])
def test_a_duplicate_scan_reports_each_block(exact):
    vectors = clustered(600)
    told: list[float] = []
    range_pairs(vectors, np.arange(600), 0.95, exact=exact, block=100, progress=told.append)
    assert len(told) == 6 and all(share > 0 for share in told)
    assert sum(told) == pytest.approx(1.0)


COUNTER = re.compile(r"encoding: (?P<n>\d+)text \[[\d:]+, +\S+/s\]")


@pytest.mark.slow
def test_encode_counts_its_texts_on_a_terminal_and_is_silent_in_a_pipe(files, tmp_path):
    """``encode`` streams texts whose number it cannot know ahead (stdin): its bar counts them,
    a part of 256 at a time, with the rate; nothing in a pipe or with --quiet."""
    lines = tmp_path / "lines.txt"
    lines.write_text("".join(f"line {i} about {TOPICS[i % 5]}\n" for i in range(600)))
    command = ["encode", str(lines), "--model", str(files["model"]), "-o"]
    counted = [int(m["n"]) for m in COUNTER.finditer(on_terminal(*command, str(tmp_path / "a.npy")))]
    assert sorted(set(counted)) == [0, 256, 512, 600]
    assert not COUNTER.search(on_terminal(*command, str(tmp_path / "b.npy"), "--quiet"))
    piped = run(*command, tmp_path / "c.npy")
    assert piped.returncode == 0, piped.stderr
    assert "encoding" not in piped.stderr


class FakeClock:
    """A clock a test moves by hand: progress lines are timed without sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    import indexer.progress

    fake = FakeClock()
    monkeypatch.setattr(indexer.progress, "clock", fake)
    return fake


def test_in_a_file_a_long_task_says_a_line_every_interval_and_a_short_one_nothing(clock, capsys):
    """stderr here is not a terminal (a log file, a pipe): no bar, a line once ``INTERVAL`` has
    passed since the last, with the count, the rate and the time left, and one at the end."""
    import indexer.progress

    with Progress(100, "embedding", enabled=True) as bar:
        assert bar.bar is None  # no tqdm redraws in a file
        clock.now += 10
        bar.advance(20)
        assert capsys.readouterr().err == ""  # under the interval: nothing yet
        clock.now += indexer.progress.INTERVAL - 10
        bar.advance(20)
        assert capsys.readouterr().err == "embedding: 40/100 texts (40%), 1.3 texts/s, about 45s left\n"
        clock.now += 5
        bar.advance(30)
        assert capsys.readouterr().err == ""
        clock.now += indexer.progress.INTERVAL
        bar.advance(10)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("embedding: 80/100 texts (80%)")
    assert lines[-1].startswith("embedding: 100/100 texts (100%)") and lines[-1].endswith("done in 65s")
    with Progress(100, "embedding", enabled=True) as quick:
        clock.now += 1
        quick.advance(100)
    assert capsys.readouterr().err == ""  # a task shorter than the interval says nothing
    with Progress(100, "embedding", enabled=False) as quiet:
        clock.now += 100
        quiet.advance(100)
    assert capsys.readouterr().err == ""


def test_long_commands_show_progress_lines_when_stderr_is_not_a_terminal(files, monkeypatch):
    """`index`, `calibrate` and the studies in a log file print progress lines (here every
    advance: the interval set to 0), not nothing because stderr is no terminal; -q silences them."""
    from click.testing import CliRunner

    import indexer.progress
    from search.cli import cli

    monkeypatch.setattr(indexer.progress, "INTERVAL", 0.0)
    for command in ("index", "calibrate", "evaluate retrieval"):
        given = [part.replace("/built", f"/logged-{len(part)}") for part in arguments(command, files)]
        said = CliRunner().invoke(cli, given)
        assert said.exit_code == 0, said.output
        assert re.search(r"^(embedding|paraphrases): \d+/\d+ texts \(\d+%\)", said.stderr, re.M), said.stderr
        quiet = CliRunner().invoke(cli, [*(p.replace("/built", "/quiet") for p in given), "--quiet"])
        assert quiet.exit_code == 0 and "texts (" not in quiet.stderr, quiet.stderr


LATER = "(a large model takes minutes; later runs reuse it)"


def test_an_export_to_onnx_says_where_it_writes_how_long_it_took_and_the_cache_size(
    tmp_path, tiny_model, monkeypatch, capsys
):
    """A model's first use exports it to ONNX into the cache: said when it starts (it can take
    minutes) and when it ends; the second use reads the cache and says nothing."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("SEMSEARCH_CACHE", str(cache))
    corpus = write_csv(
        tmp_path / "faq.csv", [(f"e{i}", f"entry {i} on {TOPICS[i % 5]}") for i in range(6)], ("id", "text")
    )
    build_index(corpus, tmp_path / "first", Strategy(model=tiny_model))
    said = capsys.readouterr().err.splitlines()
    onnx = cache / "onnx"
    assert said[0] == f"exporting {tiny_model} to ONNX once, into {onnx} " + LATER
    assert re.fullmatch(
        rf"exported {re.escape(tiny_model)} to ONNX in \d+s: {re.escape(str(onnx))} now holds [\d,]+ MB",
        said[1],
    )
    build_index(corpus, tmp_path / "second", Strategy(model=tiny_model))
    assert "export" not in capsys.readouterr().err
