"""A training step of ``tune``, the way it runs (a step's rows of like length in one pass,
``indexer.encoders.train_passes``; torch's fused AdamW) against one padded pass a step with
torch's for-loop AdamW, interleaved step by step in one process so that a busy machine slows both
alike (docs/tuning.md).

    PYTHONPATH=. .venv/bin/python bench/train_step.py [--steps 30] [--runs cross,faq,sts] [--calls 8,16,64]

- ``cross``: a reranker's step (the bundled model with a new one-label head): 2 WikiQA train
  questions of 9 or more sentences, their first 9 each, the listwise loss.
- ``faq``: a bi-encoder's step (the bundled model): 16 StackFAQ questions against 16 answers
  drawn at random, the in-batch loss.
- ``sts``: the same on 16 STS-B train sentence pairs.

``--calls``: also passes cut at these fixed costs (padded tokens a pass is worth; the product's is
``train_passes.TRAIN_CPU_CALL_TOKENS``), fused AdamW, interleaved with the rest.

Each step is forward, backward, gradient clipping and the optimiser's step, timed alone; the
table shows the median and mean ms of each way, and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import statistics
import time
from pathlib import Path

import torch

from indexer.embedding.strategy import Strategy
from indexer.encoders import train_passes
from indexer.encoders.cross_training import load_cross, ranking_loss
from indexer.encoders.training import _vectors, in_batch_loss, trainable

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
WAYS = {
    "one padded pass, for-loop AdamW": (1 << 40, False),
    "passes of like length, fused AdamW": (None, True),
}


def cross_run(rng: random.Random):
    """A reranker's model and its step's loss on 2 WikiQA lists of 9 pairs."""
    by: dict[str, list[str]] = {}
    for line in (DATA / "wikiqa" / "WikiQASent-train.txt").open(encoding="utf-8"):
        question, sentence, _ = line.rstrip("\n").split("\t")
        by.setdefault(question, []).append(sentence)
    questions = [q for q, sentences in by.items() if len(sentences) >= 9]
    cross = load_cross()

    def loss() -> torch.Tensor:
        chosen = rng.sample(questions, 2)
        first = [q for q in chosen for _ in range(9)]
        logits = cross.train_logits(first, [s for q in chosen for s in by[q][:9]])
        return ranking_loss(logits, [9, 9], [True, True])

    return cross.network, loss


def bi_run(rng: random.Random, pairs: list[tuple[str, str]]):
    """The bundled bi-encoder and its step's loss on 16 of ``pairs``."""
    encoder = trainable(Strategy(backend="torch"))
    rows = torch.arange(16)

    def loss() -> torch.Tensor:
        chosen = rng.sample(pairs, 16)
        first = _vectors(encoder, [a for a, _ in chosen])
        return in_batch_loss(first, _vectors(encoder, [b for _, b in chosen], "passage"), rows, rows)

    return encoder.model, loss


def faq_pairs() -> list[tuple[str, str]]:
    def texts(name: str, field: str) -> list[str]:
        lines = (DATA / "stackfaq" / name).open(encoding="utf-8")
        return [json.loads(line)[field] for line in lines]

    questions, answers = texts("queries.jsonl", "text"), texts("corpus.jsonl", "answer")
    return [(q, answers[i % len(answers)]) for i, q in enumerate(questions)]


def sts_pairs() -> list[tuple[str, str]]:
    with (DATA / "stsb" / "stsb-train.tsv").open(encoding="utf-8", newline="") as f:
        rows = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [(r["sentence1"], r["sentence2"]) for r in rows]


def timed(network: torch.nn.Module, loss, steps: int, ways: dict) -> dict[str, list[float]]:
    """Seconds of each step of each way, the ways interleaved step by step."""
    optimisers = {
        way: torch.optim.AdamW(network.parameters(), lr=1e-7, weight_decay=0.01, fused=fused)
        for way, (_, fused) in ways.items()
    }
    default = train_passes.TRAIN_CPU_CALL_TOKENS
    seconds: dict[str, list[float]] = {way: [] for way in ways}
    network.train()
    for step in range(steps + 1):  # the first round warms up
        for way, (call, _) in ways.items():
            train_passes.TRAIN_CPU_CALL_TOKENS = call or default
            began = time.perf_counter()
            optimisers[way].zero_grad()
            loss().backward()
            torch.nn.utils.clip_grad_norm_(network.parameters(), 1.0)
            optimisers[way].step()
            if step:
                seconds[way].append(time.perf_counter() - began)
    train_passes.TRAIN_CPU_CALL_TOKENS = default
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--runs", default="cross,faq,sts")
    parser.add_argument("--calls", default="", help="also passes cut at these fixed costs, e.g. 8,16,64")
    args = parser.parse_args()
    ways = dict(WAYS)
    for call in filter(None, args.calls.split(",")):
        ways[f"passes cut at {int(call)} tokens, fused AdamW"] = (int(call), True)
    print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}")
    print("| step | way | median ms | mean ms | speed (medians) |\n|---|---|---|---|---|")
    for name in args.runs.split(","):
        rng = random.Random(0)
        run = (
            cross_run(rng) if name == "cross" else bi_run(rng, faq_pairs() if name == "faq" else sts_pairs())
        )
        seconds = timed(*run, args.steps, ways)
        base = statistics.median(seconds[next(iter(WAYS))])
        for way, taken in seconds.items():
            median, mean = statistics.median(taken) * 1000, statistics.mean(taken) * 1000
            print(f"| {name} | {way} | {median:.0f} | {mean:.0f} | {base / median * 1000:.2f}x |")
    print(f"load average after {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
