"""What an exported graph is and where it lies (``GraphSpec``), known without ONNX Runtime or torch:
the store records and holds an index's graph (``indexer.store.held``), the encoders export and run
it (``indexer.encoders.onnx_export``, ``indexer.encoders.onnx_graph``). See ``onnx_graph`` for the
cache's layout.
"""

from __future__ import annotations

import functools
import hashlib
import platform
from dataclasses import dataclass, replace
from pathlib import Path

from indexer.embedding.fingerprints import cache_root, model_fingerprint
from indexer.embedding.model_files import model_file, read_json
from indexer.embedding.models import config_shape, model_location
from indexer.embedding.strategy import BACKEND_PRECISION, Strategy

HELD_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
"""The model files that run a graph without the model (its sizes, its tokenizer and special tokens):
an index holds them beside its graph."""

EXPORT_RECIPE = 4
"""Bumped when ``indexer.encoders.onnx_export`` exports differently (2: eager attention, fused; int8 per
channel; 3: weights in a file of their own; 4: layer norms not fused with their residual add), so a
cache never serves a graph an older recipe made."""


INT8_RECIPE = 1
"""Bumped when the int8 rewrite changes (``indexer.encoders.int8_graph``; 1: an activation scale
per token, batched). Part of an int8 graph's key only, so fp32 graphs stay cached."""


@dataclass(frozen=True)
class Int8Format:
    """How an ``onnx-int8`` graph is quantised for one family of CPUs (part of the graph's key: a
    graph made for another family is exported again, never reused)."""

    name: str
    weight_max: int
    """Weights within +-weight_max: 127 (all of int8) where the CPU's int8 product cannot
    saturate, 63 (7 bits) where two products are added in 16 bits first."""


INT8_FORMATS = {
    "vnni": Int8Format("vnni", 127),  # vpdpbusd: u8 x s8 summed in 32 bits, nothing saturates
    # vpmaddubsw: pairs summed in 16 bits, which full-range weights can saturate (ONNX Runtime's
    # reduce_range): STS-B dev 86.59 with 7 bits against 86.45 with 8 (fp32 86.72), AVX2 EPYC
    "avx2": Int8Format("avx2", 63),
    "other": Int8Format("other", 127),  # ARM's dot products and the rest: 32-bit sums
}


PER_TOKEN = {"semsearch.activation_scales": "per-token"}
"""The metadata of an int8 graph whose activation scales are per token, so its vectors do not
depend on the batch (an int8 graph without it, an older export, runs one text a call)."""


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags as Linux lists them (none elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.cache
def int8_format() -> Int8Format:
    """The int8 format for this CPU: VNNI (AVX-512 or AVX) multiplies int8 in 32-bit sums; an x86
    CPU without it has AVX2's 16-bit pair sums; anything else (ARM) has 32-bit dot products."""
    return format_for(cpu_flags(), platform.machine())


def format_for(flags: frozenset[str], machine: str) -> Int8Format:
    """The int8 format for a CPU with these ``flags`` on this ``machine`` (``platform.machine()``)."""
    if flags & {"avx512_vnni", "avx_vnni"}:
        return INT8_FORMATS["vnni"]
    if machine.lower() in ("x86_64", "amd64", "i686", "i386") or "avx2" in flags:
        return INT8_FORMATS["avx2"]
    return INT8_FORMATS["other"]


def model_identity(location: str) -> str:
    """The fingerprint of a model directory (a local one, or a hub model's cached snapshot); a name
    that is on disk nowhere stays its name (exporting it fails later, with the loader's message)."""
    if Path(location).is_dir():
        return model_fingerprint(location)
    config = model_file(location, "config.json")
    return model_fingerprint(config.parent) if config is not None else location


@dataclass(frozen=True)
class GraphSpec:
    """What an exported graph is: a model, the hidden states it outputs, its pooler, its backend."""

    location: str
    layers: tuple[int, ...]
    pooler: bool
    backend: str  # "onnx" (fp32) or "onnx-int8"
    home: Path | None = None
    """The directory holding the graph and ``HELD_FILES`` (an index's version: then also its
    ``location``); None: the cache."""
    held_key: str | None = None
    """The graph's key as the index recorded it (nothing of the model is read to find it)."""
    int8: str | None = None
    """An ``onnx-int8`` graph's ``Int8Format`` name (the CPU family it is quantised for)."""

    def key(self) -> str:
        """The model's fingerprint (its config, tokenizer and weights, wherever it lies) with the
        outputs and the backend: a copied model reuses its graph, a model changed in place does not."""
        if self.held_key is not None:
            return self.held_key
        parts = (EXPORT_RECIPE, model_identity(self.location), self.layers, self.pooler, self.backend)
        if self.int8 is not None:
            parts += (INT8_RECIPE, self.int8)
        text = repr(parts)
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    @property
    def path(self) -> Path:
        return (self.home or cache_root() / "onnx") / f"{self.key()}.onnx"

    @property
    def weights(self) -> Path:
        """The graph's weights (external data the graph names by this file name)."""
        return self.path.with_name(self.path.name + ".data")

    @property
    def sums(self) -> Path:
        """Where the cache keeps the sizes and CRC-32 sums of the graph's two files, written by
        its export before they move in (``indexer.store.held.intact`` checks them)."""
        return self.path.with_suffix(".sums")

    @property
    def exported(self) -> bool:
        """Both files are in place (the exporter moves the weights in first, the graph last), in
        the cache with their sums (a graph without them is exported again)."""
        files = self.path.is_file() and self.weights.is_file()
        return files and (self.home is not None or self.sums.is_file())

    @property
    def failure(self) -> Path:
        """Where a failed export says why (so ``info`` can tell, and nobody retries each query)."""
        return self.path.with_suffix(".failed")

    def failed(self) -> str | None:
        try:
            return self.failure.read_text(encoding="utf-8").strip() or "export failed"
        except OSError:
            return None


def graph_spec(strategy: Strategy, num_layers: int | None = None) -> GraphSpec:
    """The exported graph that runs this (resolved) strategy's network: the hidden states it reads,
    on its precision (``onnx-int8``'s own graph; ``onnx`` for ``torch`` too: the same fp32 vectors).
    ``num_layers``: the model's, when known; else what its ``config.json`` says."""
    return _spec(strategy, model_location(strategy.model), num_layers)


def held_graph(strategy: Strategy, directory: Path, key: str) -> GraphSpec:
    """The graph an index holds in ``directory`` under ``key`` (the model's ``HELD_FILES`` beside
    it): found without the model, the cache or a fingerprint."""
    return replace(_spec(strategy, str(directory), None), home=directory, held_key=key)


def _spec(strategy: Strategy, location: str, num_layers: int | None) -> GraphSpec:
    if num_layers is None:
        num_layers = (config_shape(read_json(model_file(location, "config.json")) or {}) or (0, 0))[0]
    pooler = strategy.pooling == "pooler"
    layers = () if pooler else tuple(sorted({i % (num_layers + 1) for i in strategy.layers or (-1,)}))
    if BACKEND_PRECISION[strategy.backend] == "int8":
        return GraphSpec(location, layers, pooler, "onnx-int8", int8=int8_format().name)
    return GraphSpec(location, layers, pooler, "onnx")
