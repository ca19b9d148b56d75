"""Index a corpus on Ray from Python (what ``semsearch index CORPUS -o DIR --ray [ADDRESS]`` does),
then query it. Without an address, a local Ray runtime (this machine's CPUs, 127.0.0.1 only);
with one (``auto``, ``ray://HOST:10001``), that cluster, whose nodes have semsearch installed.

    pip install 'semsearch[ray]'
    .venv/bin/python examples/ray_shards.py [CORPUS] [--address ADDRESS] [--workers N] [-o ray-index]

Engines other than Ray: embed partitions with ``indexer.writing.shards.embed_shard`` and merge the shard
directories with ``semsearch merge`` (docs/scaling.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from indexer import build_index
from indexer.encoders.on_ray import LOCAL
from search import SearchEngine

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("corpus", nargs="?", default=str(ROOT / "data" / "demo_faq.csv"))
    parser.add_argument("--text-field", default="question,answer")
    parser.add_argument("--address", default=LOCAL)
    parser.add_argument("--workers", type=int)
    parser.add_argument("-o", "--output", default="ray-index")
    args = parser.parse_args()
    report = build_index(
        args.corpus,
        args.output,
        text_fields=args.text_field.split(","),
        ray=args.address,
        ray_workers=args.workers,
    )
    rejected = len(report.rejected)
    print(f"{report.entries} entries in {args.output} ({report.seconds:.1f}s), {rejected} rejected")
    for hit in SearchEngine(args.output).search("can I pay with apple pay", k=3):
        print(f"{hit.rank}  {hit.score:.3f}  {hit.id}  {hit.text[:70]}")


if __name__ == "__main__":
    main()
