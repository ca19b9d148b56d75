"""Where `semsearch serve` spends its CPU before the first answer: each step of its start run one
after the other in this process (imports by package, engine load, routes, uvicorn, first request),
as CPU milliseconds (process time: all threads, far less at the mercy of a shared machine's load
than wall time). `serve` itself overlaps the engine load with the web imports (a thread);
docs/profile-serve.md has the tables.

    .venv/bin/python bench/profile_serve.py INDEX_DIR [--port 8799]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.request
from concurrent.futures import Future

QUESTION = "how much does a day pass cost"


class Steps:
    """CPU milliseconds of each step since the one before (the first: since the process began)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, float]] = []
        self.last = 0.0

    def done(self, label: str) -> None:
        now = time.process_time()
        self.rows.append((label, 1000 * (now - self.last)))
        self.last = now


def main() -> None:
    steps = Steps()
    import click  # noqa: F401

    import search.cli  # noqa: F401

    steps.done("interpreter start, click + search.cli (what every command pays)")
    import numpy  # noqa: F401

    steps.done("numpy")
    import faiss  # noqa: F401

    steps.done("faiss")
    import onnxruntime  # noqa: F401

    steps.done("onnxruntime")
    import tokenizers  # noqa: F401

    steps.done("tokenizers")
    from search.read.engine import SearchEngine

    steps.done("search.read.engine (semsearch's modules, the rest)")
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("index_dir")
    parser.add_argument("--port", type=int, default=8799)
    args = parser.parse_args()
    engine = SearchEngine(args.index_dir)
    steps.done("SearchEngine: open the index, tokenizer, ONNX Runtime session")
    import pydantic  # noqa: F401

    steps.done("pydantic")
    import anyio  # noqa: F401
    import starlette.applications  # noqa: F401

    steps.done("starlette + anyio")
    import fastapi  # noqa: F401

    steps.done("fastapi")
    import uvicorn

    steps.done("uvicorn")
    from search.server import create_app

    steps.done("search.server (fastapi_offline, semsearch's module)")
    loaded: Future = Future()
    loaded.set_result(engine)
    app = create_app(args.index_dir, loading=loaded)
    steps.done("create_app (routes: FastAPI builds each one's validation)")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning"))

    def ask() -> None:
        while not server.started:
            time.sleep(0.001)
        steps.done("uvicorn start (config, event loop, lifespan, bind)")
        body = json.dumps({"query": QUESTION, "k": 3}).encode()
        for label in ("first POST /search (this process's client included)", "second POST /search"):
            request = urllib.request.Request(
                f"http://127.0.0.1:{args.port}/search", body, {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=60) as response:
                assert json.load(response)["hits"]
            steps.done(label)
        server.should_exit = True

    threading.Thread(target=ask).start()
    server.run()
    print("| step | CPU ms |\n|---|---|")
    for label, ms in steps.rows:
        print(f"| {label} | {ms:.0f} |")
    first = sum(ms for label, ms in steps.rows if label != "second POST /search")
    print(f"| **to the first answer** | **{first:.0f}** |")


if __name__ == "__main__":
    main()
