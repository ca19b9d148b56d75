"""The server's own work per request, against other code in the same run: ``POST /v1/embeddings``
with one text per request at 1, 8 and 32 clients, and reranked ``POST /search`` at 8 clients, on
servers of each checkout given (this one first), row by row in turn so the same load lies on all.

    .venv/bin/python bench/serve_http.py [--peer OLD_CHECKOUT ...] [--plain] [--seconds 8] [--repeats 1]
        [--model tiny|bundled|DIR] [--rows embeddings,rerank] [--depth 20] [--clients 1,8,32]

``--model tiny``: a random 1-layer, 32-wide BERT (the model nearly free, so what is timed is the
server: HTTP, validation, JSON, the batcher's hops); ``bundled``: all-MiniLM-L6-v2, beside its own
throughput in-process in batches of 32 (``Encoding.embed``), measured in turn with the rows (before
each row of each round), so the ratio of the two is of the same minutes. ``--plain``: this
checkout served a second time with ``httptools`` and ``uvloop`` hidden (uvicorn's h11 and asyncio,
what a server without them runs). The rerank rows search an index of the
demo FAQ (built with the same model) with a random 2-layer, 32-wide cross-encoder
(``--reranker DIR`` for another) at ``rerank_depth`` ``--depth``.

The clients speak HTTP/1.1 over kept-alive asyncio streams in this process (about 0.1 ms of CPU a
request; httpx costs 1.6-4.3 ms, as much as the server's work). Columns: texts (or searches)/s,
p50 and p99 of one request, and the server process's CPU milliseconds per request (all threads).
STS-B dev sentences (unique, in file order) are the texts; the demo questions the searches.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED = ROOT.parent / "shared" / "data"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, all threads) process ``pid`` has used (Linux: /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


PLAIN = "import sys; sys.modules.update(httptools=None, uvloop=None); from search.cli import main; main()"
"""``semsearch serve`` as where neither ``httptools`` nor ``uvloop`` is installed (importing them fails)."""


def start(code: Path, arguments: list[str], plain: bool = False) -> tuple[subprocess.Popen, int]:
    """``semsearch serve`` of the checkout ``code`` on a free port, once it answers /health."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(code)}
    launch = ["-c", PLAIN] if plain else ["-m", "search.cli"]
    command = [sys.executable, *launch, "serve", *arguments, "--port", str(port), "--quiet"]
    server = subprocess.Popen(command, env=env, cwd=code, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 180
    while time.time() < deadline and server.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
                if b" 200 " in s.recv(100):
                    return server, port
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise SystemExit(f"the server of {code} did not start: {server.stderr.read().decode()[-2000:]}")


async def post(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: bytes, body: bytes) -> int:
    """One POST on a kept-alive connection; the answer's status (its body read and dropped)."""
    writer.write(
        b"POST %s HTTP/1.1\r\nHost: [::1]\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (path, len(body), body)
    )
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    return int(head.split(b" ", 2)[1])


async def drive(port: int, clients: int, seconds: float, path: str, bodies: list[bytes]) -> dict[str, float]:
    """``clients`` connections posting ``bodies`` (at random) to ``path`` for ``seconds``."""
    latencies: list[float] = []
    errors = 0
    stop = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal errors
        rng = random.Random()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < stop:
                began = time.perf_counter()
                if await post(reader, writer, path.encode(), rng.choice(bodies)) != 200:
                    errors += 1
                latencies.append(time.perf_counter() - began)
        finally:
            writer.close()

    began = time.perf_counter()
    await asyncio.gather(*[client() for _ in range(clients)])
    elapsed = time.perf_counter() - began
    latencies.sort()
    return {
        "rps": len(latencies) / elapsed,
        "p50": statistics.median(latencies) * 1000,
        "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
        "errors": errors,
        "requests": len(latencies),
    }


def measured(server: subprocess.Popen, port: int, *load: object) -> dict[str, float]:
    before = cpu_seconds(server.pid)
    row = asyncio.run(drive(port, *load))  # type: ignore[arg-type]
    row["cpu"] = (cpu_seconds(server.pid) - before) * 1000 / max(row["requests"], 1)
    return row


def sentences(count: int = 2000) -> list[str]:
    with (SHARED / "stsb" / "stsb-dev.tsv").open(encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    return list(dict.fromkeys([r[1] for r in rows] + [r[2] for r in rows]))[:count]


class InProcess:
    """The served model in this process, batches of 32 (``Encoding.embed``), no server: a row of
    ``seconds`` at a time, in turn with the servers' rows."""

    def __init__(self, model: str, texts: list[str]):
        from indexer.embedding.strategy import Strategy
        from search.read.loading import load_encoding

        self.encoding = load_encoding(Strategy(model=model)).result()
        self.texts = texts
        self.encoding.embed(texts[:32])
        self.rows: dict[int, list[float]] = {}

    def row(self, clients: int, seconds: float) -> None:
        """An in-process row, taken just before the servers' rows at ``clients``."""
        done, began = 0, time.perf_counter()
        while time.perf_counter() - began < seconds:
            self.encoding.embed(self.texts[done % 1024 : done % 1024 + 32])
            done += 32
        self.rows.setdefault(clients, []).append(done / (time.perf_counter() - began))

    def ratios(self, rows: dict[tuple[str, int], list[dict[str, float]]]) -> None:
        """Each server row's texts/s as a share of the in-process row taken just before it (the
        median of the rounds' shares), beside the in-process rows' median."""
        print("\n| code | clients | texts/s | in-process texts/s | share of in-process |")
        print("|---|---|---|---|---|")
        for (code, clients), runs in rows.items():
            before = self.rows[clients]
            shares = sorted(run["rps"] / batch for run, batch in zip(runs, before, strict=True))
            served, batch = typical(runs)["rps"], statistics.median_high(before)
            print(f"| {code} | {clients} | {served:.0f} | {batch:.0f} | {shares[len(shares) // 2]:.0%} |")


def typical(runs: list[dict[str, float]]) -> dict[str, float]:
    """The median run by texts/s (the higher of the middle two)."""
    return sorted(runs, key=lambda row: row["rps"])[len(runs) // 2]


def table(title: str, unit: str, rows: dict[tuple[str, int], list[dict[str, float]]], base: str) -> None:
    print(f"\n{title}\n")
    print(f"| code | clients | {unit}/s | p50 ms | p99 ms | errors | server CPU ms/request | vs {base} |")
    print("|---|---|---|---|---|---|---|---|")
    for (code, clients), runs in rows.items():
        r = typical(runs)
        peer = typical(rows[base, clients])
        print(
            f"| {code} | {clients} | {r['rps']:.0f} | {r['p50']:.1f} | {r['p99']:.1f} | {r['errors']} "
            f"| {r['cpu']:.2f} | {r['rps'] / peer['rps']:.2f}x |"
        )


def compare(
    codes: dict[str, tuple[Path, bool]],
    arguments: list[str],
    loads: list[tuple[int, str, list[bytes]]],
    args: argparse.Namespace,
    beside: InProcess | None = None,
) -> dict[tuple[str, int], list[dict[str, float]]]:
    """Each load on a server of each checkout (``(code, plain)``), in turn, ``args.repeats`` times;
    ``beside``: an in-process row before each load of each round."""
    servers = {name: start(code, arguments, plain) for name, (code, plain) in codes.items()}
    rows: dict[tuple[str, int], list[dict[str, float]]] = {}
    try:
        for _, port in servers.values():
            asyncio.run(drive(port, 8, 2.0, *loads[0][1:]))  # warm
        for _ in range(args.repeats):
            for clients, path, bodies in loads:
                if beside is not None:
                    beside.row(clients, args.seconds)
                for name, (server, port) in servers.items():
                    row = measured(server, port, clients, args.seconds, path, bodies)
                    rows.setdefault((name, clients), []).append(row)
    finally:
        for server, _ in servers.values():
            server.terminate()
            server.wait(timeout=30)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--peer", type=Path, action="append", default=[], help="another checkout served beside this one"
    )
    parser.add_argument("--plain", action="store_true", help="this checkout also without httptools/uvloop")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each row (the median shown)")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--reranker", help="a cross-encoder folder (default: a random tiny one)")
    parser.add_argument("--rows", default="embeddings,rerank")
    parser.add_argument("--depth", type=int, default=20)
    parser.add_argument("--clients", default="1,8,32", help="the embeddings rows' client counts")
    args = parser.parse_args()
    from tests.helpers import random_bert, random_cross_encoder

    named = ["peer"] if len(args.peer) == 1 else [f"peer {i}" for i in range(1, len(args.peer) + 1)]
    peers = {name: path.resolve() for name, path in zip(named, args.peer, strict=True)}
    codes = {"this": (ROOT, False), **{name: (path, False) for name, path in peers.items()}}
    if args.plain:
        codes["plain"] = (ROOT, True)
    texts = sentences()
    with tempfile.TemporaryDirectory(prefix="serve-http-") as tmp:
        work = Path(tmp)
        model = {"tiny": lambda: random_bert(work / "model", layers=1), "bundled": lambda: "all-MiniLM-L6-v2"}
        served = model.get(args.model, lambda: args.model)()
        load = f"load average {os.getloadavg()[0]:.2f} at the start, {os.cpu_count()} cores"
        if "embeddings" in args.rows:
            bodies = [json.dumps({"input": text}).encode() for text in texts]
            loads = [(int(n), "/v1/embeddings", bodies) for n in args.clients.split(",")]
            beside = None if args.model == "tiny" else InProcess(served, texts)
            rows = compare(codes, ["--model", served], loads, args, beside)
            title = (
                f"/v1/embeddings, one text a request, model {args.model}, {args.seconds:g} s a row; {load}"
            )
            table(title, "texts", rows, "this")
            if beside is not None:
                beside.ratios(rows)
        if "rerank" in args.rows:
            from indexer import build_index
            from indexer.embedding.strategy import Strategy

            reranker = args.reranker or random_cross_encoder(work / "reranker")
            index = work / "index"
            build_index(
                ROOT / "data" / "demo_faq.csv", index, Strategy(model=served), text_fields=["question"]
            )
            questions = [json.loads(line)["text"] for line in (ROOT / "data" / "demo_questions.jsonl").open()]
            bodies = [
                json.dumps({"query": q, "k": 10, "rerank_depth": args.depth}).encode() for q in questions
            ]
            rows = compare(codes, [str(index), "--rerank", reranker], [(8, "/search", bodies)], args)
            title = f"/search reranked at depth {args.depth}, model {args.model}; {load}"
            table(title, "searches", rows, "this")
            shutil.rmtree(index, ignore_errors=True)


if __name__ == "__main__":
    main()
