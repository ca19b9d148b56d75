"""This CPU's fp32 (and int8) matrix-multiply peak against what the default encoder reaches, in one
run: how close the default runs to the roof of the machine it is on.

    .venv/bin/python bench/gemm_peak.py [--shared ../shared/data] [--repeats 5] [--threads N]

1. The peak: a MatMul of the projection shapes all-MiniLM-L6-v2 runs (tokens x 384 @ 384 x 1536,
   tokens x 1536 @ 1536 x 384, tokens x 384 @ 384 x 384), on ONNX Runtime (MLAS, what the default
   runs) and on torch (oneDNN/MKL), fp32 and ONNX Runtime's dynamic int8 (`MatMulInteger`), with
   as many threads as the encoder uses. GFLOP/s = 2 x multiply-adds / second, best of the repeats.
2. The default: `semsearch`'s bulk encoder (`Encoding.load()`, the ONNX graph, fp32; and
   `onnx-int8`) on the StackFAQ answers (long, ~93 tokens) and STS-B dev sentences (short): tokens/s
   and the GFLOP/s those tokens cost (projections: 21.2 MFLOP a token; attention: 4 x 384 x 6 x
   the text's length a token), as a share of the fp32 peak.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HIDDEN, INNER, LAYERS = 384, 1536, 6
PROJECTION_FLOP = 2 * LAYERS * (4 * HIDDEN * HIDDEN + 2 * HIDDEN * INNER)  # a token's projections
SHAPES = [(HIDDEN, INNER), (INNER, HIDDEN), (HIDDEN, HIDDEN)]


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def cpu_flags() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            wanted = ["avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile"]
            return " ".join(f for f in wanted if f in flags)
    return ""


def best(run, repeats: int) -> float:
    """Fastest of ``repeats`` timings of ``run()`` (seconds), after one unmeasured call."""
    run()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def ort_matmul(rows: int, k: int, n: int, threads: int, int8: bool, repeats: int) -> float:
    """GFLOP/s of one ONNX Runtime MatMul (or dynamic int8 MatMul) of rows x k @ k x n."""
    import onnx
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, n])],
        [numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "matmul.onnx"
        onnx.save(model, path)
        if int8:
            from onnxruntime.quantization import QuantType, quantize_dynamic

            quantized = Path(tmp) / "matmul-int8.onnx"
            quantize_dynamic(str(path), str(quantized), weight_type=QuantType.QInt8, per_channel=True)
            path = quantized
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    x = rng.standard_normal((rows, k)).astype(np.float32)
    seconds = best(lambda: session.run(None, {"x": x}), repeats)
    return 2 * rows * k * n / seconds / 1e9


def torch_matmul(rows: int, k: int, n: int, threads: int, repeats: int) -> float:
    import torch

    torch.set_num_threads(threads)
    x = torch.randn(rows, k)
    w = torch.randn(k, n)
    with torch.inference_mode():
        seconds = best(lambda: torch.mm(x, w), repeats)
    return 2 * rows * k * n / seconds / 1e9


def weighted(rate: Callable[[int, int], float]) -> float:
    """GFLOP/s over the model's three projection shapes, ``rate(k, n)`` each: their FLOP-weighted
    mean (each layer runs 384x1536 (up) once, 1536x384 (down) once, 384x384 four times)."""
    flops = [2 * k * n * w for (k, n), w in zip(SHAPES, [1, 1, 4], strict=True)]
    rates = [rate(k, n) for k, n in SHAPES]
    return sum(flops) / sum(f / r for f, r in zip(flops, rates, strict=True))


def peaks(rows: int, threads: int, repeats: int) -> dict[str, float]:
    """GFLOP/s of each kernel over the model's projection shapes at ``rows`` tokens."""
    return {
        "onnxruntime fp32": weighted(lambda k, n: ort_matmul(rows, k, n, threads, False, repeats)),
        "onnxruntime int8": weighted(lambda k, n: ort_matmul(rows, k, n, threads, True, repeats)),
        "torch fp32": weighted(lambda k, n: torch_matmul(rows, k, n, threads, repeats)),
    }


def token_flop(length: float) -> float:
    """FLOP a token costs in a text of ``length`` tokens: projections plus attention products."""
    return PROJECTION_FLOP + 4 * HIDDEN * LAYERS * length


def text_sets(shared: Path) -> dict[str, list[str]]:
    with (shared / "stackfaq" / "corpus.jsonl").open(encoding="utf-8") as f:
        answers = [json.loads(line)["answer"] for line in f]
    with (shared / "stsb" / "stsb-dev.tsv").open(encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    short = list(dict.fromkeys([r[1] for r in rows] + [r[2] for r in rows]))[:2000]
    return {"long (StackFAQ answers)": answers, "short (STS-B dev)": short}


def encoder_rate(backend: str, texts: list[str], repeats: int) -> tuple[float, float]:
    """(tokens/s, mean tokens a text) of the bulk encoder of ``backend`` on ``texts`` as passages."""
    from indexer.embedding.strategy import Strategy
    from search.read.encoding import Encoding

    encoding = Encoding.load(Strategy(backend=backend))
    tokens = sum(map(len, encoding.tokenize(texts, "passage")))
    seconds = best(lambda: encoding.embedder.embed(texts, role="passage"), max(1, repeats // 2))
    return tokens / seconds, tokens / len(texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rows", type=int, default=2048, help="tokens in the peak's MatMul")
    args = parser.parse_args()
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores, flags: {cpu_flags()}")
    print(f"threads: {args.threads}; MatMul of {args.rows} tokens; best of {args.repeats}\n")
    found = peaks(args.rows, args.threads, args.repeats)
    print("| kernel | GFLOP/s (projection shapes) |\n|---|---|")
    for name, rate in found.items():
        print(f"| {name} | {rate:.0f} |")
    roof = found["onnxruntime fp32"]
    print("\n| encoder | texts | tokens/text | tokens/s | GFLOP/s | share of ORT fp32 peak |")
    print("|---|---|---|---|---|---|")
    for label, texts in text_sets(args.shared).items():
        for backend in ("onnx", "onnx-int8", "torch"):
            rate, length = encoder_rate(backend, texts, args.repeats)
            gflops = rate * token_flop(length) / 1e9
            print(
                f"| {backend} | {label} | {length:.1f} | {rate:,.0f} | {gflops:.0f} | "
                f"{gflops / roof:.0%} |"
            )
    print(f"\nfp32 roof for this model: {roof * 1e9 / PROJECTION_FLOP:,.0f} tokens/s (projections alone)")


if __name__ == "__main__":
    main()
