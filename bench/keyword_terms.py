"""What a long query costs the keyword side: one 200,000-word entry (40 words, each about 5,000
times) among 1,000 short ones, and queries that repeat one of its words (30, 100, 300 times) or
hold 300 distinct words (its 40 first), timed as the user's words were OR-ed raw and as
``search.read.hybrid.match_expression`` builds them (repeats removed, terms capped), and the whole
keyword side of a search with them (``search.read.hybrid.keyword_scores``: the words' frequencies,
the BM25 ranking and which words each hit holds). The best of three runs (one for the slowest
raw query).

    PYTHONPATH=. .venv/bin/python bench/keyword_terms.py > docs/bench-keyword-terms.txt
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from indexer.catalog import Catalog
from indexer.reading.corpus import Entry
from search.read.hybrid import Words, keyword_scores, match_expression

VOCABULARY = [f"word{i}" for i in range(2000)]


def raw(query: str) -> str:
    """Every word OR-ed as typed: what the expression was before repeats were removed."""
    return " OR ".join('"' + word.replace('"', '""') + '"' for word in query.split())


def best_of(search: Callable[[], object], runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        search()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    chance = random.Random(0)
    long_text = " ".join(chance.choice(VOCABULARY[:40]) for _ in range(200_000))  # each 5,000 times
    short = [" ".join(chance.choice(VOCABULARY) for _ in range(20)) for _ in range(1000)]
    with tempfile.TemporaryDirectory() as tmp:
        catalog = Catalog.create(Path(tmp) / "meta.db", {})
        texts = [long_text, *short]
        entries = [Entry(str(i), text, {}) for i, text in enumerate(texts)]
        catalog.put(entries, range(1, len(texts) + 1), [1] * len(texts))
        catalog.commit()
        queries = {f"'word7' x{n}": " ".join(["word7"] * n) for n in (30, 100, 300)}
        queries["300 distinct words"] = " ".join(VOCABULARY[:300])
        print(f"{'query':<22} {'raw OR (s)':>11} {'built (s)':>10} {'scored (s)':>11} {'terms':>6}")
        for name, query in queries.items():
            built = match_expression(query)
            before = best_of(lambda q=query: catalog.keyword_search(raw(q), 10), 1 if "300" in name else 3)
            after = best_of(lambda e=built: catalog.keyword_search(e, 10))
            scored = best_of(lambda q=query: keyword_scores(catalog, Words(q, "keyword"), 10))
            terms = built.count(" OR ") + 1
            print(f"{name:<22} {before:>11.3f} {after:>10.3f} {scored:>11.3f} {terms:>6}")
        catalog.close()


if __name__ == "__main__":
    main()
