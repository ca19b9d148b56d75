"""An exported network on ONNX Runtime, found (``indexer.embedding.graphs``: where a graph lies,
what it outputs) and run without torch.

``indexer.encoders.onnx_export`` exports a model once (it needs torch) into the cache this module
names; ``indexer.encoders.onnx_encoder`` runs the graph, for indexing on the ``onnx`` backends and
for every index's queries, so answering a question never imports torch.

A graph is cached under ``$SEMSEARCH_CACHE/onnx`` (default ``~/.cache/semsearch``), keyed by the
model's fingerprint (``indexer.embedding.models.model_fingerprint``: its files' bytes, not where they lie),
the hidden states it outputs and the backend. Its weights lie beside it in ``<key>.onnx.data``
(ONNX external data): ONNX Runtime maps that file instead of parsing and copying 90 MB out of the
graph's protobuf, which was most of a server's session start-up (docs/profile-serve.md).
An export that failed leaves a ``.failed`` note with the reason beside where the graph would be;
one that completed, ``<key>.sums`` (its files' sizes and CRC-32 sums), checked before the cached
graph is loaded or held (``indexer.store.held.intact``).

An index holds the graph of its queries itself (``indexer.store.held``): the two files, hard links
of the cached ones where the file system allows, and copies of the model's ``HELD_FILES`` in each
version directory, so a copied index answers on a machine with an empty cache and no torch
(``held_graph``). What a graph is (``GraphSpec``) lives a floor down, where the store reads it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from indexer.embedding.graphs import PER_TOKEN, GraphSpec
from indexer.embedding.head import NetworkOutput
from indexer.embedding.strategy import BACKEND_PRECISION
from indexer.errors import BadInput
from indexer.store.held import intact

CPU = "CPUExecutionProvider"
"""The execution provider ONNX Runtime runs a graph on unless the caller names another."""

UNFUSED = ("SkipLayerNormFusion",)
"""ONNX Runtime's graph optimisations left off: the residual ``Add`` and ``LayerNormalization``
the exporter leaves apart stay apart (ONNX Runtime's fused CPU kernel for them is a scalar loop,
3x slower; ``indexer.encoders.onnx_export``), on the CPU provider alone; another provider fuses them
as its authors meant. A graph exported with the fusion runs as it is."""
CACHED = "its graph is cached"
EXPORTED = "its graph was exported now (cached for the next time)"


def cannot_export(failure: str) -> str:
    """Why a network runs on torch: its graph cannot be had (``failure``: the exporter's line)."""
    return f"its graph cannot be exported ({failure})"


def graph_step(spec: GraphSpec | None, *, retry: bool) -> tuple[str, str | None]:
    """The one ladder of every exported network, a sentence encoder's or a reranker's (its task
    is in ``spec``): ``("cached", None)`` where the cache holds it intact (checked against its
    export's sums); ``("failed", reason)`` where an export failed before (noted beside it: the
    network runs on torch, and nobody retries; ``retry``: a build tries again); else
    ``("export", None)``. ``spec`` None: not known without loading the model (exported then)."""
    if spec is not None and intact(spec):
        return "cached", None
    failure = spec.failed() if spec is not None and not retry else None
    return ("failed", failure) if failure is not None else ("export", None)


def session(path: Path, *, provider: str = CPU, spin: bool = False, threads: int = 0) -> Any:
    """The one ONNX Runtime session set-up of every graph: all optimisations but ``UNFUSED`` (on
    the CPU), quiet, ``threads`` intra-op threads (0: ONNX Runtime's choice), and ``provider``
    with the CPU's for what it does not run; a provider this build lacks is one clear line."""
    import onnxruntime

    available = onnxruntime.get_available_providers()
    if provider not in available:
        raise BadInput(
            f"ONNX Runtime has no execution provider {provider!r} here (it has {', '.join(available)})"
        )
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    # no spin-wait after a run when serving: idle threads spinning steal the cores the next
    # request needs (the server's event loop and FAISS; the same lesson as FAISS's OpenMP threads)
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    # a batch job's threads spin between a run's operators, but not once the run returns: the
    # Python between passes and the build's other stages (reading, tokenising, writing) need the
    # cores then (a nearly free model's build of 100,000 texts: 1.3 CPU s less, docs/performance.md)
    options.add_session_config_entry("session.force_spinning_stop", "1")
    options.intra_op_num_threads = threads
    providers = [provider] if provider == CPU else [provider, CPU]
    unfused = list(UNFUSED) if provider == CPU else []  # a GPU's fused kernel is its fast one
    return onnxruntime.InferenceSession(str(path), options, providers=providers, disabled_optimizers=unfused)


class OnnxGraph:
    """A ``Network`` on ONNX Runtime: ``hidden_states[i]`` for the exported layers and the pooler
    output, on ``threads`` threads (``usable_cores``, or ``side_by_side``'s share; 0 leaves it to
    ONNX Runtime, which pins one to every core of the machine). ``spin`` keeps idle threads spinning
    between operators, which a batch job wants and a server does not. ``provider``: the execution
    provider (ONNX Runtime's name, e.g. ``CUDAExecutionProvider``), with the CPU one for what it
    does not run.

    An int8 graph quantises its activations with a scale per token (``indexer.encoders.int8_graph``)
    and runs batches as fp32 does. One exported before that (no ``graphs.PER_TOKEN`` metadata: an older
    index's held graph) took one scale over its whole input tensor, padding included, so it runs
    each text alone, unpadded (its outputs padded back with zeros, which pooling masks): the vectors
    its index holds were made so."""

    def __init__(self, spec: GraphSpec, *, spin: bool = False, provider: str = CPU, threads: int = 0):
        self.layers = sorted(set(spec.layers))
        self.pooler = spec.pooler
        self.session = session(spec.path, provider=provider, spin=spin, threads=threads)
        # a graph reading only the embedding output (layer 0) has no attention_mask input
        self.inputs = {i.name for i in self.session.get_inputs()}
        metadata = self.session.get_modelmeta().custom_metadata_map
        per_token = PER_TOKEN.items() <= metadata.items()
        self.per_text = BACKEND_PRECISION[spec.backend] == "int8" and not per_token

    def run(self, input_ids: np.ndarray, attention: np.ndarray) -> list[np.ndarray]:
        feed = {"input_ids": input_ids, "attention_mask": attention}
        return self.session.run(None, {k: v for k, v in feed.items() if k in self.inputs})

    def __call__(self, input_ids: np.ndarray, attention: np.ndarray) -> NetworkOutput:
        if self.per_text:
            rows = [
                self.run(input_ids[r : r + 1, :n], attention[r : r + 1, :n])
                for r, n in enumerate(attention.sum(axis=1))
            ]
            outputs = [_stack([row[k] for row in rows], input_ids.shape[1]) for k in range(len(rows[0]))]
        else:
            outputs = self.run(input_ids, attention)
        states = dict(zip(self.layers, outputs, strict=False))
        return NetworkOutput(states, outputs[-1] if self.pooler else None)


def usable_cores() -> int:
    """The cores this process may run on (``taskset``, a container's cpuset), not the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


ENCODE, RERANK = "encode", "rerank"
"""What a CPU job runs graphs side by side for (``side_by_side``): a bulk encode's batches of
texts, or one reranker call's passes of pairs."""


def side_by_side(task: str, cores: int | None = None) -> tuple[int, int]:
    """How many runs of a graph a CPU job of ``task`` keeps going at once and the threads of each,
    on ``cores`` (None: ``usable_cores``). One rule, read two ways: one run on every core up to 7
    cores, then one run of 4 threads per 4 cores (ONNX Runtime parallelises inside each operator,
    and a batch of 32 short texts is too small to spread over 16 cores). A bulk encode (``ENCODE``)
    runs it as it reads (two one-thread sessions are no faster on 2 cores); a reranker's passes
    (``RERANK``) run its transpose: a one-thread pass per core up to 7, then four passes of a
    quarter of the cores each, since on shared cores a run's operators wait on the slowest of its
    threads at every step (measured on 2 cores: docs/rerank.md). The thread count is always given:
    left to itself ONNX Runtime pins a thread to every core of the machine, whatever cores the
    process was given."""
    if task not in (ENCODE, RERANK):
        raise ValueError(f"side_by_side runs {ENCODE!r} or {RERANK!r}, not {task!r}")
    cores = cores or usable_cores()
    runs, threads = (1, cores) if cores < 8 else (cores // 4, 4)
    return (threads, runs) if task == RERANK else (runs, threads)


def _stack(rows: Sequence[np.ndarray], width: int) -> np.ndarray:
    """One-row outputs as one batch: token outputs right-padded with zeros to ``width``."""
    if rows[0].ndim == 2:  # the pooler output, one vector per text
        return np.concatenate(rows)
    out = np.zeros((len(rows), width, rows[0].shape[-1]), dtype=rows[0].dtype)
    for r, row in enumerate(rows):
        out[r, : row.shape[1]] = row[0]
    return out
