"""The host work of a whole ``semsearch index`` beside the peer: the model made nearly free (a
random 1-layer, 32-wide BERT), so what is timed is reading, checking, tokenizing and writing
(SQLite rows, keywords, FAISS) — the work that caps a GPU build, where the device embeds short
texts far faster than the host reads and writes them.

    python bench/index_host.py [--rows 100000] [--repeats 2] [--backend torch] [--against DIR]
        [--profile FILE]

The corpus is JSON Lines ``{"id", "text"}`` of STS-B train sentences, each made unique by a
suffix. Each run is a fresh process (imports and model load included), run in turn: this
checkout's ``semsearch index`` (``--backend``: none by default, so the product's default backend,
ONNX Runtime; ``torch`` times the torch path), the same command from ``--against`` (another
checkout, e.g. the main branch: before and after in one run), and the peer script
(sentence-transformers + FAISS + ids, the same model on the CPU). Min and median seconds, rows/s
the ratio to the peer and CPU seconds are printed, with the load average before and after. ``--profile``
also writes one run's cProfile stats (this checkout).

Without ``--backend torch`` each checkout first runs one untimed build, as a user's first
``index`` does: it exports the model's graph into the run's own cache (``SEMSEARCH_CACHE``, a
temporary folder), so the timed builds find it cached, as every later ``index`` of a user does.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
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

PEER = r"""
import json, sys
import faiss, numpy as np
from sentence_transformers import SentenceTransformer
texts = [json.loads(line)["text"] for line in open(sys.argv[1], encoding="utf-8")]
model = SentenceTransformer(sys.argv[3], device="cpu")
vectors = np.asarray(model.encode(texts, batch_size=256, normalize_embeddings=True), dtype=np.float32)
index = faiss.IndexIDMap(faiss.IndexFlatIP(vectors.shape[1]))
index.add_with_ids(vectors, np.arange(len(texts), dtype=np.int64))
faiss.write_index(index, sys.argv[2])
json.dump([str(i) for i in range(len(texts))], open(sys.argv[2] + ".ids.json", "w"))
"""
"""What a user of sentence-transformers writes to index a JSON Lines file: read, embed, write."""


def write_corpus(path: Path, rows: int) -> None:
    """``rows`` short unique texts: STS-B's sentences, cycled, each with its row number appended."""
    with STSB.open(encoding="utf-8", newline="") as f:
        sentences = [r["sentence1"] for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]
    with path.open("w", encoding="utf-8") as out:
        for i in range(rows):
            out.write(json.dumps({"id": str(i), "text": f"{sentences[i % len(sentences)]} ({i})"}) + "\n")


def semsearch(
    corpus: Path, model: Path, out: Path, backend: str | None, profile: Path | None = None
) -> list[str]:
    """The command line of one whole ``semsearch index`` (``backend`` None: the default one)."""
    prefix = [sys.executable, "-m", "search.cli"]
    if profile:
        prefix = [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "search.cli"]
    chosen = ["--backend", backend] if backend else []
    return [*prefix, "index", str(corpus), "-o", str(out), "--model", str(model), *chosen, "-q"]


def timed(command: list[str], checkout: Path, out: Path, threads: int | None = None) -> tuple[float, float]:
    """Seconds one whole process takes, and the CPU seconds it used (user and system, every
    thread: steadier than wall time on a machine others load), ``checkout`` first on its path;
    ``threads``: the intra-op threads of torch (OpenMP) in every process."""
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    used, started = _children_cpu(), time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env, cwd=checkout)
    return time.perf_counter() - started, _children_cpu() - used


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--against", type=Path, help="another checkout timed in the same run")
    parser.add_argument("--no-peer", action="store_true", help="skip the peer script")
    parser.add_argument(
        "--backend",
        choices=["torch", "onnx", "onnx-int8"],
        help="semsearch's backend (default: none given, the product's default, ONNX Runtime)",
    )
    parser.add_argument("--profile", type=Path, help="also write one profiled run's stats here")
    parser.add_argument(
        "--threads",
        type=int,
        help="torch's intra-op threads in every process (1 on a machine others load: OpenMP's "
        "spinning threads then cost more than they give)",
    )
    args = parser.parse_args()
    print(f"load before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory(prefix="index-host-") as tmp:
        work = Path(tmp)
        os.environ["SEMSEARCH_CACHE"] = str(work / "cache")  # the run's own exports, every process
        model = Path(random_bert(work / "model", layers=1))
        corpus = work / "corpus.jsonl"
        write_corpus(corpus, args.rows)
        command = semsearch(corpus, model, work / "i", args.backend)
        runs = {"semsearch index (this checkout)": (ROOT, command)}
        if args.against:
            runs[f"semsearch index ({args.against.resolve()})"] = (args.against.resolve(), command)
        if args.backend != "torch":
            print("one untimed build per checkout first: the graph exported and cached", flush=True)
            for checkout, first in runs.values():
                timed(first, checkout, work / "i", args.threads)
        if not args.no_peer:
            runs["sentence-transformers + FAISS"] = (
                ROOT,
                [sys.executable, "-c", PEER, str(corpus), str(work / "p"), str(model)],
            )
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
        for _ in range(args.repeats):  # in turn, so a change of load falls on every pipeline
            for name, (checkout, command) in runs.items():
                times[name].append(timed(command, checkout, work / "i", args.threads))
        if args.profile:
            profiled = semsearch(corpus, model, work / "i", args.backend, args.profile)
            timed(profiled, ROOT, work / "i", args.threads)
    peer = min(times["sentence-transformers + FAISS"])[0] if not args.no_peer else None
    threads = f", {args.threads} torch thread(s)" if args.threads else ""
    backend = f"--backend {args.backend}" if args.backend else "the default backend (no --backend)"
    print(f"\n{args.rows:,} rows, semsearch on {backend}, best of {args.repeats}{threads}\n")
    print("| pipeline | min s | median s | rows/s (min) | speed vs the peer | CPU s (min) |")
    print("|---|---|---|---|---|---|")
    for name, taken in times.items():
        best = min(wall for wall, _ in taken)
        ratio = f"{peer / best:.2f}x" if peer else ""
        median = statistics.median(wall for wall, _ in taken)
        cpu = min(used for _, used in taken)
        print(f"| {name} | {best:.2f} | {median:.2f} | {args.rows / best:,.0f} | {ratio} | {cpu:.2f} |")
    print(f"\nload after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
