"""``--storage pq`` at 1M vectors: recall@10 against exact search, p50 single-query latency and
resident memory per vector, next to the peer (sentence-transformers vectors in a FAISS
IndexFlatIP, exact) in the same run.

    .venv/bin/python bench/storage.py [--size 1000000] [--queries 300] [--cache vectors.npz]

Vectors: ``bench/query.py``'s: real all-MiniLM-L6-v2 embeddings of the STS-B and StackFAQ texts
(~17k), and past those, points scattered around them at the spread real neighbours have (each
real sentence gets ~60 close variants: a hard case for a quantiser, whose codes must tell near
twins apart). Queries are real user questions (StackFAQ queries), exact top 10 by brute force.

Memory is measured in a fresh child process that opens the written index (as a query process
does): ``RssAnon`` grown by the open (what a process holds: PQ codes, ids, lists, coarse
centroids) and ``RssFile`` grown by the queries (pages of the full vectors read to re-rank, which
the kernel may drop at will). The peer keeps its float32 vectors in memory.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

CHILD = r"""
import json, sys, time
sys.path.insert(0, {root!r})
import numpy as np

def status():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {{k: int(fields[k].split()[0]) * 1024 for k in ("RssAnon", "RssFile")}}

queries, truth = np.load({queries!r}), np.load({truth!r})
import faiss
from indexer.vectors.factory import read_vectors
from indexer.vectors.tuning import recall_at_10
before = status()
if {peer!r}:
    vectors = np.load({vectors!r})
    index = faiss.IndexIDMap(faiss.IndexFlatIP(queries.shape[1]))
    index.add_with_ids(vectors, np.arange(1, len(vectors) + 1, dtype=np.int64))
    del vectors  # the index holds its own copy
else:
    index = read_vectors(__import__("pathlib").Path({path!r}), mmap=True, storage="pq")
opened = status()
found = index.search(queries, 10)[1]
walls = []
for query in queries:
    started = time.perf_counter()
    index.search(query[None, :], 10)
    walls.append((time.perf_counter() - started) * 1000)
done = status()
codes_only = None if {peer!r} else recall_at_10(index.codes.search(queries, 10)[1], truth)
print(json.dumps({{
    "recall": recall_at_10(found, truth), "codes_only": codes_only, "p50": float(np.median(walls)),
    "p99": float(np.percentile(walls, 99)), "anon": opened["RssAnon"] - before["RssAnon"],
    "file": done["RssFile"] - before["RssFile"],
}}))
"""


def real_vectors(cache: Path | None) -> tuple[np.ndarray, np.ndarray]:
    from query import real_texts

    if cache is not None and cache.is_file():
        saved = np.load(cache)
        return saved["texts"], saved["queries"]
    from indexer.encoders.factory import encoder_for

    texts, queries = real_texts()
    embedder = encoder_for()
    found = embedder.embed(texts), embedder.embed(queries)
    if cache is not None:
        np.savez(cache, texts=found[0], queries=found[1])
    return found


def child(**paths: str | bool) -> dict[str, float]:
    code = CHILD.format(root=str(ROOT), **paths)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--cache", type=Path, help="npz of the real vectors (made if missing)")
    args = parser.parse_args()
    import faiss
    from query import corpus_vectors

    from indexer.vectors.factory import build_vector_index

    real, queries = real_vectors(args.cache)
    queries = np.ascontiguousarray(queries[: args.queries], dtype=np.float32)
    vectors = corpus_vectors(real, args.size, np.random.default_rng(0))
    ids = np.arange(1, len(vectors) + 1, dtype=np.int64)
    _, rows = faiss.knn(queries, vectors, 10, metric=faiss.METRIC_INNER_PRODUCT)
    with tempfile.TemporaryDirectory() as tmp:
        files = {name: str(Path(tmp) / f"{name}.npy") for name in ("queries", "truth", "vectors")}
        np.save(files["queries"], queries)
        np.save(files["truth"], ids[rows])
        np.save(files["vectors"], vectors)
        started = time.perf_counter()
        index = build_vector_index(vectors, ids, "auto", "pq")
        built = time.perf_counter() - started
        nprobe, nlist = index.nprobe, index.nlist
        path = Path(tmp) / "vectors.faiss"
        index.write(path)
        del index
        codes_bytes = path.stat().st_size
        pq = child(path=str(path), peer=False, **files)
        peer = child(path="", peer=True, **files)
    n = len(vectors)
    print(
        f"{n} vectors (dim {vectors.shape[1]}), {len(queries)} real queries; pq: build {built:.0f}s "
        f"(train, encode, tune), nlist {nlist}, nprobe {nprobe}, index file {codes_bytes / n:.1f} B/vector\n"
    )
    print("| storage | recall@10 | p50 ms | p99 ms | resident B/vector | page cache B/vector | p50 vs peer |")
    print("|---|---|---|---|---|---|---|")
    rows_out = [("FAISS IndexFlatIP float32 (peer)", peer), ("semsearch pq (IVF-PQ + exact re-rank)", pq)]
    for name, r in rows_out:
        print(
            f"| {name} | {r['recall']:.3f} | {r['p50']:.2f} | {r['p99']:.2f} | {r['anon'] / n:.1f} | "
            f"{r['file'] / n:.1f} | {peer['p50'] / r['p50']:.2f}x |"
        )
    print(f"\npq codes alone (no re-rank): recall@10 {pq['codes_only']:.3f}")


if __name__ == "__main__":
    main()
