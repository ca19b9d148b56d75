"""``group_by`` on StackFAQ dev, where each thread's question is one FAQ question with 1-24 answers
(719 entries, 125 threads): how many distinct threads the first k hits show, plain and grouped by
``thread``, whether the query's thread is among them (Success@k by thread), and the time of a
grouped lookup as a ratio of a plain one in the same run (queries embedded once, so the ratio is
the lookup's own cost).

    .venv/bin/python bench/group_by.py [--fields text] [-k 10]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from indexer.writing.build import build_index
from search.read.engine import SearchEngine
from search.read.hybrid import DENSE

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "stackfaq"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fields", default="text", help="Corpus fields embedded (text = the question).")
    parser.add_argument("-k", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3, help="Timed passes over the queries.")
    args = parser.parse_args()
    queries = [json.loads(line) for line in (DATA / "queries.jsonl").open(encoding="utf-8")]
    with tempfile.TemporaryDirectory() as tmp:
        index = Path(tmp) / "idx"
        build_index(DATA / "corpus.jsonl", index, text_fields=args.fields.split(","))
        snapshot = SearchEngine(index).snapshot
        texts = [q["text"] for q in queries]
        vectors = snapshot.embed(texts)
        results, seconds = {}, {}
        for name, group_by in (("plain", None), ("grouped", "thread")):
            times = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                plan = snapshot.plan(texts, args.k, group_by=group_by, mode=DENSE)
                results[name] = snapshot.run(plan, vectors)
                times.append(time.perf_counter() - started)
            seconds[name] = min(times) / len(queries)
    print(f"StackFAQ dev, {len(queries)} queries, fields {args.fields}, k={args.k}")
    print(f"{'':<8} {'threads shown':>14} {'success@1':>10} {'success@k':>10} {'ms/query':>9}")
    for name, found in results.items():
        threads = [[h.fields["thread"] for h in hits] for hits in found]
        shown = np.mean([len(set(t)) for t in threads])
        first = np.mean([t[:1] == [q["thread"]] for t, q in zip(threads, queries, strict=True)])
        any_k = np.mean([q["thread"] in t for t, q in zip(threads, queries, strict=True)])
        print(f"{name:<8} {shown:>14.2f} {first:>10.3f} {any_k:>10.3f} {1000 * seconds[name]:>9.2f}")
    print(f"grouped / plain lookup time: {seconds['grouped'] / seconds['plain']:.2f}")


if __name__ == "__main__":
    main()
