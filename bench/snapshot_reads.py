"""What reading a snapshot's rows at its generation costs a query: ``Snapshot.run`` (vectors
already embedded, k=10, dense) on the demo FAQ index with question + answer vectors, with every row read
in a generation-checked read transaction (``Snapshot.reading``, what queries do) and with the
plain lock alone (what they did before), in the same run. The peer (sentence-transformers + FAISS)
has no catalog to read, so there is no peer row; the embedding a query also pays is ~5 ms
(docs/bench-query.txt).

    .venv/bin/python bench/snapshot_reads.py
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from indexer import Strategy, build_index  # noqa: E402
from indexer.catalog import Catalog  # noqa: E402
from indexer.embedding.fields import FieldScoring  # noqa: E402
from search.read.engine import SearchEngine, Snapshot  # noqa: E402
from search.read.hybrid import DENSE  # noqa: E402


def median_ms(snapshot: Snapshot, questions: list[str], vectors, rounds: int = 5) -> float:
    """The best of ``rounds`` medians of one dense lookup per question."""
    plans = [snapshot.plan([question], 10, mode=DENSE) for question in questions]
    best = []
    for _ in range(rounds + 2):
        times = []
        for plan, vector in zip(plans, vectors, strict=True):
            started = time.perf_counter()
            snapshot.run(plan, vector[None, :])
            times.append(time.perf_counter() - started)
        best.append(statistics.median(times) * 1000)
    return min(best[2:])


def main() -> None:
    questions = [json.loads(line)["text"] for line in (ROOT / "data" / "demo_questions.jsonl").open()]
    with tempfile.TemporaryDirectory() as tmp:
        index = Path(tmp) / "idx"
        also = FieldScoring(("question", "answer"))
        build_index(ROOT / "data" / "demo_faq.csv", index, Strategy(), text_fields=["question"], also=also)
        snapshot = SearchEngine(index).snapshot
        vectors = snapshot.embed(questions)
        checked = median_ms(snapshot, questions, vectors)
        reading = Snapshot.reading

        @contextlib.contextmanager
        def plain(self: Snapshot) -> Iterator[Catalog]:
            with self.db_lock:
                yield self.index.catalog

        Snapshot.reading = plain  # type: ignore[method-assign]
        try:
            unchecked = median_ms(snapshot, questions, vectors)
        finally:
            Snapshot.reading = reading  # type: ignore[method-assign]
    print(f"{len(questions)} demo questions, k=10, lookup alone (embedding excluded), p50 of each run's best")
    print("| rows read | p50 ms |")
    print("|---|---|")
    print(f"| in a generation-checked read transaction (queries today) | {checked:.3f} |")
    print(f"| under the lock alone | {unchecked:.3f} |")
    print(f"cost of the check: {checked - unchecked:+.3f} ms a lookup ({checked / unchecked:.2f}x)")


if __name__ == "__main__":
    main()
