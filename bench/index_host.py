"""The host work per row of a whole ``semsearch index``: the corpus read twice (survey, then
parts), rows checked and typed, SQLite and FAISS written, with the model made nearly free (a
random 1-layer, 32-wide BERT), so what is timed is the Python work per row that caps a GPU
build (a GPU embeds short texts far faster than one thread reads and writes them).

    .venv/bin/python bench/index_host.py [--rows 100000] [--repeats 3] [--profile FILE]

The corpus is JSON Lines ``{"id", "text"}`` of STS-B sentences, each made unique by a suffix.
Each run is a fresh ``semsearch index`` process (imports and model load included); min and
median seconds and rows/s are printed. ``--profile`` also writes one run's cProfile stats.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's tests.helpers

from tests.helpers import random_bert  # noqa: E402 - after the path it is found on

STSB = ROOT.parent / "shared" / "data" / "stsb" / "stsb-train.tsv"
SEMSEARCH = ROOT / ".venv" / "bin" / "semsearch"


def write_corpus(path: Path, rows: int) -> None:
    """``rows`` short unique texts: STS-B's sentences, cycled, each with its row number appended."""
    with STSB.open(encoding="utf-8", newline="") as f:
        sentences = [r["sentence1"] for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]
    with path.open("w", encoding="utf-8") as out:
        for i in range(rows):
            out.write(json.dumps({"id": str(i), "text": f"{sentences[i % len(sentences)]} ({i})"}) + "\n")


def index_once(corpus: Path, model: Path, out: Path, profile: Path | None = None) -> float:
    """Seconds one whole ``semsearch index`` process takes."""
    shutil.rmtree(out, ignore_errors=True)
    prefix = [str(SEMSEARCH)]
    if profile:
        prefix = [sys.executable, "-m", "cProfile", "-o", str(profile), *prefix]
    started = time.perf_counter()
    subprocess.run(
        [*prefix, "index", str(corpus), "-o", str(out), "--model", str(model), "--backend", "torch", "-q"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", type=Path, help="also write one profiled run's stats here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="index-host-") as tmp:
        work = Path(tmp)
        model = random_bert(work / "model", layers=1)
        corpus = work / "corpus.jsonl"
        write_corpus(corpus, args.rows)
        times = [index_once(corpus, model, work / "index") for _ in range(args.repeats)]
        if args.profile:
            index_once(corpus, model, work / "index", args.profile)
    best, median = min(times), statistics.median(times)
    print(
        f"{args.rows} rows: min {best:.2f} s ({args.rows / best:,.0f} rows/s), "
        f"median {median:.2f} s ({args.rows / median:,.0f} rows/s)"
    )


if __name__ == "__main__":
    main()
