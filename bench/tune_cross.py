"""Rerankers tuned by ``semsearch tune --cross-encoder``, measured on data no run trained on.

    PYTHONPATH=. .venv/bin/python bench/tune_cross.py stsb DIR          # STS-B dev Spearman of DIR
    PYTHONPATH=. .venv/bin/python bench/tune_cross.py stackfaq [--max-minutes 20] [--epochs 2]

- ``stsb DIR``: Spearman x100 of a reranker folder's pair scores (sigmoid of its logit, as
  ``CrossEncoder.predict`` gives them) against STS-B dev's gold; the folder is trained with
  ``semsearch tune --cross-encoder --pairs stsb-train.tsv`` (its held-back tenth of train chose the
  checkpoint, never dev).
- ``stackfaq``: the 50 threads of StackFAQ dev are split by ``random.Random(0)``: 15 threads'
  questions are set apart and never given to ``tune``; it trains (``search.studies.tuning.cross_tune``,
  what the command runs) on the other 35 threads' questions, holding its own tenth back to stop
  early. Printed: MRR@10 x100 of the set-apart questions over the 719 entries, the bundled
  bi-encoder's ranking alone, and its best 50 reordered by the tuned reranker.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import tempfile
import time
from pathlib import Path

import numpy as np

from indexer.embedding.strategy import Strategy
from indexer.encoders.cross_training import load_cross
from indexer.encoders.factory import encoder_for
from search.studies.evaluate import correlations
from search.studies.tuning import DEPTH, cross_measure_for, cross_tune, pair_labels, retrieval_labels

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
STACKFAQ = DATA / "stackfaq"
SET_APART = 15


def stsb(model: str) -> None:
    labels = pair_labels(DATA / "stsb" / "stsb-dev.tsv")
    started = time.monotonic()
    assert labels.scores is not None
    scores = load_cross(model).scores(list(zip(labels.first, labels.second, strict=True)))
    found = correlations(scores, labels.scores)
    print(
        f"STS-B dev, {len(scores)} pairs: spearman {found['spearman']:.2f}, pearson {found['pearson']:.2f} "
        f"({time.monotonic() - started:.0f} s)"
    )


def stackfaq(max_minutes: float, epochs: int) -> None:
    queries = [json.loads(line) for line in (STACKFAQ / "queries.jsonl").read_text().splitlines()]
    threads = sorted({q["thread"] for q in queries})
    random.Random(0).shuffle(threads)
    apart = set(threads[:SET_APART])
    with tempfile.TemporaryDirectory(prefix="semsearch-tune-cross-") as tmp:
        split = {}
        for name, chosen in (
            ("train", lambda q: q["thread"] not in apart),
            ("apart", lambda q: q["thread"] in apart),
        ):
            kept = [q for q in queries if chosen(q)]
            ids = {q["id"] for q in kept}
            path = Path(tmp) / f"{name}-queries.jsonl"
            path.write_text("".join(json.dumps(q) + "\n" for q in kept), encoding="utf-8")
            qrels = Path(tmp) / f"{name}-qrels.tsv"
            with (
                (STACKFAQ / "qrels.tsv").open(encoding="utf-8") as source,
                qrels.open("w", encoding="utf-8") as out,
            ):
                rows = list(csv.reader(source, delimiter="\t"))
                out.write(
                    "\t".join(rows[0]) + "\n" + "".join("\t".join(r) + "\n" for r in rows[1:] if r[0] in ids)
                )
            split[name] = retrieval_labels(path, qrels, STACKFAQ / "corpus.jsonl")
        done = cross_tune(
            split["train"], Path(tmp) / "reranker", epochs=epochs, max_minutes=max_minutes, report=print
        )
        print(
            f"tuned on {done.trained_pairs} {done.kind} of {len(threads) - SET_APART} threads, "
            f"{done.minutes:.1f} min, {done.epochs:.2f} epochs ({done.stopped}); held-back mrr@10: "
            f"first stage {done.first_stage:.2f}, reranked {done.before:.2f} untuned -> {done.after:.2f}"
        )
        labels = split["apart"]
        everything = np.ones(len(labels.first), dtype=bool)
        measure, alone = cross_measure_for(labels, everything, encoder_for(Strategy()).embed)
        reranked = measure(load_cross(str(Path(tmp) / "reranker")).scores)
        print(
            f"StackFAQ dev, {SET_APART} threads set apart ({len(set(labels.first))} questions), MRR@10: "
            f"bundled bi-encoder {alone:.2f}, its top {DEPTH} reranked {reranked:.2f} "
            f"({reranked - alone:+.2f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", choices=("stsb", "stackfaq"))
    parser.add_argument("model", nargs="?", help="stsb: the reranker folder to measure")
    parser.add_argument("--max-minutes", type=float, default=20.0)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    if args.run == "stsb":
        stsb(args.model)
    else:
        stackfaq(args.max_minutes, args.epochs)


if __name__ == "__main__":
    main()
