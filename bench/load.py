"""Load on the HTTP API from a second process over loopback: 1, 8 and 32 concurrent clients for a
bounded time each, requests/s, p50/p99 latency and errors. The same run serves the same index with
micro-batching off (--max-batch 1, one forward pass per request, as a naive server does) so the
gain is a ratio measured side by side. A last row has 10% of the 32 clients give up on every
request (send it, hang up after 50 ms): the numbers are those of the other clients, whose
service should not suffer from work nobody waits for. The batching server also serves every
query in dense mode at 1, 8 and 32 clients: the default (hybrid) mode's cost beside the dense one.

The clients speak HTTP/1.1 over keep-alive connections with asyncio streams, not httpx: the load
generator shares the machine's cores with the server, and httpx spent 1.6-4.3 ms of CPU per
request (as much as the server's whole work), so the bench measured its own client.

    .venv/bin/python bench/load.py [--seconds 10] [--repeats 1] [--rows all|batching|modes]
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

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def quit_early(url: str, stop: float, questions: list[str]) -> None:
    """Send a whole request, hang up after 50 ms without reading the answer; again until ``stop``."""
    host, port = url.removeprefix("http://").split(":")
    rng = random.Random()
    while time.perf_counter() < stop:
        body = json.dumps({"query": rng.choice(questions), "k": 5}).encode()
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /search HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.close()
        await writer.wait_closed()


async def ask(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, question: str, mode: str | None = None
) -> int:
    """One POST /search on a kept-alive connection (in ``mode``, else the index's default); the
    answer's status."""
    body = json.dumps({"query": question, "k": 5, **({"mode": mode} if mode else {})}).encode()
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
    url: str, clients: int, seconds: float, questions: list[str], quitting: int = 0, mode: str | None = None
) -> dict[str, float]:
    """``clients`` clients that wait for their answers (measured), plus ``quitting`` that never do."""
    host, port = url.removeprefix("http://").split(":")
    latencies: list[float] = []
    errors = 0
    stop = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal errors
        rng = random.Random()
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while time.perf_counter() < stop:
                started = time.perf_counter()
                try:
                    if await ask(reader, writer, rng.choice(questions), mode) != 200:
                        errors += 1
                except (OSError, asyncio.IncompleteReadError, ValueError, StopIteration):
                    errors += 1
                    writer.close()
                    reader, writer = await asyncio.open_connection(host, int(port))
                latencies.append(time.perf_counter() - started)
        finally:
            writer.close()

    began = time.perf_counter()
    await asyncio.gather(
        *[client() for _ in range(clients)], *[quit_early(url, stop, questions) for _ in range(quitting)]
    )
    elapsed = time.perf_counter() - began
    latencies.sort()
    return {
        "rps": len(latencies) / elapsed,
        "p50": statistics.median(latencies) * 1000,
        "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
        "errors": errors,
        "requests": len(latencies),
    }


def serve(index_dir: Path, max_batch: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = subprocess.Popen(
        [  # this checkout's code, whatever copy of semsearch is installed
            sys.executable,
            "-m",
            "search.cli",
            "serve",
            str(index_dir),
            "--port",
            str(port),
            "--max-batch",
            str(max_batch),
            "--quiet",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("server did not start")


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, all threads) process ``pid`` has used (Linux: /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measured(process: subprocess.Popen, url: str, *load: Any) -> dict[str, float]:
    """``drive``'s row of ``url`` under ``load``, with the server's CPU milliseconds per answered
    request beside it."""
    before = cpu_seconds(process.pid)
    row = asyncio.run(drive(url, *load))
    row["cpu"] = (cpu_seconds(process.pid) - before) * 1000 / max(row["requests"], 1)
    return row


def median_run(rows: list[dict[str, float]]) -> dict[str, float]:
    """The run of median requests/s among a row's repeats."""
    return sorted(rows, key=lambda row: row["rps"])[len(rows) // 2]


LOADS = {
    "all": ((1, 0), (8, 0), (32, 0), (29, 3)),
    "batching": ((32, 0),),
    "modes": ((1, 0), (8, 0), (32, 0)),
}
"""(clients, of which hanging up) per row set."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=1, help="Runs of each row (the median run is shown).")
    parser.add_argument(
        "--rows",
        choices=("all", "batching", "modes"),
        default="all",
        help="batching: only the 32-client rows, on and off; modes: only the default mode against dense "
        "on the batching server (no server without batching).",
    )
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))  # build with this checkout's code, as the server runs it
    from indexer import build_index

    questions = [json.loads(line)["text"] for line in (ROOT / "data" / "demo_questions.jsonl").open()]
    with tempfile.TemporaryDirectory() as tmp:
        index_dir = Path(tmp) / "index"
        build_index(ROOT / "data" / "demo_faq.csv", index_dir, text_fields=["question", "answer"])
        servers = {
            max_batch: serve(index_dir, max_batch)
            for max_batch in ((64,) if args.rows == "modes" else (64, 1))
        }
        try:
            for _, url in servers.values():
                asyncio.run(drive(url, 4, 2.0, questions))  # warm up
            runs: dict[tuple[int, int, int], list[dict[str, float]]] = {}
            dense: dict[int, list[dict[str, float]]] = {}
            for _ in range(args.repeats):  # on and off alternate row by row: the same load around both
                for clients, quitting in LOADS[args.rows]:
                    for max_batch, (process, url) in servers.items():
                        row = measured(process, url, clients, args.seconds, questions, quitting)
                        runs.setdefault((max_batch, clients, quitting), []).append(row)
                    if not quitting and args.rows != "batching":  # the batching server, every query dense
                        row = asyncio.run(drive(servers[64][1], clients, args.seconds, questions, 0, "dense"))
                        dense.setdefault(clients, []).append(row)
        finally:
            for process, _ in servers.values():
                process.terminate()
                process.wait()
    results = {key: median_run(rows) for key, rows in sorted(runs.items(), key=lambda item: -item[0][0])}
    if args.rows == "modes":
        rows = f"{args.seconds:.0f}s per row, median of {args.repeats} run(s)"
        print(f"POST /search k=5 on the demo FAQ (211 entries), loopback, the batching server, {rows}")
    else:
        report(results, args)
    if not dense:
        return
    print("\nThe default mode (hybrid) against dense on the same batching server, the same run:\n")
    print("| clients | hybrid req/s | dense req/s | hybrid / dense |")
    print("|---|---|---|---|")
    for clients, rows in dense.items():
        hybrid, alone = results[64, clients, 0]["rps"], median_run(rows)["rps"]
        print(f"| {clients} | {hybrid:.0f} | {alone:.0f} | {hybrid / alone:.2f}x |")


def report(results: dict[tuple[int, int, int], dict[str, float]], args: argparse.Namespace) -> None:
    """The table of micro-batching on and off."""
    print(
        f"POST /search k=5 on the demo FAQ (211 entries), {args.seconds:.0f}s per row, loopback, on and off "
        f"alternating row by row, median of {args.repeats} run(s)\n"
    )
    print(
        "| micro-batching | clients | requests/s | p50 ms | p99 ms | p99/p50 | errors "
        "| server CPU ms/request | req/s vs off |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for (max_batch, clients, quitting), r in results.items():
        ratio = r["rps"] / results[1, clients, quitting]["rps"]
        label = "on (64)" if max_batch > 1 else "off (1)"
        who = f"{clients} + {quitting} hanging up" if quitting else clients
        cells = [
            label,
            who,
            f"{r['rps']:.0f}",
            f"{r['p50']:.1f}",
            f"{r['p99']:.1f}",
            f"{r['p99'] / r['p50']:.1f}",
        ]
        cells += [r["errors"], f"{r['cpu']:.1f}"]
        print("| " + " | ".join(map(str, cells)) + f" | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
