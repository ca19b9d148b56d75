"""Where the default encoder's time goes on this CPU: ONNX Runtime's own profile
(``SessionOptions.enable_profiling``) of the session the bulk encoder builds, summed per operator
type, beside what the process does around the runs (tokenising, padding, pooling, normalising),
and its share of this CPU's MatMul peak at the backend's precision (``bench/gemm_peak.py``: fp32, or
ONNX Runtime's dynamic int8 product for ``onnx-int8``), measured in the same run.

    .venv/bin/python bench/onnx_profile.py [--shared ../shared/data] [--backend onnx] [--repeats 3]
        [--against GRAPH.onnx] [--limit N] [--no-peak]

For each text set (the StackFAQ answers, long; STS-B dev sentences, short) it embeds the texts as
passages once unmeasured (those runs are left out of the profile), then ``--repeats`` times
measured. ``--against``: a graph file of the same model and outputs (an earlier export recipe's,
e.g. from an older cache) run the same way in the same process, as ONNX Runtime optimises it by
default (none of ``onnx_graph.UNFUSED`` left off), the two encoders taking turns.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gemm_peak import cpu_flags, cpu_name, ort_matmul, text_sets, token_flop, weighted  # noqa: E402


class Timed:
    """A network, with the wall seconds spent in its calls counted."""

    def __init__(self, network) -> None:  # noqa: ANN001 - an OnnxGraph
        self.network, self.seconds, self.calls = network, 0.0, 0

    def __call__(self, input_ids: np.ndarray, attention: np.ndarray):  # noqa: ANN204
        started = time.perf_counter()
        try:
            return self.network(input_ids, attention)
        finally:
            self.seconds += time.perf_counter() - started
            self.calls += 1


@dataclass
class Profiled:
    """One encoder under measurement and what was measured of it."""

    label: str
    encoder: object
    timed: Timed
    wall: float = 0.0
    tokenising: float = 0.0
    warm_calls: int = 0
    per_op: dict[str, float] = field(default_factory=dict)
    in_run: float = 0.0


@contextmanager
def profiling(folder: Path):
    """Every ONNX Runtime session made inside profiles itself into ``folder``."""
    import onnxruntime

    plain = onnxruntime.InferenceSession

    def session(path, options=None, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        options = options or onnxruntime.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = str(folder / "ort")
        return plain(path, options, *args, **kwargs)

    onnxruntime.InferenceSession = session
    try:
        yield
    finally:
        onnxruntime.InferenceSession = plain


def encoders(backend: str, against: Path | None, folder: Path) -> list[Profiled]:
    """The bulk encoder of ``backend`` as the factory builds it, and the same encoder running the
    graph ``against`` where one is given."""
    from indexer.embedding.graphs import graph_spec
    from indexer.embedding.strategy import Strategy
    from indexer.encoders import onnx_graph
    from indexer.encoders.factory import encoder_for

    found = []
    with profiling(folder):
        encoder = encoder_for(Strategy(backend=backend))
        found.append(Profiled(f"{backend} (default)", encoder, Timed(encoder.network)))
        if against is not None:
            other = encoder_for(Strategy(backend=backend))
            spec = replace(graph_spec(other.strategy), home=against.parent, held_key=against.stem)
            threads = other.network.session.get_session_options().intra_op_num_threads
            unfused, onnx_graph.UNFUSED = onnx_graph.UNFUSED, ()
            try:
                graph = onnx_graph.OnnxGraph(spec, spin=True, threads=threads)
            finally:
                onnx_graph.UNFUSED = unfused
            label = f"{backend} ({against.name}, fused as ONNX Runtime does)"
            found.append(Profiled(label, other, Timed(graph)))
    for each in found:
        each.encoder.network = each.timed
    return found


def kernel_times(trace: Path, skip_runs: int) -> tuple[dict[str, float], float]:
    """Microseconds per operator type and in ``model_run``, the first ``skip_runs`` runs left out."""
    events = json.loads(trace.read_text())
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    start = runs[skip_runs]["ts"] if len(runs) > skip_runs else float("inf")
    per_op: dict[str, float] = collections.defaultdict(float)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= start:
            per_op[e["args"]["op_name"]] += e["dur"]
    return dict(per_op), float(sum(e["dur"] for e in runs[skip_runs:]))


def describe(each: Profiled) -> str:
    import onnx

    session = each.timed.network.session
    graph = onnx.load(session._model_path, load_external_data=False)  # noqa: SLF001
    counts = collections.Counter(n.op_type for n in graph.graph.node if n.op_type not in SHAPE_OPS)
    options = session.get_session_options()
    return (
        f"{each.label}: operators {dict(counts)}; intra_op threads {options.intra_op_num_threads}, "
        f"optimisation {options.graph_optimization_level.name}, spinning "
        f"{options.get_session_config_entry('session.intra_op.allow_spinning')}, "
        f"sessions {len(each.encoder.sessions)}"
    )


SHAPE_OPS = {"Shape", "Gather", "Unsqueeze", "Slice", "Equal", "Where", "Concat", "Expand", "GatherElements"}
"""The position-id arithmetic before the embeddings: listed apart, a few microseconds a pass."""


def passes(encoder, ids: list[list[int]]) -> str:  # noqa: ANN001
    plan = encoder.decision.batching.plan([len(i) for i in ids])
    rows = [len(b) for b in plan]
    widths = [max(len(ids[i]) for i in b) for b in plan]
    padded = sum(r * w for r, w in zip(rows, widths, strict=True))
    real = sum(len(i) for i in ids)
    return (
        f"{encoder.decision.batching.describe()}: {len(plan)} passes, rows {min(rows)}-{max(rows)}, "
        f"width {min(widths)}-{max(widths)}, {padded / len(plan):.0f} padded tokens a pass, "
        f"padding {1 - real / padded:.1%}"
    )


def measure(found: list[Profiled], texts: list[str], repeats: int) -> int:
    """Each encoder's runs, taking turns; returns the texts' token count."""
    for each in found:
        each.wall = each.tokenising = each.timed.seconds = 0.0
        each.encoder.embed(texts, role="passage")  # warm: its runs are left out of the profile
        each.warm_calls, each.timed.seconds = each.timed.calls, 0.0
    for _ in range(repeats):
        for each in found:
            started = time.perf_counter()
            each.encoder.tokens.ids(texts, "passage")
            tokenised = time.perf_counter()
            each.encoder.embed(texts, role="passage")
            each.tokenising += tokenised - started
            each.wall += time.perf_counter() - tokenised  # embed tokenises too: counted once, apart
    for each in found:
        trace = Path(each.timed.network.session.end_profiling())
        skip = len(texts) if each.timed.network.per_text else each.warm_calls  # int8: a run a text
        each.per_op, each.in_run = kernel_times(trace, skip)
    return sum(map(len, found[0].encoder.tokens.ids(texts, "passage")))


def report(
    found: list[Profiled], tokens: int, count: int, repeats: int, peak: float | None, precision: str
) -> None:
    length = tokens / count
    for each in found:
        total = each.wall  # the embed calls, which tokenise once too
        kernels = sum(each.per_op.values()) / 1e6
        rate = repeats * tokens / total
        gflops = rate * token_flop(length) / 1e9
        share = f", {gflops / peak:.0%} of the {precision} MatMul peak" if peak else ""
        outside = each.wall - each.timed.seconds - each.tokenising
        print(
            f"- {each.label}: **{rate:,.0f} tokens/s**, {gflops:.0f} GFLOP/s{share}; of the wall time: "
            f"kernels {kernels / total:.1%}, ONNX Runtime outside kernels "
            f"{(each.in_run / 1e6 - kernels) / total:.1%}, the network call outside run "
            f"{(each.timed.seconds - each.in_run / 1e6) / total:.1%}, tokenising "
            f"{each.tokenising / total:.1%}, padding/pooling/normalising {outside / total:.1%}"
        )
    ops = sorted({op for each in found for op in each.per_op}, key=lambda op: -found[0].per_op.get(op, 0))
    print("\n| operator | " + " | ".join(f"{each.label} ms | share" for each in found) + " |")
    print("|---|" + "---|---|" * len(found))
    rows = {"position ids (shape arithmetic)": [sum(e.per_op.get(op, 0) for op in SHAPE_OPS) for e in found]}
    rows.update({op: [e.per_op.get(op, 0) for e in found] for op in ops if op not in SHAPE_OPS})
    for op, values in rows.items():
        cells = [
            f"{us / 1000 / repeats:,.1f} | {us / sum(e.per_op.values()):.1%}"
            for us, e in zip(values, found, strict=True)
        ]
        print(f"| {op} | " + " | ".join(cells) + " |")
    sums = [f"{sum(e.per_op.values()) / 1000 / repeats:,.1f} | 100%" for e in found]
    print("| **kernel total** (ms a repeat) | " + " | ".join(sums) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--backend", default="onnx")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--limit", type=int, default=None, help="first N texts of each set")
    parser.add_argument("--against", type=Path, default=None, help="another graph file to compare")
    parser.add_argument("--no-peak", action="store_true", help="skip measuring the MatMul peak")
    args = parser.parse_args()
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores, flags: {cpu_flags()}")
    from indexer.embedding.strategy import BACKEND_PRECISION

    peak, precision = None, BACKEND_PRECISION[args.backend]
    with tempfile.TemporaryDirectory() as tmp:
        for number, (label, texts) in enumerate(text_sets(args.shared).items()):
            texts = texts[: args.limit]
            folder = Path(tmp) / str(number)  # each set its own sessions and profile files
            folder.mkdir()
            found = encoders(args.backend, args.against, folder)
            if number == 0:
                for each in found:
                    print(describe(each))
                if not args.no_peak:
                    threads = found[0].timed.network.session.get_session_options().intra_op_num_threads
                    int8 = precision == "int8"
                    peak = weighted(lambda k, n: ort_matmul(2048, k, n, threads, int8, 5))  # noqa: B023
                    print(f"ONNX Runtime {precision} MatMul peak (projection shapes): {peak:.0f} GFLOP/s")
            tokens = measure(found, texts, args.repeats)
            ids = found[0].encoder.tokens.ids(texts, "passage")
            print(f"\n### {label}: {len(texts)} texts, {tokens / len(texts):.1f} tokens a text")
            print(passes(found[0].encoder, ids))
            report(found, tokens, len(texts), args.repeats, peak, precision)


if __name__ == "__main__":
    main()
