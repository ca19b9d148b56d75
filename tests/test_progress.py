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
from indexer.progress import Progress
from search.read.duplicates import range_pairs
from tests.helpers import clustered, run, write_csv

BAR = re.compile(
    r"(?P<desc>[a-z]+): +\d+%\|[^|\r\n]*\| *(?P<n>\d+)/(?P<total>\d+) \[[\d:]+<(?P<left>[\d:?]+), +\S+/s\]"
)
TOPICS = ["bikes", "billing", "parking", "app", "helmets"]
ENTRIES = 120
BATCH = 8
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
            batch = BATCH if "--batch-size" in COMMANDS[command][0] else DEFAULT_BATCH
            between = {n for n in done if 0 < n < total}
            assert len(between) >= -(-total // batch) - 1, states  # it moved batch by batch
    if command == "index":
        done = sorted({n for n, _ in drawn["embedding"]})  # a state may be drawn twice (the close)
        steps = [b - a for a, b in zip(done, done[1:], strict=False)]
        assert max(steps) <= BATCH, done  # one step per pass of at most a batch


@pytest.mark.slow
@pytest.mark.parametrize("command", ["index", "calibrate"])
def test_quiet_on_a_terminal_and_silent_in_a_pipe(files, command):
    assert bars(on_terminal(*arguments(command, files), "--quiet")) == {}
    piped = run(*arguments(command, files))
    assert piped.returncode == 0, piped.stderr
    assert not BAR.search(piped.stderr) and "%|" not in piped.stderr


def test_steps_report_shares_in_the_task_unit():
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


def test_a_quiet_build_imports_no_bar(tmp_path, tiny_model, monkeypatch):
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
