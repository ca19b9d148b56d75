"""Where a whole ``semsearch index`` process spends its time, phase by phase: the interpreter's
start, importing the CLI, the first pass over the corpus (checking every row), loading the encoder
(graph and session), tokenising, the network, pooling, the rest of embedding, the rows' SQLite and
keyword writes with the vectors' spool, the vector index built and written, and the rest.

    .venv/bin/python bench/index_phases.py [--shared ../shared/data] [--backends onnx,onnx-int8]
        [--repeats 3] [--limit N]

Each run is a fresh process running the CLI's own ``main`` with wall-clock timers wrapped around
those functions (nested ones counted once, in the innermost phase); the graphs are exported
before (unmeasured). Text sets: 2,000 STS-B dev sentences (short) and the 719 StackFAQ answers
(long). Prints each phase's median seconds and share of the whole process.
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
import json, sys, time
started = time.perf_counter()
import search.cli
imported = time.perf_counter()
from indexer.embedding import head
from indexer.encoders import factory, onnx_graph, tokens
from indexer.store import writer
from indexer.writing import build

spent, stack = {}, []

def timed(owner, name, phase):
    plain = getattr(owner, name)
    def wrapper(*args, **kwargs):
        begun = time.perf_counter()
        stack.append(0.0)
        try:
            return plain(*args, **kwargs)
        finally:
            took = time.perf_counter() - begun
            inner = stack.pop()
            spent[phase] = spent.get(phase, 0.0) + took - inner
            if stack:
                stack[-1] += took
    setattr(owner, name, wrapper)

timed(build, "survey_corpus", "first pass over the corpus (checks)")
timed(factory, "encoder_for", "encoder load (graph, session, tokenizer)")
timed(build, "embed_entries", "embedding besides tokens, network, pooling")
timed(tokens.TextTokenizer, "ids", "tokenising")
timed(onnx_graph.OnnxGraph, "__call__", "network (ONNX Runtime)")
timed(head.Head, "__call__", "pooling, normalising")
timed(writer.VersionWriter, "add", "rows to SQLite + keywords, vectors spooled")
timed(writer.VersionWriter, "write", "vector index built and written, graph held")
try:
    search.cli.cli(sys.argv[2:], prog_name="semsearch", standalone_mode=False)
finally:
    done = time.perf_counter()
    spent["importing the CLI"] = imported - started
    spent["the rest (second pass reading, meta, commit)"] = done - started - sum(spent.values())
    with open(sys.argv[1], "w") as f:
        json.dump(spent, f)
"""


def run_once(corpus: Path, out: Path, backend: str, tmp: Path) -> dict[str, float]:
    """One fresh process: its phases, and the interpreter's start (wall time outside ``main``)."""
    spent = tmp / "spent.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    argv = ["index", str(corpus), "-o", str(out), "--backend", backend, "-q"]
    subprocess.run([sys.executable, "-c", HARNESS, str(spent), *argv], check=True, env=env, cwd=ROOT)
    whole = time.perf_counter() - started
    phases = json.loads(spent.read_text())
    phases["process start and exit"] = whole - sum(phases.values())
    return {**phases, "whole process": whole}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--backends", default="onnx,onnx-int8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    backends = args.backends.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        for label, texts in text_sets(args.shared).items():
            corpus = Path(tmp) / "corpus.jsonl"
            with corpus.open("w", encoding="utf-8") as f:
                f.writelines(
                    json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(texts[: args.limit])
                )
            runs: dict[str, list[dict[str, float]]] = {b: [] for b in backends}
            for backend in backends:  # unmeasured: exports each graph once
                run_once(corpus, Path(tmp) / "warm", backend, Path(tmp))
            for repeat in range(args.repeats):  # taking turns, so the machine's load hits all alike
                for backend in backends:
                    runs[backend].append(
                        run_once(corpus, Path(tmp) / f"{backend}-{repeat}", backend, Path(tmp))
                    )
            phases = list(dict.fromkeys(p for rs in runs.values() for r in rs for p in r))
            print(f"\n### {label}: {len(texts[: args.limit])} texts, {args.repeats} runs each, medians")
            print("| phase | " + " | ".join(f"{b} s | share" for b in backends) + " |")
            print("|---|" + "---|---|" * len(backends))
            for phase in sorted(phases, key=lambda p: p == "whole process"):
                cells = []
                for backend in backends:
                    value = statistics.median(r.get(phase, 0.0) for r in runs[backend])
                    whole = statistics.median(r["whole process"] for r in runs[backend])
                    cells.append(f"{value:.2f} | {value / whole:.0%}")
                print(f"| {phase} | " + " | ".join(cells) + " |")
            spread = {b: [round(r["whole process"], 1) for r in runs[b]] for b in backends}
            print(f"whole-process seconds of each run: {spread}")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
