"""The rerank depth trade-off: a search's first stage reranked by a cross-encoder at each depth
(10, 20, 50, 100 by default; 0 is the first stage alone), on the demo FAQ and StackFAQ dev.

For each data set and depth: MRR@10 and Success@1 of its labelled questions (the search's own
rerank stage: ``SearchEngine(index, rerank=...)``), p50/p99 latency of one query at a time in this
process, and p50/p99 and requests/s of 8 HTTP clients on ``semsearch serve INDEX --rerank``'s
``/search`` (``rerank_depth`` in the body; depth 0 asks ``rerank: false``). Beside it, the same
pairs (each question with its depth best first-stage texts) scored by semsearch's reranker
(``Reranker.score``, one call per question, as the search calls it) and by sentence-transformers'
``CrossEncoder.predict`` (one call per question, its default batch of 32), interleaved question by
question: pairs/s of each and their ratio.

Indexes: the FAQ default (demo: ``--text-field question --also question,answer``; StackFAQ:
``--text-field text --also text,answer``), so the reranker reads each entry's question, as a
search hands it the entry's embedded text.

    .venv/bin/python bench/rerank.py --reranker DIR [--data demo,stackfaq] [--depths 10,20,50,100]
        [--seconds 8] [--queries 0] [--peer-queries 50] [--clients 8] [--backend onnx-int8]

``--queries N`` measures N questions of each set spread over it (0: all); ``--peer-queries`` how
many of those the pairs/s comparison scores. Run it on a quiet machine: every number is a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED = ROOT.parent / "shared" / "data"
K = 10

SETS = {
    "demo": {
        "corpus": ROOT / "data" / "demo_faq.csv",
        "queries": ROOT / "data" / "demo_questions.jsonl",
        "qrels": ROOT / "data" / "demo_qrels.tsv",
        "text": ["question"],
        "also": ["question", "answer"],
    },
    "stackfaq": {
        "corpus": SHARED / "stackfaq" / "corpus.jsonl",
        "queries": SHARED / "stackfaq" / "queries.jsonl",
        "qrels": SHARED / "stackfaq" / "qrels.tsv",
        "text": ["text"],
        "also": ["text", "answer"],
    },
}


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


def spread(items: list[Any], count: int) -> list[Any]:
    """``count`` of ``items`` spread evenly over them (all of them where ``count`` is 0 or more):
    questions come grouped by thread, so the first ones would be a few threads only."""
    if not count or count >= len(items):
        return items
    return [items[int(i * len(items) / count)] for i in range(count)]


def build(name: str, directory: Path) -> Path:
    from indexer.embedding.fields import FieldScoring
    from indexer.writing.build import build_index

    spec = SETS[name]
    target = directory / name
    build_index(spec["corpus"], target, text_fields=spec["text"], also=FieldScoring.asked(spec["also"], None))
    return target


def one_process(
    index: Path, reranker: str, questions: list[Any], qrels: dict, depths: list[int], backend: str | None
) -> dict:
    """Per depth: MRR@10, Success@1 and per-query latency, searched one question at a time."""
    from search.read.engine import SearchEngine, configure_threads
    from search.studies.evaluate import retrieval_metrics

    configure_threads()
    from search.read.reranked import RerankOptions

    engine = SearchEngine(index, rerank=RerankOptions(reranker, backend=backend))
    engine.search_many([questions[0].text], K)  # warm: graphs loaded, sessions made
    rows = {}
    for depth in depths:
        fields = {"rerank": None} if depth == 0 else {"rerank_depth": max(depth, K)}
        ranked, times = {}, []
        for question in questions:
            started = time.perf_counter()
            (hits,) = engine.search_many([question.text], K, **fields)
            times.append(time.perf_counter() - started)
            ranked[question.id] = [h.id for h in hits]
        scores = retrieval_metrics(ranked, qrels, K)
        rows[depth] = {
            "mrr@10": scores["mrr@10"],
            "success@1": scores["success@1"],
            "p50": statistics.median(times) * 1000,
            "p99": percentile(times, 0.99) * 1000,
        }
    return rows


def candidates(index: Path, questions: list[Any], depth: int) -> list[list[str]]:
    """Each question's ``depth`` best first-stage texts (what a reranked search hands the reranker)."""
    from search.read.engine import SearchEngine

    engine = SearchEngine(index, rerank=False)
    found = engine.search_many([q.text for q in questions], depth)
    return [[hit.text for hit in hits] for hits in found]


def pairs_per_second(
    reranker: str, questions: list[Any], texts: list[list[str]], depths: list[int], backend: str | None
) -> dict:
    """Per depth: pairs/s of semsearch's reranker and of ``CrossEncoder.predict``, one call per
    question each, on the same pairs, interleaved question by question (which goes first
    alternates), so that a busy machine slows both alike."""
    from sentence_transformers import CrossEncoder

    from indexer.encoders.rerankers import reranker_for

    ours = reranker_for(reranker, runtime=backend)
    peer = CrossEncoder(reranker, device="cpu")
    ours.score(questions[0].text, texts[0][:K])  # warm both
    peer.predict([(questions[0].text, t) for t in texts[0][:K]], show_progress_bar=False)
    sides = {
        "semsearch": lambda question, found: ours.score(question, found),
        "peer": lambda question, found: peer.predict([(question, t) for t in found], show_progress_bar=False),
    }
    rows = {}
    for depth in [d for d in depths if d]:
        asked = [(q.text, found[:depth]) for q, found in zip(questions, texts, strict=True)]
        spent = dict.fromkeys(sides, 0.0)
        for turn, (question, found) in enumerate(asked):
            for name in sorted(sides, reverse=turn % 2 == 1):
                started = time.perf_counter()
                sides[name](question, found)
                spent[name] += time.perf_counter() - started
        count = sum(len(found) for _, found in asked)
        semsearch, st = count / spent["semsearch"], count / spent["peer"]
        rows[depth] = {"pairs": count, "semsearch": semsearch, "peer": st, "ratio": semsearch / st}
    return rows


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(index: Path, reranker: str, backend: str | None) -> tuple[subprocess.Popen, int]:
    import httpx

    port = free_port()
    command = [sys.executable, "-m", "search.cli", "serve", str(index), "--rerank", reranker]
    command += ["--rerank-backend", backend] if backend else []
    process = subprocess.Popen(
        [*command, "--port", str(port), "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return process, port
        except httpx.HTTPError:
            time.sleep(0.3)
    process.kill()
    raise SystemExit("the server did not start")


async def ask(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> int:
    """One POST /search on a kept-alive connection; the answer's status."""
    writer.write(
        b"POST /search HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    head = await reader.readuntil(b"\r\n\r\n")
    fields = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line)
    length = int(next(v for k, v in fields.items() if k.strip().lower() == b"content-length"))
    await reader.readexactly(length)
    return int(head.split(b" ", 2)[1])


async def drive(
    port: int, clients: int, seconds: float, questions: list[str], depth: int
) -> dict[str, float]:
    """``clients`` clients asking reranked searches at ``depth`` (0: not reranked) for ``seconds``.
    asyncio streams, not httpx: the clients share the cores with the server (bench/load.py)."""
    latencies: list[float] = []
    errors = 0
    stop = time.perf_counter() + seconds
    extra = {"rerank": False} if depth == 0 else {"rerank_depth": max(depth, K)}

    async def client() -> None:
        nonlocal errors
        rng = random.Random()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < stop:
                body = json.dumps({"query": rng.choice(questions), "k": K, **extra}).encode()
                started = time.perf_counter()
                if await ask(reader, writer, body) != 200:
                    errors += 1
                latencies.append(time.perf_counter() - started)
        finally:
            writer.close()

    began = time.perf_counter()
    await asyncio.gather(*[client() for _ in range(clients)])
    elapsed = time.perf_counter() - began
    return {
        "rps": len(latencies) / elapsed,
        "p50": statistics.median(latencies) * 1000,
        "p99": percentile(latencies, 0.99) * 1000,
        "errors": errors,
    }


def over_http(
    index: Path, reranker: str, questions: list[str], depths: list[int], args: argparse.Namespace
) -> dict:
    process, port = serve(index, reranker, args.backend)
    try:
        asyncio.run(drive(port, args.clients, 1.0, questions, depths[-1]))  # warm
        return {
            depth: asyncio.run(drive(port, args.clients, args.seconds, questions, depth)) for depth in depths
        }
    finally:
        process.terminate()
        process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reranker", required=True, help="A cross-encoder folder.")
    parser.add_argument("--data", default="demo,stackfaq")
    parser.add_argument("--depths", default="10,20,50,100")
    parser.add_argument("--seconds", type=float, default=8.0, help="Per HTTP row.")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--queries", type=int, default=0, help="Questions measured per set, spread (0: all).")
    parser.add_argument("--peer-queries", type=int, default=50, help="Questions of the pairs/s comparison.")
    parser.add_argument("--skip-http", action="store_true")
    parser.add_argument(
        "--backend",
        choices=("onnx", "onnx-int8", "torch"),
        help="What runs semsearch's reranker (default: its own choice).",
    )
    args = parser.parse_args()
    from search.read.queries import read_queries
    from search.studies.evaluate import read_qrels

    depths = [0, *[int(d) for d in args.depths.split(",")]]
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; cores: {os.cpu_count()}")
    print(f"reranker: {args.reranker} ({args.backend or 'default'} backend)")
    with tempfile.TemporaryDirectory(prefix="bench-rerank-") as tmp:
        for name in args.data.split(","):
            spec = SETS[name]
            qrels = read_qrels(spec["qrels"])
            questions = [q for q in read_queries(str(spec["queries"])) if q.id in qrels]
            questions = spread(questions, args.queries)
            started = time.perf_counter()
            index = build(name, Path(tmp))
            built = time.perf_counter() - started
            print(f"\n== {name}: {len(questions)} questions, index built in {built:.0f} s")
            local = one_process(index, args.reranker, questions, qrels, depths, args.backend)
            peers = spread(questions, args.peer_queries)
            texts = candidates(index, peers, max(depths))
            pairs = pairs_per_second(args.reranker, peers, texts, depths, args.backend)
            http = (
                {}
                if args.skip_http
                else over_http(index, args.reranker, [q.text for q in questions], depths, args)
            )
            print(
                f"{'depth':>5} {'mrr@10':>7} {'succ@1':>7} {'p50 ms':>7} {'p99 ms':>7} | "
                f"{args.clients} clients: {'req/s':>6} {'p50 ms':>7} {'p99 ms':>7} {'err':>4} | "
                f"pairs/s: {'ours':>6} {'st':>6} {'ratio':>5}"
            )
            for depth in depths:
                row, net, pair = local[depth], http.get(depth), pairs.get(depth)
                served = (
                    f"{net['rps']:6.1f} {net['p50']:7.1f} {net['p99']:7.1f} {net['errors']:4d}"
                    if net
                    else f"{'-':>6} {'-':>7} {'-':>7} {'-':>4}"
                )
                scored = (
                    f"{pair['semsearch']:6.0f} {pair['peer']:6.0f} {pair['ratio']:5.2f}"
                    if pair
                    else f"{'-':>6} {'-':>6} {'-':>5}"
                )
                label = "none" if depth == 0 else str(depth)
                local_row = (
                    f"{row['mrr@10']:7.4f} {row['success@1']:7.4f} {row['p50']:7.1f} {row['p99']:7.1f}"
                )
                print(f"{label:>5} {local_row} | {'':>10}{served} | {'':>9}{scored}")
    load = os.getloadavg()
    print(f"\nload average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
