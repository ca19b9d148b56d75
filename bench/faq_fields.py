"""Question alone, question + answer, and the two scores combined, on StackFAQ dev (part 2 of
issue 10, measured only: no strategy option builds the combination yet).

    .venv/bin/python bench/faq_fields.py [--weights 0.3,0.5,0.7]

Each entry gets two vectors with the bundled model: its question (``text``) and its question and
answer joined (``text answer``, cut at the model's max length); an entry's combined score is
``w * cos(q, question) + (1 - w) * cos(q, question+answer)``. Metrics over the dev queries against
all 719 entries (``search.evaluate.retrieval_metrics``): MRR@10 and Success@1.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from indexer.embedding import Embedder
from search.evaluate import read_qrels, retrieval_metrics

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "stackfaq"


def unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def ranked(scores: np.ndarray, ids: list[str], query_ids: list[str]) -> dict[str, list[str]]:
    top = np.argsort(-scores, axis=1, kind="stable")[:, :10]
    return {q: [ids[i] for i in row] for q, row in zip(query_ids, top.tolist(), strict=True)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--weights", default="0.3,0.5,0.7")
    args = parser.parse_args()
    corpus = [json.loads(line) for line in (DATA / "corpus.jsonl").open(encoding="utf-8")]
    queries = [json.loads(line) for line in (DATA / "queries.jsonl").open(encoding="utf-8")]
    qrels = read_qrels(DATA / "qrels.tsv")
    ids, query_ids = [e["id"] for e in corpus], [q["id"] for q in queries]
    embedder = Embedder()
    asked = unit(embedder.embed([q["text"] for q in queries]))
    question = unit(embedder.embed([e["text"] for e in corpus]))
    both = unit(embedder.embed([f"{e['text']} {e['answer']}" for e in corpus]))
    cos_q, cos_qa = asked @ question.T, asked @ both.T
    rows = [("question", cos_q), ("question+answer", cos_qa)]
    rows += [(f"combined w={w}", w * cos_q + (1 - w) * cos_qa) for w in map(float, args.weights.split(","))]
    print(f"{'scored on':<44} {'MRR@10':>7} {'S@1':>6}")
    for name, scores in rows:
        found = retrieval_metrics(ranked(scores, ids, query_ids), qrels, 10)
        print(f"{name:<44} {found['mrr@10']:>7.3f} {found['success@1']:>6.3f}")


if __name__ == "__main__":
    main()
