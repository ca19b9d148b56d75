"""Where a whole ``semsearch index`` process spends its time, phase by phase: the interpreter's
start and exit, importing the CLI and the index path, the first pass over the corpus (checking
every row), the version begun (folder, lock, SQLite tables), loading the encoder (graph, session,
tokenizer), the second pass over the corpus, tokenising, the network, pooling, the rest of
embedding, the rows' SQLite and keyword writes with the vectors' spool, the vector index built and
written, the graph held, SQLite's commits, the files' checksums and fsyncs, and the rest.

    .venv/bin/python bench/index_phases.py [--shared ../shared/data] [--backends onnx,onnx-int8]
        [--repeats 3] [--limit N] [--before DIR]

Each run is a fresh process running the console script's entry point (``search.cli.main``) with
wall-clock timers wrapped around those functions (nested ones counted once, in the innermost
phase; a function a checkout lacks is left untimed, its time in "the rest"). The graphs are
exported before, and the bytecode compiled, by one unmeasured run (an installed package has its
bytecode; a checkout run with ``PYTHONDONTWRITEBYTECODE`` compiles every module of its own anew,
about 0.3 s a process here). ``--before DIR`` times another checkout of the code (``git worktree
add DIR HEAD``) in turn with this one, on the same corpus and interpreter, and prints both. Text
sets: 2,000 STS-B dev sentences (short) and the 719 StackFAQ answers (long). Prints each phase's
median seconds and share of the whole process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gemm_peak import text_sets  # noqa: E402

HARNESS = r"""
import contextlib, functools, json, sys, threading, time
started = time.perf_counter()
import search.cli
imported = time.perf_counter()
from indexer.embedding import head
from indexer.encoders import factory, onnx_graph, tokens
from indexer.store import integrity, versions, writer
from indexer.writing import build
try:
    from indexer import stages
except ImportError:  # a checkout whose build does not stream
    stages = None
import indexer.catalog, indexer.store, indexer.vectors.factory
library = time.perf_counter()

spent, stack = {}, []

@contextlib.contextmanager
def clock(phase):
    if threading.current_thread() is not threading.main_thread():
        yield  # what runs beside the main thread costs only what the main thread waits for it
        return
    begun = time.perf_counter()
    stack.append(0.0)
    try:
        yield
    finally:
        took = time.perf_counter() - begun
        inner = stack.pop()
        spent[phase] = spent.get(phase, 0.0) + took - inner
        if stack:
            stack[-1] += took

def timed(owner, name, phase, kind="call"):
    # a function (call), a generator function (each step timed) or a context manager function
    # (its entering and its leaving timed as two phases); a name this tree lacks is skipped
    plain = getattr(owner, name, None) if owner is not None else None
    if plain is None:
        return
    if kind == "call":
        def wrapper(*args, **kwargs):
            with clock(phase):
                return plain(*args, **kwargs)
    elif kind == "generator":
        def wrapper(*args, **kwargs):
            steps = plain(*args, **kwargs)
            while True:
                with clock(phase):
                    try:
                        item = next(steps)
                    except StopIteration:
                        return
                yield item
    else:
        @contextlib.contextmanager
        def wrapper(*args, **kwargs):
            manager = plain(*args, **kwargs)
            with clock(phase[0]):
                value = manager.__enter__()
            try:
                yield value
            except BaseException:
                if not manager.__exit__(*sys.exc_info()):
                    raise
            else:
                with clock(phase[1]):
                    manager.__exit__(None, None, None)
    setattr(owner, name, functools.wraps(plain)(wrapper))

VERSION = ("version begun (folder, lock, SQLite tables)", "version made durable and live (meta, fsync, swap)")
timed(build, "survey_corpus", "first pass over the corpus (checks)")
timed(build, "corpus_parts", "second pass over the corpus", "generator")
timed(build, "grouped", "waiting for the reading stage (a streamed build)", "generator")
timed(stages.Behind, "give", "waiting for the writing stage (a streamed build)")
timed(factory, "encoder_for", "encoder load (graph, session, tokenizer)")
timed(build, "embed_entries", "embedding besides tokens, network, pooling")
timed(tokens.TextTokenizer, "ids", "tokenising")
timed(onnx_graph.OnnxGraph, "__call__", "network (ONNX Runtime)")
timed(head.Head, "__call__", "pooling, normalising")
timed(writer.VersionWriter, "add", "rows to SQLite + keywords, vectors spooled")
timed(indexer.store, "new_version", VERSION, "manager")
timed(writer, "build_from_parts", "vector index built")
timed(writer, "hold_graph", "graph held (linked into the version)")
timed(indexer.catalog.Catalog, "commit", "SQLite commits")
timed(writer.VersionWriter, "write", "vector index written, spool removed")
timed(versions, "records", "files' checksums")
timed(versions, "fsync", "fsync")
timed(versions, "_remove_stale", "old versions removed")
out, sys.argv = sys.argv[1], ["semsearch", *sys.argv[2:]]
try:
    search.cli.main()  # the console script's own entry point: what it does on the way out counts
except SystemExit as end:
    if end.code:
        raise
finally:
    done = time.perf_counter()
    spent["importing the CLI"] = imported - started
    spent["importing the index path (NumPy, SQLite, the library)"] = library - imported
    spent["the rest"] = done - started - sum(spent.values())
    with open(out, "w") as f:
        json.dump(spent, f)
"""


NETWORK = "network (ONNX Runtime)"
BESIDE = "all but the network"


def run_once(tree: Path, corpus: Path, out: Path, backend: str, tmp: Path) -> dict[str, float]:
    """One fresh process of ``tree``'s code: its phases, and the interpreter's start (wall time
    outside ``main``)."""
    spent = tmp / "spent.json"
    # bytecode cached (in ``tmp``, not the checkout) as an installed package has it: the first,
    # unmeasured run compiles it, as the first run after an install does
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONPYCACHEPREFIX": str(tmp / "bytecode")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    started = time.perf_counter()
    argv = ["index", str(corpus), "-o", str(out), "--backend", backend, "-q"]
    subprocess.run(
        [sys.executable, "-c", HARNESS, str(spent), *argv],
        check=True,
        env=env,
        cwd=tree,
        stdout=subprocess.DEVNULL,
    )
    whole = time.perf_counter() - started
    phases = json.loads(spent.read_text())
    phases["process start and exit"] = whole - sum(phases.values())
    return {**phases, "whole process": whole}


ORDER = [
    "process start and exit",
    "importing the CLI",
    "importing the index path (NumPy, SQLite, the library)",
    "first pass over the corpus (checks)",
    "version begun (folder, lock, SQLite tables)",
    "encoder load (graph, session, tokenizer)",
    "second pass over the corpus",
    "tokenising",
    NETWORK,
    "pooling, normalising",
    "embedding besides tokens, network, pooling",
    "rows to SQLite + keywords, vectors spooled",
    "vector index built",
    "graph held (linked into the version)",
    "SQLite commits",
    "vector index written, spool removed",
    "files' checksums",
    "fsync",
    "version made durable and live (meta, fsync, swap)",
    "old versions removed",
    "the rest",
    BESIDE,
    "whole process",
]
"""The phases in the order a build runs them, then the sums."""


def table(runs: dict[str, list[dict[str, float]]]) -> None:
    """Each phase's median seconds and share of the whole process, a column pair per run kind;
    ``BESIDE``: the median of each run's whole process less its network."""
    kinds = list(runs)
    for r in (r for rs in runs.values() for r in rs):
        r[BESIDE] = r["whole process"] - r.get(NETWORK, 0.0)
    phases = list(dict.fromkeys(p for rs in runs.values() for r in rs for p in r))
    print("| phase | " + " | ".join(f"{k} s | share" for k in kinds) + " |")
    print("|---|" + "---|---|" * len(kinds))
    for phase in sorted(phases, key=lambda p: ORDER.index(p) if p in ORDER else ORDER.index(BESIDE)):
        cells = []
        for kind in kinds:
            value = statistics.median(r.get(phase, 0.0) for r in runs[kind])
            whole = statistics.median(r["whole process"] for r in runs[kind])
            cells.append(f"{value:.2f} | {value / whole:.0%}")
        print(f"| {phase} | " + " | ".join(cells) + " |")
    spread = {kind: [round(r["whole process"], 2) for r in rs] for kind, rs in runs.items()}
    print(f"whole-process seconds of each run: {spread}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--backends", default="onnx,onnx-int8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument(
        "--before", type=Path, help="another checkout (git worktree add DIR HEAD) timed in turn with this one"
    )
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    backends = args.backends.split(",")
    trees = {"": ROOT} if args.before is None else {"before ": args.before.resolve(), "after ": ROOT}
    with tempfile.TemporaryDirectory() as tmp:
        for label, texts in text_sets(args.shared).items():
            corpus = Path(tmp) / "corpus.jsonl"
            with corpus.open("w", encoding="utf-8") as f:
                f.writelines(
                    json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(texts[: args.limit])
                )
            runs: dict[str, list[dict[str, float]]] = {f"{t}{b}": [] for b in backends for t in trees}
            for backend in backends:  # unmeasured: exports each graph once, warms the page cache
                for tree in trees.values():
                    run_once(tree, corpus, Path(tmp) / "warm", backend, Path(tmp))
            for repeat in range(args.repeats):  # taking turns, so the machine's load hits all alike
                for backend in backends:
                    for name, tree in trees.items():
                        out = Path(tmp) / f"{name.strip()}{backend}-{repeat}"
                        runs[f"{name}{backend}"].append(run_once(tree, corpus, out, backend, Path(tmp)))
            print(f"\n### {label}: {len(texts[: args.limit])} texts, {args.repeats} runs each, medians")
            table(runs)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
