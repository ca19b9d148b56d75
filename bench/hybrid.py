"""Dense, keyword and hybrid search side by side: ranking (MRR@10, Success@1) on each data set's
own labels, and whether the top hit's score tells an answerable question from an off-topic one
(AUC: each set's questions against the other sets' questions asked of the same index). The
hybrid keyword weight is chosen on StackFAQ dev alone (the grid below); every other figure is a
set it was not chosen on.

Sets (``../shared/data``, never copied into the repo):

- demo: ``data/demo_faq.csv`` indexed as the README does (``--text-field question --also
  question,answer``), its 110 user questions (``data/demo_questions.jsonl``);
- stackfaq dev: the 719 FAQ entries, the FAQ question indexed (``text``), and again with the
  answer as a second vector (``--also text,answer``); the 499 dev queries;
- stsb dev / sick trial: the second sentences of every pair are the corpus; the first sentence of
  each pair scored >= 4 (SICK: and entailed) is a query whose answer is its second sentence.

    PYTHONPATH=. .venv/bin/python bench/hybrid.py > docs/bench-hybrid.txt
    PYTHONPATH=. .venv/bin/python bench/hybrid.py --sets demo,stsb --no-grid   # some sets, no weight grid

(``SHARED_DATA=/path/to/shared/data`` where the data is not beside the checkout.)

Searches as the product does (``Snapshot.plan`` and ``run`` on the queries embedded once), each
weight of the grid stored on the index as ``calibrate --hybrid-weight`` stores it.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from indexer.writing.build import build_index
from search.read.engine import SearchEngine
from search.read.hybrid import DEFAULT_WEIGHT, HYBRID, MODES, WEIGHTS
from search.studies.calibration import store_hybrid_weight
from search.studies.evaluate import read_qrels, retrieval_metrics
from search.studies.promise import auroc

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SHARED_DATA", ROOT.parent / "shared" / "data"))
K = 10


def demo() -> dict:
    questions = [json.loads(line) for line in (ROOT / "data" / "demo_questions.jsonl").open()]
    return {
        "corpus": ROOT / "data" / "demo_faq.csv",
        "build": {"text_fields": ["question"], "also": ["question", "answer"]},
        "queries": [(q["id"], q["text"]) for q in questions],
        "qrels": read_qrels(ROOT / "data" / "demo_qrels.tsv"),
    }


def stackfaq(also: bool) -> dict:
    data = SHARED / "stackfaq"
    queries = [json.loads(line) for line in (data / "queries.jsonl").open()]
    return {
        "corpus": data / "corpus.jsonl",
        "build": {"also": ["text", "answer"]} if also else {},
        "queries": [(q["id"], q["text"]) for q in queries],
        "qrels": read_qrels(data / "qrels.tsv"),
    }


def pairs(path: Path, keep, tmp: Path) -> dict:
    """A retrieval set of sentence pairs: every second sentence an entry, a kept pair's first a query."""
    with path.open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    ids: dict[str, str] = {}
    for row in rows:
        ids.setdefault(row["sentence2"], f"d{len(ids)}")
    corpus = tmp / f"{path.stem}.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for t, i in ids.items()))
    asked = [
        (f"q{n}", row) for n, row in enumerate(rows) if keep(row) and row["sentence1"] != row["sentence2"]
    ]
    return {
        "corpus": corpus,
        "build": {},
        "queries": [(q, row["sentence1"]) for q, row in asked],
        "qrels": {q: {ids[row["sentence2"]]: 1} for q, row in asked},
    }


def searched(engine: SearchEngine, texts: list[str], vectors: np.ndarray, mode: str) -> list:
    snapshot = engine.snapshot
    return snapshot.run(snapshot.plan(texts, K, mode=mode), vectors)


def measured(engine: SearchEngine, data: dict, off: list[str], vectors: tuple, mode: str) -> dict:
    texts = [text for _, text in data["queries"]]
    found = searched(engine, texts, vectors[0], mode)
    ranked = {q: [h.id for h in hits] for (q, _), hits in zip(data["queries"], found, strict=True)}
    metrics = retrieval_metrics(ranked, data["qrels"], K)
    asked = [hits[0].score if hits else 0.0 for hits in found]
    offside = [hits[0].score if hits else 0.0 for hits in searched(engine, off, vectors[1], mode)]
    scores = np.array(asked + offside)
    positive = np.array([True] * len(asked) + [False] * len(offside))
    middle = {"top": float(np.median(asked)), "off": float(np.median(offside))}
    return {**metrics, "auc": auroc(scores, positive), **middle}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sets", help="Comma-separated starts of the set names to measure (default: all).")
    parser.add_argument("--no-grid", action="store_true", help="Leave out the weight grid on StackFAQ dev.")
    args = parser.parse_args()
    chosen = args.sets.split(",") if args.sets else None
    with tempfile.TemporaryDirectory() as tmp:
        sets = {
            "demo (question, also question+answer)": demo(),
            "stackfaq dev (question)": stackfaq(also=False),
            "stackfaq dev (question, also question+answer)": stackfaq(also=True),
            "stsb dev pairs >= 4": pairs(
                SHARED / "stsb" / "stsb-dev.tsv", lambda r: float(r["score"]) >= 4, Path(tmp)
            ),
            "sick trial entailed >= 4": pairs(
                SHARED / "sick-r" / "sick-trial.tsv",
                lambda r: float(r["score"]) >= 4 and r["entailment_label"] == "ENTAILMENT",
                Path(tmp),
            ),
        }
        questions = {name: [text for _, text in data["queries"]] for name, data in sets.items()}
        print("Top-1 score AUC: the set's questions (answerable) against the other sets' questions")
        print("asked of the same index (off-topic); median top-1 score of each.\n")
        print("| set | mode | MRR@10 | Success@1 | AUC top-1 | median top-1 answerable | off-topic |")
        print("|---|---|---|---|---|---|---|")
        grid = {}
        for number, (name, data) in enumerate(sets.items()):
            if chosen and not any(name.startswith(start) for start in chosen):
                continue
            index = Path(tmp) / f"idx{number}"
            build_index(data["corpus"], index, **data["build"])
            engine = SearchEngine(index)
            kind = name.split(" (")[0]
            off = [q for other, texts in questions.items() if other.split(" (")[0] != kind for q in texts]
            vectors = (engine.snapshot.embed([t for _, t in data["queries"]]), engine.snapshot.embed(off))
            for mode in MODES:
                m = measured(engine, data, off, vectors, mode)
                print(
                    f"| {name} | {mode} | {m['mrr@10']:.4f} | {m['success@1']:.4f} | {m['auc']:.4f} "
                    f"| {m['top']:.3f} | {m['off']:.3f} |"
                )
            if name == "stackfaq dev (question)" and not args.no_grid:
                grid[name] = {}
                for weight in WEIGHTS:
                    store_hybrid_weight(index, weight)
                    engine.reload_if_changed()
                    grid[name][weight] = measured(engine, data, off, vectors, HYBRID)
        if not grid:
            return
        print(f"\nThe hybrid keyword weight (default {DEFAULT_WEIGHT:g}), chosen on StackFAQ dev:\n")
        names = list(grid)
        print("| weight | " + " | ".join(f"{n} MRR@10 | AUC" for n in names) + " |")
        print("|---" * (1 + 2 * len(names)) + "|")
        for weight in WEIGHTS:
            chosen = [grid[name][weight] for name in names]
            cells = " | ".join(f"{m['mrr@10']:.4f} | {m['auc']:.4f}" for m in chosen)
            print(f"| {weight:g} | {cells} |")


if __name__ == "__main__":
    main()
