"""A reranker on ONNX Runtime in fp32 (``onnx``) against the same reranker in int8 (``onnx-int8``),
measured side by side in one run, interleaved, so that a busy machine slows both alike: the ratios
are the figures, the absolute numbers are the load's.

Data: WikiQA dev in the open setting (bench/wikiqa_rerank.py: every dev sentence one entry of a
default index, every dev question asked); each question's ``--depth`` first-stage candidates are
the pairs.

- pairs/s: each question's pairs scored by one runtime then the other (which goes first
  alternates question by question), ``--rounds`` times over the questions;
- quality: each question's candidates ordered by each runtime's score: right first, MRR@10
  (answerable questions), the top score's AUROC (answerable vs unanswerable), beside the first
  stage alone; and how far the int8 scores are from fp32's;
- ``--clients`` HTTP clients on a server per runtime (both started, driven in turn,
  ``--http-rounds`` times ``--seconds`` each), reranked searches at ``--depth``.

    PYTHONPATH=. .venv/bin/python bench/rerank_int8.py RERANKER [--depth 20] [--rounds 2]
        [--questions 0] [--clients 8] [--seconds 10] [--http-rounds 2] [--skip-http]
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RUNTIMES = ("onnx", "onnx-int8")
SERVER = """
import sys
from indexer.encoders.options import EmbeddingOptions
from indexer.encoders.rerankers import reranker_for
from search.read.loading import load_engine
from search.server import create_app, listen, serve
index, reranker, runtime, port = sys.argv[1:]
options = EmbeddingOptions(serving=True)
loading = load_engine(index, options, reranker_for(reranker, options, runtime=runtime))
serve(create_app(index, loading=loading), listen("127.0.0.1", int(port)), access_log=False)
"""
"""A server whose engine reranks with the reranker on ``runtime`` (``semsearch serve`` takes no
runtime for its reranker)."""


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def first_stage(index: Path, questions: list[str], depth: int) -> list[list[tuple[str, str, float]]]:
    """Each question's ``depth`` best first-stage hits: (id, text, score)."""
    from search.read.engine import SearchEngine

    found = SearchEngine(index, rerank=False).search_many(questions, depth)
    return [[(h.id, h.text, h.score) for h in hits] for hits in found]


def timed(rerankers: dict, questions: list[str], hits: list, rounds: int) -> tuple[dict, dict]:
    """Pairs/s of each runtime, interleaved question by question, and the last round's scores."""
    seconds = dict.fromkeys(rerankers, 0.0)
    scores: dict[str, list[np.ndarray]] = {}
    for _ in range(rounds):
        scores = {name: [] for name in rerankers}
        for n, (question, found) in enumerate(zip(questions, hits, strict=True)):
            order = list(rerankers) if n % 2 == 0 else list(reversed(rerankers))
            for name in order:
                began = time.perf_counter()
                scores[name].append(rerankers[name].score(question, [t for _, t, _ in found]))
                seconds[name] += time.perf_counter() - began
    count = rounds * sum(len(found) for found in hits)
    return {name: count / spent for name, spent in seconds.items()}, scores


def quality(hits: list, scores: dict, gold: list[set[str]]) -> None:
    """Print each ordering's figures (bench/wikiqa_rerank.py's ``judged``) and the int8 distance."""
    from wikiqa_rerank import judged

    ways = {"first stage": [np.array([s for _, _, s in found]) for found in hits], **scores}
    for name, per_question in ways.items():
        orders = [
            sorted(((h[0], float(s)) for h, s in zip(found, got, strict=True)), key=lambda p: -p[1])
            for found, got in zip(hits, per_question, strict=True)
        ]
        found = judged(orders, gold)
        print(f"  {name:<12} " + ", ".join(f"{k} {v:.4f}" for k, v in found.items()))
    fp32, int8 = (np.concatenate(scores[name]) for name in RUNTIMES)
    same_top = np.mean(
        [np.argmax(a) == np.argmax(b) for a, b in zip(*scores.values(), strict=True) if len(a)]
    )
    apart = np.abs(int8 - fp32)
    print(
        f"  int8 - fp32 score: mean |d| {apart.mean():.4f}, max |d| {apart.max():.4f} (fp32 scores "
        f"span {fp32.min():.3f}..{fp32.max():.3f}); same top candidate {100 * same_top:.1f}%"
    )


def servers(index: Path, reranker: str) -> dict[str, tuple[subprocess.Popen, int]]:
    """One server per runtime, both started (each waits idle while the other is driven)."""
    import httpx
    from rerank import free_port

    started = {}
    for runtime in RUNTIMES:
        port = free_port()
        command = [sys.executable, "-c", SERVER, str(index), reranker, runtime, str(port)]
        started[runtime] = (subprocess.Popen(command, stdout=subprocess.DEVNULL, cwd=ROOT), port)
    for _, port in started.values():
        deadline = time.time() + 300
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise SystemExit("a server did not start")
            time.sleep(0.5)
    return started


def over_http(index: Path, reranker: str, questions: list[str], args: argparse.Namespace) -> None:
    from rerank import drive

    started = servers(index, reranker)
    try:
        rows: dict[str, list[dict]] = {runtime: [] for runtime in RUNTIMES}
        for _, port in started.values():
            asyncio.run(drive(port, args.clients, 2.0, questions, args.depth))  # warm
        for _ in range(args.http_rounds):
            for runtime, (_, port) in started.items():
                rows[runtime].append(
                    asyncio.run(drive(port, args.clients, args.seconds, questions, args.depth))
                )
        print(f"{args.clients} HTTP clients, reranked searches at depth {args.depth} (load {load()}):")
        for runtime, done in rows.items():
            rps = [row["rps"] for row in done]
            p50 = [row["p50"] for row in done]
            errors = sum(row["errors"] for row in done)
            print(
                f"  {runtime:<10} req/s {' '.join(f'{r:.1f}' for r in rps)}, "
                f"p50 ms {' '.join(f'{p:.0f}' for p in p50)}, errors {errors}"
            )
        ratio = sum(r["rps"] for r in rows["onnx-int8"]) / sum(r["rps"] for r in rows["onnx"])
        print(f"  int8 / fp32 req/s: {ratio:.2f}")
    finally:
        for process, _ in started.values():
            process.terminate()
            process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("reranker")
    parser.add_argument("--depth", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--questions", type=int, default=0, help="Dev questions used (0: all 296).")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--http-rounds", type=int, default=2)
    parser.add_argument("--skip-http", action="store_true")
    args = parser.parse_args()
    from wikiqa_rerank import dev_set

    from indexer import Strategy, build_index
    from indexer.encoders.rerankers import reranker_for

    corpus, asked, right = dev_set()
    ids = list(asked)[: args.questions or None]
    questions, gold = [asked[q] for q in ids], [right[q] for q in ids]
    print(f"load average before: {load()}; cores: {len(os.sched_getaffinity(0))}")
    with tempfile.TemporaryDirectory(prefix="bench-rerank-int8-") as tmp:
        path = Path(tmp) / "dev.csv"
        with path.open("w", encoding="utf-8", newline="") as f:
            csv.writer(f).writerows([("id", "text"), *corpus])
        build_index(path, Path(tmp) / "index", Strategy())
        hits = first_stage(Path(tmp) / "index", questions, args.depth)
        rerankers = {runtime: reranker_for(args.reranker, runtime=runtime) for runtime in RUNTIMES}
        for reranker in rerankers.values():
            reranker.score(questions[0], [t for _, t, _ in hits[0]])  # warm: sessions made
        print(
            f"WikiQA dev, open setting: {len(corpus)} sentences, {len(ids)} questions "
            f"({sum(map(bool, gold))} answerable), depth {args.depth}; reranker {args.reranker}"
        )
        rates, scores = timed(rerankers, questions, hits, args.rounds)
        print(f"pairs/s, interleaved, {args.rounds} rounds (load after {load()}):")
        print("  " + ", ".join(f"{name} {rate:.0f}" for name, rate in rates.items()))
        print(f"  int8 / fp32: {rates['onnx-int8'] / rates['onnx']:.2f}")
        print("quality on the same candidates:")
        quality(hits, scores, gold)
        if not args.skip_http:
            over_http(Path(tmp) / "index", args.reranker, questions, args)
    print(f"load average after: {load()}")


if __name__ == "__main__":
    main()
