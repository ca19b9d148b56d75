"""Updates on a large index: whole-process ``semsearch add IDX 100rows.csv`` and ``semsearch
delete IDX --ids-file 100ids.txt`` on an index of N vectors, with the segmented store (this
tree) against the store before it (commit ``a29ca0d``, every update copied the live version),
both run in the same session, as ratios.

    .venv/bin/python bench/update.py [--sizes 100000,1000000] [--old a29ca0d] [--work DIR]

The index: N synthetic unit vectors (384 dimensions, random: the model need not embed N texts)
with N short rows, written through the store's own API (``new_version``, as a
build writes it) with the bundled model's strategy, so ``add`` really loads the model and embeds
its 100 rows. The old code reads the same file format: the index is written once by this tree
and copied for the old one (same bytes), and each code changes its own copy.

Each command runs in a fresh process (``python -m search.cli``, ``PYTHONPATH`` = the code under
test); its bytes written are read from its own ``/proc/self/io`` at exit: ``wchar`` (bytes passed
to write calls, page cache or not) and ``write_bytes`` (bytes sent towards the disk). The model's
share of an ``add`` is timed inside that process: the time spent in ``encoder_for`` (importing
torch, loading the model) and ``embed_parts`` (``embed_entries`` in older code: embedding the 100
rows), wrapped by the bench;
"model aside" = whole process - that; "in process" leaves out the interpreter's start and
teardown too (from the first line of the process to its exit handler). Each code runs
``--repeats`` adds (different rows) and deletes (different ids); the table shows medians.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WRAPPER = r"""
import time
started = time.perf_counter()
import atexit, json, sys
import importlib, indexer.writing.update
try:
    loads, load = importlib.import_module("indexer.encoders.factory"), "encoder_for"
except ImportError:  # the old code: before indexer.encoders
    loads, load = importlib.import_module("indexer.embedding"), "embedder_for"
model = [0.0]
def timed(function):
    def run(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            model[0] += time.perf_counter() - started
    return run
setattr(loads, load, timed(getattr(loads, load)))  # the model load
embeds = "embed_parts" if hasattr(indexer.writing.update, "embed_parts") else "embed_entries"  # old code
setattr(indexer.writing.update, embeds, timed(getattr(indexer.writing.update, embeds)))  # the embedding
def report():
    io = dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())
    with open({out!r}, "w") as f:
        inside = time.perf_counter() - started
        json.dump({{"model": model[0], "inside": inside, **{{k: int(v) for k, v in io.items()}}}}, f)
atexit.register(report)
sys.argv = ["semsearch", *{args!r}]
from search.cli import main
main()
"""
PART = 50_000


def write_index(index_dir: Path, size: int, strategy_from: Path) -> float:
    """N synthetic unit vectors and rows, written as a build writes them; returns seconds."""
    from indexer.reading.corpus import Entry
    from indexer.reading.field_types import detect_types
    from indexer.store import new_version, open_index

    strategy = open_index(strategy_from).strategy
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    with new_version(index_dir, detect_types([{"category": "c0"}])) as version:
        for start in range(0, size, PART):
            n = min(PART, size - start)
            entries = [
                Entry(f"r{i}", f"row {i} short text about topic {i % 97}", {"category": f"c{i % 13}"})
                for i in range(start, start + n)
            ]
            vectors = rng.normal(size=(n, 384)).astype(np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            version.add(entries, vectors, np.arange(n))
        source = {"path": "synthetic", "text_fields": ["text"], "id_field": "id", "rows": size, "rejected": 0}
        version.write(strategy, source=source)
    return time.perf_counter() - started


def run(code: Path, args: list[str], work: Path) -> dict[str, float]:
    """``semsearch ARGS`` in a fresh process with ``code`` first on the path (run from the
    scratch directory, so no checkout is picked up from the working directory): wall seconds,
    seconds in the model (loading it and embedding), bytes written."""
    out = work / "io.json"
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", WRAPPER.format(out=str(out), args=args)],
        env={**os.environ, "PYTHONPATH": str(code)},
        cwd=work,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    seconds = time.perf_counter() - started
    measured = json.loads(out.read_text())
    return {"seconds": seconds, **{k: measured[k] for k in ("model", "inside", "wchar", "write_bytes")}}


def megabytes(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def median(runs: list[dict[str, float]], key: str) -> float:
    return float(np.median([r[key] for r in runs]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--repeats", type=int, default=3, help="adds and deletes per code (medians)")
    parser.add_argument("--old", default="a29ca0d", help="commit of the store before segments")
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (on a real disk)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-update-", dir=args.work or "/var/tmp"))
    try:
        old = work / "old-code"
        old.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.old], check=True, capture_output=True
        )
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
        adds = []
        for rep in range(args.repeats):
            adds.append(work / f"add-{rep}.csv")
            adds[-1].write_text(
                "id,text\n"
                + "".join(f"n{rep}-{i},new entry {i} of run {rep} about bikes\n" for i in range(100))
            )
        from indexer import Strategy, build_index

        seed = work / "seed"
        build_index(adds[0], seed, Strategy())  # the bundled model's resolved strategy
        print(f"load average at start: {os.getloadavg()}", flush=True)
        results = {}
        for size in [int(s) for s in args.sizes.split(",")]:
            new_index, old_index = work / f"new-{size}", work / f"old-{size}"
            built = write_index(new_index, size, seed)
            shutil.copytree(new_index, old_index)
            print(f"{size:,} vectors written in {built:.0f} s", flush=True)
            for rep in range(args.repeats):
                ids = work / f"ids-{rep}.txt"
                ids.write_text("".join(f"r{i}\n" for i in range(rep, size, size // 100)))
                for label, code, index in (("a29ca0d", old, old_index), ("segments", ROOT, new_index)):
                    add = run(code, ["add", str(index), str(adds[rep])], work)
                    delete = run(code, ["delete", str(index), "--ids-file", str(ids)], work)
                    results.setdefault((size, label), []).append({"add": add, "delete": delete})
                    print(size, label, json.dumps(results[size, label][-1]), flush=True)
        print(f"load average at end: {os.getloadavg()}\n")
        print(f"medians of {args.repeats} runs; written = wchar (bytes passed to write calls)\n")
        print(
            "| vectors | 100 entries | a29ca0d (copies) | segments | ratio | written before | written after |"
        )
        print("|---|---|---|---|---|---|---|")
        for size in dict.fromkeys(size for size, _ in results):
            before, after = results[size, "a29ca0d"], results[size, "segments"]
            rows = {
                "add, whole process": ("add", "seconds", False),
                "add, whole process, model aside": ("add", "seconds", True),
                "add, in process (imports to exit), model aside": ("add", "inside", True),
                "delete, whole process": ("delete", "seconds", False),
            }
            for name, (op, key, aside) in rows.items():
                b, a = (
                    median([r[op] for r in runs], key)
                    - (median([r[op] for r in runs], "model") if aside else 0)
                    for runs in (before, after)
                )
                was, now = (megabytes(median([r[op] for r in runs], "wchar")) for runs in (before, after))
                print(f"| {size:,} | {name} | {b:.2f} s | {a:.2f} s | {b / a:.1f}x | {was} | {now} |")
            model = median([r["add"] for r in before + after], "model")
            print(f"| {size:,} | (the model: load + embed 100) | {model:.2f} s | | | | |")
        print("\nwrite_bytes (towards the disk), medians:")
        for (size, label), runs in results.items():
            add, delete = (
                megabytes(median([r[op] for r in runs], "write_bytes")) for op in ("add", "delete")
            )
            print(f"  {size:,} {label}: add {add}, delete {delete}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
