"""Decoder embedders and Matryoshka dimensions, measured small (docs/models.md, "Measured").

    .venv/bin/python bench/decoders.py speed [--repeats 3] [--threads N]
    .venv/bin/python bench/decoders.py dimensions [--dims 384,192,96]

``speed``: a random Qwen3 of a small embedder's shape (4 layers, 256 wide, 4 heads of 64 and 2
key/value heads, 1024 in the feed-forward; the tests' tiny byte-level BPE tokenizer, which appends
``<|endoftext|>`` and pads on the left) saved by the installed sentence-transformers with
last-token pooling and a query instruction, as Qwen3-Embedding is. semsearch's torch and ONNX
paths and sentence-transformers' ``encode_query`` embed the same texts (the demo FAQ's questions
and answers, 422), interleaved run by run in one process: each side's median texts/s and the ratio
to sentence-transformers. Speed does not depend on the weights.

``dimensions``: the bundled all-MiniLM-L6-v2 (not trained for Matryoshka) cut to each of
``--dims``, on StackFAQ dev (``../shared/data/stackfaq``: 719 entries' questions, 499 queries):
semsearch's product path (``build_index`` with ``Strategy(dimensions=N)``, then dense search) for
MRR@10 and Success@1, and the size of the vector file and of the whole index less the query
graph it holds (the model's size, whatever the dimensions).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
STACKFAQ = ROOT.parent / "shared" / "data" / "stackfaq"
SHAPE = {
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 1024,
    "max_position_embeddings": 512,
}
INSTRUCTION = "Instruct: Given a question, find the answer\nQuery: "


def texts() -> list[str]:
    with (ROOT / "data" / "demo_faq.csv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [r["question"] for r in rows] + [r["answer"] for r in rows]


def qwen3(root: Path) -> str:
    """The random Qwen3 at SHAPE, saved by sentence-transformers as Qwen3-Embedding is."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.normalize import Normalize
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling
    from transformers import AutoConfig, AutoModel

    from tests.helpers import decoder_tokenizer

    network = root / "network"
    decoder_tokenizer(network, "qwen")
    vocabulary = len(json.loads((network / "tokenizer.json").read_text())["model"]["vocab"])
    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen3", vocab_size=vocabulary, **SHAPE)
    AutoModel.from_config(config).save_pretrained(network)
    first = Transformer(str(network), max_seq_length=128)
    modules = [first, Pooling(SHAPE["hidden_size"], pooling_mode="lasttoken"), Normalize()]
    prompts = {"query": INSTRUCTION, "document": ""}
    SentenceTransformer(modules=modules, prompts=prompts, device="cpu").save(str(root / "st"))
    return str(root / "st")


def speed(repeats: int, threads: int) -> None:
    import torch
    from sentence_transformers import SentenceTransformer

    from indexer.embedding.strategy import Strategy
    from indexer.encoders.factory import encoder_for

    if threads:
        torch.set_num_threads(threads)
    sample = texts()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["SEMSEARCH_CACHE"] = str(Path(tmp) / "cache")
        folder = qwen3(Path(tmp))
        sides = {
            "semsearch torch": encoder_for(Strategy(model=folder, backend="torch")),
            "semsearch onnx": encoder_for(Strategy(model=folder)),
        }
        peer = SentenceTransformer(folder, device="cpu")
        run = {name: (lambda t, e=encoder: e.embed(t)) for name, encoder in sides.items()}
        run["sentence-transformers"] = lambda t: peer.encode_query(t, batch_size=32)
        for embed in run.values():  # warm: first passes, the graph's session
            embed(sample[:64])
        seconds: dict[str, list[float]] = {name: [] for name in run}
        for _ in range(repeats):  # interleaved: a busy moment costs every side alike
            for name, embed in run.items():
                started = time.perf_counter()
                embed(sample)
                seconds[name].append(time.perf_counter() - started)
        runtimes = {name: encoder.decision.runtime for name, encoder in sides.items()}
    peer_rate = len(sample) / statistics.median(seconds["sentence-transformers"])
    said = f"{len(sample)} texts as queries, median of {repeats}, {torch.get_num_threads()} torch threads"
    print(f"random Qwen3 {SHAPE}, {said}")
    print(f"{'side':<22} {'runtime':<8} {'texts/s':>8} {'vs s-t':>7}")
    for name, spent in seconds.items():
        rate = len(sample) / statistics.median(spent)
        print(f"{name:<22} {runtimes.get(name, 'torch'):<8} {rate:>8.0f} {rate / peer_rate:>6.2f}x")


def dimensions(dims: list[int]) -> None:
    from indexer.embedding.strategy import Strategy
    from indexer.store import open_index
    from indexer.writing.build import build_index
    from search.read.engine import SearchEngine
    from search.studies.evaluate import read_qrels, retrieval_metrics

    queries = [json.loads(line) for line in (STACKFAQ / "queries.jsonl").open(encoding="utf-8")]
    qrels = read_qrels(STACKFAQ / "qrels.tsv")
    print(f"StackFAQ dev: 719 entries (question), {len(queries)} queries; bundled all-MiniLM-L6-v2, dense")
    print(f"{'dims':>5} {'MRR@10':>7} {'S@1':>6} {'vectors bytes':>14} {'index bytes less graph':>23}")
    with tempfile.TemporaryDirectory() as tmp:
        for count in dims:
            index = Path(tmp) / f"d{count}"
            build_index(STACKFAQ / "corpus.jsonl", index, Strategy(dimensions=count), text_fields=["text"])
            hits = SearchEngine(index).search_many([q["text"] for q in queries], k=10, mode="dense")
            ranked = {q["id"]: [h.id for h in found] for q, found in zip(queries, hits, strict=True)}
            found = retrieval_metrics(ranked, qrels, 10)
            vectors = sum(f.stat().st_size for f in index.glob("v-*/vectors.faiss"))
            info = open_index(index, vectors=False).info()
            rest = info["size_bytes"] - info["graph_bytes"]  # the held query graph is the model's size
            print(f"{count:>5} {found['mrr@10']:>7.3f} {found['success@1']:>6.3f} {vectors:>14,} {rest:>23,}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("speed", "dimensions"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's own)")
    parser.add_argument("--dims", default="384,192,96")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.what == "speed":
        speed(args.repeats, args.threads)
    else:
        dimensions([int(d) for d in args.dims.split(",")])


if __name__ == "__main__":
    main()
