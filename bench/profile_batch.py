"""Where a served /search's CPU goes, stage by stage, and which stages a batch shares: each stage
the server runs for a request (tokenising, the model, the lookup in each mode, the hits as dicts,
FAISS, the keyword side, the rows) timed in this process on random demo questions, one request
at a time against a batch of them in one call. CPU milliseconds per query (process time: the
model's ONNX Runtime threads included), medians of 5 runs; docs/profile-serve.md has the tables.

    .venv/bin/python bench/profile_batch.py [--batch 32]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def per_query(work: Callable[[], object], queries: int, runs: int = 5) -> tuple[float, float]:
    """Median CPU and wall milliseconds per query of ``work`` (which handles ``queries``)."""
    cpu, wall = [], []
    for _ in range(runs):
        started, began = time.process_time(), time.perf_counter()
        work()
        cpu.append((time.process_time() - started) * 1000 / queries)
        wall.append((time.perf_counter() - began) * 1000 / queries)
    return statistics.median(cpu), statistics.median(wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=32, help="Queries in a batch.")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from indexer import build_index
    from search.read.engine import SearchEngine, configure_threads
    from search.read.hybrid import depth

    configure_threads()
    questions = [json.loads(line)["text"] for line in (ROOT / "data" / "demo_questions.jsonl").open()]
    rng = random.Random(1)
    batch = [rng.choice(questions) for _ in range(args.batch)]
    n = len(batch)
    with tempfile.TemporaryDirectory() as tmp:
        index_dir = Path(tmp) / "index"
        build_index(ROOT / "data" / "demo_faq.csv", index_dir, text_fields=["question", "answer"])
        snapshot = SearchEngine(index_dir).snapshot
        encoding, lookup = snapshot.encoding, snapshot._lookup()
        ids = encoding.tokenize(batch)
        vectors = encoding.embed_tokens(ids)
        words = snapshot.said(batch, "hybrid")
        found = snapshot.run(snapshot.plan(batch, 5), vectors)
        nearest = [list(lookup._search(vectors[i], 5, None)) for i in range(n)]
        print(f"{n} random demo questions, {sum(map(len, ids)) / n:.1f} tokens on average\n")
        print(
            "| stage | one request at a time: CPU ms / query | a batch in one call | wall ms, alone / batch |"
        )
        print("|---|---|---|---|")
        stages: list[tuple[str, Callable[[], object], Callable[[], object] | None]] = [
            ("tokenise", lambda: [encoding.tokenize([q]) for q in batch], lambda: encoding.tokenize(batch)),
            (
                "the model (token ids)",
                lambda: [encoding.embed_tokens([i]) for i in ids],
                lambda: encoding.embed_tokens(ids),
            ),
        ]
        for mode in ("hybrid", "dense"):
            plans = [snapshot.plan([q], 5, mode=mode) for q in batch]
            whole = snapshot.plan(batch, 5, mode=mode)
            stages.append(
                (
                    f"lookup, {mode} (Snapshot.run)",
                    lambda plans=plans: [snapshot.run(p, vectors[i : i + 1]) for i, p in enumerate(plans)],
                    lambda whole=whole: snapshot.run(whole, vectors),
                )
            )
        stages += [
            (
                "  of which the keyword ranking",
                lambda: [lookup.keyword_ranking(w, depth(5), None) for w in words],
                None,
            ),
            (
                "  of which the FAISS search (k + 1)",
                lambda: [lookup.entries.search(vectors[i : i + 1], 6, None) for i in range(n)],
                lambda: lookup.entries.search(vectors, 6, None),
            ),
            (
                "  of which the rows of the hits (SQLite)",
                lambda: [_rows(lookup, rowids) for rowids in nearest],
                None,
            ),
            (
                "the hits as dicts (Hit.to_dict)",
                lambda: [[h.to_dict() for h in hits] for hits in found],
                None,
            ),
        ]
        for label, alone, together in stages:
            cpu, wall = per_query(alone, n)
            cpu_batch, wall_batch = per_query(together, n) if together else (cpu, wall)
            shared = f"{cpu_batch:.3f}" if together else "(per query)"
            print(f"| {label} | {cpu:.3f} | {shared} | {wall:.3f} / {wall_batch:.3f} |")
        print(f"\nThe model alone, the {2 * n} texts in batches of each size (Batching.plan's passes):\n")
        print("| texts in the batch | CPU ms / query | wall ms / query |\n|---|---|---|")
        texts = ids * 2  # the same texts at every size, in passes of ``size``
        for size in (1, 2, 4, 8, 16, 32, 64):
            parts = [texts[start : start + size] for start in range(0, len(texts), size)]
            cpu, wall = per_query(
                lambda parts=parts: [encoding.embed_tokens(part) for part in parts], len(texts)
            )
            print(f"| {size} | {cpu:.2f} | {wall:.2f} |")


def _rows(lookup: Any, rowids: list[int]) -> object:
    with lookup.reading() as catalog:
        return catalog.rows(rowids)


if __name__ == "__main__":
    main()
