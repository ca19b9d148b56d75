"""A reranker trained by ``semsearch tune --cross-encoder`` on WikiQA's train split, measured on its
dev split in the open setting (a search engine's): every dev sentence one entry, every dev
question asked, unanswerable ones included.

    PYTHONPATH=. .venv/bin/python bench/wikiqa_rerank.py train OUT [--max-minutes 30]
    PYTHONPATH=. .venv/bin/python bench/wikiqa_rerank.py measure OUT [--depth 20 --depth 50] [--weight 0.1]
    PYTHONPATH=. .venv/bin/python bench/wikiqa_rerank.py held OUT [--share 0.2 --seed 0]
    PYTHONPATH=. .venv/bin/python bench/wikiqa_rerank.py faq OUT [--weight 0.1 --weight 0.3]

- ``train``: runs the command a user runs (``semsearch tune --cross-encoder --pairs
  WikiQASent-train.txt -o OUT --max-minutes N``) and prints its report and wall time.
- ``measure``: indexes the dev sentences with the default strategy (one entry per sentence id), asks
  each dev question with the reranker at each depth, and prints for the first stage alone, the
  reranker alone, the fused score the index serves and a fused score at each ``--weight`` (a weight
  the folder does not keep, such as the held-back's best that the sign test turned down): right
  sentence first (share of answerable questions), MRR@10 (answerable questions), the top score's
  AUROC (answerable vs unanswerable) and the promise's reach: the most answerable questions a
  threshold on the top score answers while 90% of what it answers is right (the best rule on dev, so
  an upper bound of what a rule calibrated elsewhere reaches); each ranking's chance of its gain
  over the first stage (``search.studies.cross_held.chance_of_gain`` at that one weight).
- ``held``: rebuilds the held-back questions ``tune`` measured OUT on (its share and seed) and
  judges OUT on them again with the verdict ``tune`` gives (the reranker's ONNX scores).
- ``faq``: the same reranker on other data, the FAQ sets of ``bench/rerank.py`` (the demo FAQ at
  depth 50, StackFAQ dev at depth 20, each its FAQ default index): MRR@10 of the first stage, the
  reranker alone, the folder's fused score and a fused score at each ``--weight``, each ranking's
  chance of its gain over the first stage (a weight fitted on answer sentences, read on an index
  whose entries are questions), and how far the reranker's scores of a question's candidates
  spread (max - min, the median over the questions).
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "wikiqa"


def train(output: str, max_minutes: float) -> None:
    began = time.monotonic()
    command = [sys.executable, "-m", "search.cli", "tune", "--cross-encoder"]
    command += [
        "--pairs",
        str(DATA / "WikiQASent-train.txt"),
        "-o",
        output,
        "--max-minutes",
        str(max_minutes),
    ]
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    subprocess.run(command, check=True)
    print(f"wall time {time.monotonic() - began:.0f} s, load average after: {os.getloadavg()[0]:.1f}")


def dev_set() -> tuple[list[tuple[str, str]], dict[str, str], dict[str, set[str]]]:
    """The dev corpus (sentence id, sentence), each question's text and its right sentence ids."""
    sentences: dict[str, str] = {}
    questions: dict[str, str] = {}
    right: dict[str, set[str]] = {}
    with (DATA / "WikiQA-dev.tsv").open(encoding="utf-8") as f:
        for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            sentences[row["SentenceID"]] = row["Sentence"]
            questions[row["QuestionID"]] = row["Question"]
            right.setdefault(row["QuestionID"], set())
            if row["Label"] == "1":
                right[row["QuestionID"]].add(row["SentenceID"])
    return list(sentences.items()), questions, right


def reciprocal_ranks(orders: list[list[tuple[str, float]]], right: list[set[str]]) -> np.ndarray:
    """Each answerable question's reciprocal rank of its first right sentence in the top 10 (0: none)."""
    first = [
        next((n for n, (h, _) in enumerate(o[:10], 1) if h in right[i]), 0) for i, o in enumerate(orders)
    ]
    return np.array([1 / first[i] if first[i] else 0.0 for i, r in enumerate(right) if r])


def judged(orders: list[list[tuple[str, float]]], right: list[set[str]]) -> dict[str, float]:
    """Right-first share and MRR@10 of the answerable questions, the top score's AUROC and the
    promise's reach at precision 0.9 (see the module doc)."""
    answerable = [i for i, r in enumerate(right) if r]
    first = [
        next((n for n, (h, _) in enumerate(o[:10], 1) if h in right[i]), 0) for i, o in enumerate(orders)
    ]
    mrr = np.mean(reciprocal_ranks(orders, right))
    top = np.array([o[0][1] if o else -np.inf for o in orders])
    yes, no = top[answerable], np.delete(top, answerable)
    auroc = ((yes[:, None] > no[None, :]).sum() + 0.5 * (yes[:, None] == no[None, :]).sum()) / (
        len(yes) * len(no)
    )
    correct = np.array([first[i] == 1 for i in range(len(orders))])
    ranked = np.argsort(-top, kind="stable")
    hits = np.cumsum(correct[ranked])
    precision = hits / np.arange(1, len(ranked) + 1)
    reach = max((hits[n] for n in range(len(ranked)) if precision[n] >= 0.9), default=0)
    return {
        "right first": 100 * float(np.mean([first[i] == 1 for i in answerable])),
        "mrr@10": float(mrr),
        "auroc": float(auroc),
        "answered at p0.9": 100 * reach / len(answerable),
    }


def measure(reranker_dir: str, depths: list[int], weights: list[float]) -> None:
    from indexer import Strategy, build_index
    from indexer.encoders.rerankers import reranker_for
    from search import SearchEngine
    from search.read.requests import SearchRequest
    from search.read.reranked import RerankOptions

    corpus, questions, right = dev_set()
    ids = list(questions)
    gold = [right[q] for q in ids]
    print(
        f"WikiQA dev, open setting: {len(corpus)} sentences, {len(ids)} questions "
        f"({sum(map(bool, gold))} answerable)"
    )
    with tempfile.TemporaryDirectory(prefix="semsearch-wikiqa-") as tmp:
        path = Path(tmp) / "dev.csv"
        with path.open("w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["id", "text"])
            writer.writerows(corpus)
        build_index(path, Path(tmp) / "index", Strategy())
        reranker = reranker_for(reranker_dir)
        engine = SearchEngine(Path(tmp) / "index", rerank=reranker)
        print(f"reranker: {reranker.folder.describe()}")
        for depth in depths:
            began = time.monotonic()
            answers = [
                engine.answer(
                    SearchRequest(questions[q], k=depth, rerank=RerankOptions(reranker.folder.path, depth))
                )[0]
                for q in ids
            ]
            took = time.monotonic() - began
            load = os.getloadavg()[0]
            print(f"depth {depth} ({took:.0f} s for {len(ids)} questions, load average {load:.1f}):")
            baseline: np.ndarray | None = None  # the first stage's ranks: the first way's
            for name, key in rankings(reranker.folder.weight, weights).items():
                orders = [sorted(((h.id, key(h)) for h in hits), key=lambda p: -p[1]) for hits in answers]
                found = judged(orders, gold)
                ranks = reciprocal_ranks(orders, gold)
                baseline = ranks if baseline is None else baseline
                said = gain_said(baseline, ranks)
                print(f"  {name:<24} " + ", ".join(f"{k} {v:.3f}" for k, v in found.items()) + said)


def rankings(kept: float, weights: list[float]) -> dict[str, Callable[[Any], float]]:
    """Each way a reranked hit is ordered by: the first stage alone (first), the reranker alone,
    the folder's fused score (its weight ``kept``), and fused at each of ``weights`` (weights the
    folder does not keep, e.g. the held-back's best)."""
    ways: dict[str, Callable[[Any], float]] = {
        "first stage": lambda h: h.first_score,
        "reranker alone": lambda h: h.rerank_score,
        f"fused (weight {kept:g})": lambda h: h.score,
    }
    for w in weights:
        ways[f"fused at weight {w:g}"] = lambda h, w=w: w * h.rerank_score + (1 - w) * h.first_score
    return ways


def gain_said(first: np.ndarray, ranks: np.ndarray) -> str:
    """How often chance gives a gain this large over the first stage's reciprocal ranks
    (``chance_of_gain`` at one weight); nothing for the first stage itself."""
    from search.studies.cross_held import chance_of_gain

    if ranks is first:
        return ""
    return f", chance of its gain over the first stage {chance_of_gain(first, ranks[None, :], 0):.3f}"


def held(reranker_dir: str, share: float, seed: int) -> None:
    """The held-back questions ``tune`` measured OUT on (the same share and seed rebuild the same
    set), judged again by today's verdict, with the reranker's ONNX scores."""
    from indexer.encoders.factory import encoder_for
    from indexer.encoders.rerankers import reranker_for
    from search.studies.cross_held import Mined, held_back_set
    from search.studies.cross_tuning import DEPTH, grouped
    from search.studies.tuning import hold_back, read_labels

    labels = grouped(read_labels(pairs=DATA / "WikiQASent-train.txt"))
    embed = encoder_for(None).embed
    mined = Mined.of(labels, embed)
    kept = held_back_set(labels, hold_back(labels, share, seed), mined, embed, DEPTH, seed)
    reranker = reranker_for(reranker_dir)
    scored: dict[tuple[str, str], float] = {}
    for question, row in zip(kept.anchors, kept.top, strict=True):
        texts = [kept.candidates[c] for c in row]
        scores = reranker.score(question, texts).tolist()
        scored.update(zip(((question, t) for t in texts), scores, strict=True))
    measured = kept.judged(scored)
    print(f"held back: {kept.size} questions, {kept.answered} answered (share {share:g}, seed {seed})")
    print("\n".join(measured.lines(kept.first_stage())))


def faq(reranker_dir: str, weights: list[float]) -> None:
    from rerank import SETS, build

    from indexer.encoders.rerankers import reranker_for
    from search import SearchEngine
    from search.read.reranked import RerankOptions
    from search.studies.labels import read_retrieval_set

    reranker = reranker_for(reranker_dir)
    print(f"reranker: {reranker.folder.describe()}")
    for name, depth in (("demo", 50), ("stackfaq", 20)):
        spec = SETS[name]
        data = read_retrieval_set(spec["queries"], spec["qrels"])
        judged = [q for q in data.queries if data.qrels.get(q.id)]
        with tempfile.TemporaryDirectory(prefix="semsearch-faq-") as tmp:
            engine = SearchEngine(build(name, Path(tmp)), rerank=reranker)
            asked = RerankOptions(reranker.folder.path, depth)
            answers = engine.search_many([q.text for q in judged], depth, rerank=asked)
        spread = np.median(
            [max(h.rerank_score for h in hits) - min(h.rerank_score for h in hits) for hits in answers]
        )
        print(
            f"{name} ({len(judged)} judged questions, depth {depth}; the reranker's scores of a question's "
            f"candidates spread over {spread:.3f}, median):"
        )
        baseline: np.ndarray | None = None
        for label, key in rankings(reranker.folder.weight, weights).items():
            orders = [sorted(hits, key=lambda h: -key(h)) for hits in answers]
            ranks = np.array(
                [
                    next((1 / n for n, h in enumerate(o[:10], 1) if data.qrels[q.id].get(h.id, 0) > 0), 0.0)
                    for q, o in zip(judged, orders, strict=True)
                ]
            )
            baseline = ranks if baseline is None else baseline
            print(f"  {label:<24} mrr@10 {100 * ranks.mean():.2f}{gain_said(baseline, ranks)}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", choices=("train", "measure", "held", "faq"))
    parser.add_argument("reranker")
    parser.add_argument("--max-minutes", type=float, default=30.0)
    parser.add_argument("--depth", type=int, action="append")
    parser.add_argument("--weight", type=float, action="append", help="also a fused score at this weight")
    parser.add_argument("--share", type=float, default=0.2, help="held: tune's --held-back")
    parser.add_argument("--seed", type=int, default=0, help="held: tune's --seed")
    args = parser.parse_args()
    if args.run == "train":
        train(args.reranker, args.max_minutes)
    elif args.run == "held":
        held(args.reranker, args.share, args.seed)
    elif args.run == "faq":
        faq(args.reranker, args.weight or [])
    else:
        measure(args.reranker, args.depth or [20, 50], args.weight or [])


if __name__ == "__main__":
    main()
