"""Cross-encoder recipes compared at equal steps on WikiQA train's held-back questions: what chose
``tune --cross-encoder``'s learning rate for a new head (docs/tuning.md).

    PYTHONPATH=. .venv/bin/python bench/cross_recipe.py [--steps 150] NAME:LOSS:RATE ...

Each ``NAME:LOSS:RATE`` trains a new head on all-MiniLM-L6-v2 for the same steps of 2 lists (or
as many pairs), AdamW with 10 % warm-up then linear decay, from the same seed. LOSS: ``rank``, the
tune's lists, listwise + binary cross-entropy on the labels alone; ``teachS``, share S of each
list's listwise target the first stage's order (the softmax of its cosines x 20), so that a list
with no answer is ranked too (``TEACHER_SHARE``: ``tune`` trains with 0.8); either with ``+listW``
adds W times ``answerable_loss`` (each list's soft top score against whether it holds an
answer); ``bce``, pairs drawn at random, binary cross-entropy with positives weighted to
balance. RATE: the peak rate, ``6e-5x30`` the head's own 30 times the rest's (``NEW_HEAD_TIMES``:
``tune``'s; none, the same). Then the reranker alone and fused at its best weight are measured on
the held-back questions (5 % of WikiQA train, the first stage's best 20 each), beside the first
stage. The mined pool is embedded once and kept in ``--cache``.
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import time
from pathlib import Path

import numpy as np
import torch

from indexer.encoders import cross_training
from indexer.encoders.cross_training import head_groups, load_cross, ranking_loss
from indexer.encoders.factory import encoder_for
from search.studies.cross_held import Mined, held_back_set
from search.studies.cross_tuning import DEPTH, grouped, training_rows
from search.studies.tuning import hold_back, read_labels

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "wikiqa" / "WikiQASent-train.txt"
LISTS = 2


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("recipes", nargs="+")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/semsearch-cross-recipe-mined.pkl"))
    args = parser.parse_args()
    labels = grouped(read_labels(pairs=DATA))
    embed = encoder_for(None, None).embed
    if args.cache.exists():
        mined = Mined(*pickle.loads(args.cache.read_bytes()), embed)
    else:
        mined = Mined.of(labels, embed, True)
        args.cache.write_bytes(pickle.dumps((mined.texts, mined.vectors)))
    held = held_back_set(labels, hold_back(labels, 0.05, 0), mined, embed, DEPTH, 0)
    rows = training_rows(labels, held, mined, 0)
    print(f"held back {held.size} questions ({held.answered} answerable); {len(rows)} lists", flush=True)
    print("first stage", held.first_stage().line(held.metric), flush=True)
    pairs = [
        (q, t, float(right and j == 0))
        for q, texts, right in zip(rows.questions, rows.texts, rows.answered, strict=True)
        for j, t in enumerate(texts)
    ]
    for recipe in args.recipes:
        name, loss, rate = recipe.split(":")
        rate, _, times = rate.partition("x")
        run(name, loss, float(rate), float(times or 1), args.steps, rows, pairs, held)


def answerable_loss(logits: torch.Tensor, sizes: list[int], answered: list[bool]) -> torch.Tensor:
    """Binary cross-entropy of each list's log-sum-exp of logits (a soft top score) against
    whether the list holds an answer: a term that trains the top score to tell them apart."""
    edges = np.cumsum([0, *sizes])
    lists = [torch.logsumexp(logits[a:b], 0) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    truth = logits.new_tensor([float(a) for a in answered])
    return torch.nn.functional.binary_cross_entropy_with_logits(torch.stack(lists), truth)


def run(name, loss, rate, head_times, steps, rows, pairs, held) -> None:  # noqa: ANN001
    cross = load_cross(None, None, "cpu", "fp32", 0)
    cross_training.NEW_HEAD_TIMES = head_times
    optimizer = torch.optim.AdamW(head_groups(cross.network, rate), lr=rate, weight_decay=0.01)
    warm = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: s / warm if s < warm else max(0.0, (steps - s) / (steps - warm))
    )
    positive_weight = torch.tensor(sum(1 - y for *_, y in pairs) / sum(y for *_, y in pairs))
    rng = random.Random(0)
    torch.manual_seed(0)
    began, losses = time.monotonic(), []
    for _ in range(steps):
        cross.network.train()
        if loss == "bce":
            batch = rng.sample(pairs, LISTS * 9)
            logits = cross.logits([b[0] for b in batch], [b[1] for b in batch])
            targets = torch.tensor([b[2] for b in batch])
            bce = torch.nn.functional.binary_cross_entropy_with_logits
            value = bce(logits, targets, pos_weight=positive_weight)
        else:
            chosen = rng.sample(range(len(rows)), LISTS)
            sizes = [len(rows.texts[i]) for i in chosen]
            questions = [rows.questions[i] for i, n in zip(chosen, sizes, strict=True) for _ in range(n)]
            logits = cross.logits(questions, [t for i in chosen for t in rows.texts[i]])
            answered = [rows.answered[i] for i in chosen]
            teacher = None
            share, _, weight = loss.partition("+list")
            if share.startswith("teach"):
                cross_training.TEACHER_SHARE = float(share.removeprefix("teach"))
                teacher = logits.new_tensor([c for i in chosen for c in rows.teacher[i]])
            value = ranking_loss(logits, sizes, answered, teacher)
            if weight:
                value = value + float(weight) * answerable_loss(logits, sizes, answered)
        optimizer.zero_grad()
        value.backward()
        torch.nn.utils.clip_grad_norm_(cross.network.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(value.item())
    took = time.monotonic() - began
    measured = held.measure(cross.scores)
    print(
        f"{name} ({loss}, {rate:g}): {steps} steps in {took:.0f} s, load {os.getloadavg()[0]:.1f}, "
        f"loss {np.mean(losses[:10]):.3f} -> {np.mean(losses[-10:]):.3f} | alone "
        f"{measured.reranked.line(held.metric)} | fused at {measured.weight} "
        f"{measured.fused.line(held.metric)}",
        flush=True,
    )


if __name__ == "__main__":
    main()
