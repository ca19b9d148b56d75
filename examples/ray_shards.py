"""Embed a corpus on Ray (local here; a cluster address works the same), one shard per task, then
merge the shards into one semsearch index and query it.

    pip install ray            # not a semsearch dependency: any engine that runs Python will do
    .venv/bin/python examples/ray_shards.py [CORPUS] [--shards 4] [-o ray-index]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import ray

from indexer.corpus import read_corpus
from indexer.shards import embed_shard, merge_shards
from indexer.strategy import Strategy
from search import SearchEngine

ROOT = Path(__file__).resolve().parents[1]


@ray.remote
def embed(entries: list, out_dir: str, strategy: Strategy) -> str:
    return str(embed_shard(entries, out_dir, strategy))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("corpus", nargs="?", default=str(ROOT / "data" / "demo_faq.csv"))
    parser.add_argument("--text-field", default="question,answer")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("-o", "--output", default="ray-index")
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    corpus = read_corpus(args.corpus, text_fields=args.text_field.split(","))
    strategy = Strategy()  # every worker embeds with the same stored strategy
    with tempfile.TemporaryDirectory() as tmp:
        parts = [corpus.entries[i :: args.shards] for i in range(args.shards)]
        shards = ray.get([embed.remote(part, f"{tmp}/shard-{i}", strategy) for i, part in enumerate(parts)])
        count = merge_shards(shards, args.output)
    print(f"merged {len(shards)} shards: {count} entries in {args.output}")
    for hit in SearchEngine(args.output).search("can I pay with apple pay", k=3):
        print(f"{hit.rank}  {hit.score:.3f}  {hit.id}  {hit.text[:70]}")


if __name__ == "__main__":
    main()
