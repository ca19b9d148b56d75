"""Exporting a network to ONNX (needs torch): the same network, exported once with exactly the
hidden states the strategy reads, optionally int8-quantised. ``indexer.encoders.onnx_graph`` runs it.

``onnx`` matches torch fp32 (same vectors to float error); both graphs have attention exported
eagerly so ONNX Runtime fuses it. ``onnx-int8`` is that graph rewritten by
``indexer.encoders.int8_graph``: weights int8 per output channel, activations quantised with a
scale per token as they run (so the vectors never depend on the batch), in the format of the CPU
it is exported on (``indexer.embedding.graphs.int8_format``). ``bench/embed.py`` measures speed
and quality; static quantisation (fixed activation scales) was measured and lost too much (STS-B
dev 85.87 vs 86.72).

Every index gets the fp32 graph of its strategy when it is built (``export_for_queries``), so its
queries run on ONNX Runtime alone; exports are cached (``indexer.encoders.onnx_graph.GraphSpec``) and written
atomically: the weights file first, then the graph that names it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from indexer.embedding.graphs import INT8_FORMATS, GraphSpec, int8_format
from indexer.embedding.strategy import BACKEND_PRECISION
from indexer.encoders.bidirectional import bidirectional_masks
from indexer.errors import BadInput
from indexer.store.held import intact, write_sums


class _Outputs(torch.nn.Module):
    """The network with the chosen hidden states (and the pooler output) as plain outputs."""

    def __init__(self, network: torch.nn.Module, layers: Sequence[int], pooler: bool):
        super().__init__()
        self.network, self.layers, self.pooler = network, list(layers), pooler

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # a decoder's graph keeps no KV cache: an embedder reads each text once
        cache = {"use_cache": False} if hasattr(self.network.config, "use_cache") else {}
        masks = bidirectional_masks(self.network.config, input_ids, attention_mask)  # EmbeddingGemma's
        out = self.network(
            input_ids=input_ids,
            attention_mask=attention_mask if masks is None else masks,
            output_hidden_states=True,
            **cache,
        )
        states = tuple(out.hidden_states[i] for i in self.layers)
        return (*states, out.pooler_output) if self.pooler else states


@contextlib.contextmanager
def _eager_attention(network: torch.nn.Module) -> Iterator[None]:
    """Export attention as plain MatMul/Softmax: ONNX Runtime's optimizer fuses that pattern into
    one ``Attention`` op (and the embeddings into ``EmbedLayerNormalization``); the SDPA pattern
    transformers uses by default is left unfused, with a ``Where``/``IsNaN`` mask per layer."""
    previous = getattr(network.config, "_attn_implementation", None)
    switch = getattr(network, "set_attn_implementation", None)
    if switch is None or previous in (None, "eager"):
        yield
        return
    switch("eager")
    try:
        yield
    finally:
        switch(previous)


def _fusions():  # noqa: ANN202 - onnxruntime.transformers' FusionOptions, imported lazily
    """ONNX Runtime's BERT fusions (``Attention``, ``EmbedLayerNormalization``, ``BiasGelu``) less
    ``SkipLayerNormalization``: its CPU kernel is a scalar loop that took 3x the time of the
    ``Add`` + ``LayerNormalization`` it replaces (13% of a pass on an AVX-512 CPU, where the
    matrix products are fast; docs/profile-embed.md). ``indexer.encoders.onnx_graph`` keeps ONNX
    Runtime from fusing them again when it loads the graph."""
    from onnxruntime.transformers.fusion_options import FusionOptions

    options = FusionOptions("bert")
    options.enable_skip_layer_norm = False
    options.enable_bias_skip_layer_norm = False
    return options


def _export(network: torch.nn.Module, spec: GraphSpec) -> None:
    config, layers, pooler = network.config, spec.layers, spec.pooler
    names = [f"h{i}" for i in layers] + (["pooler"] if pooler else [])
    ids = torch.tensor([[101, 7592, 2088, 102], [101, 7592, 102, 0]]) % config.vocab_size  # any vocabulary
    axes = {"input_ids": {0: "batch", 1: "tokens"}, "attention_mask": {0: "batch", 1: "tokens"}}
    axes.update({n: {0: "batch", 1: "tokens"} for n in names if n != "pooler"})
    export_into(
        network,
        _Outputs(network, layers, pooler).eval(),
        (ids, (ids > 0).long()),
        (["input_ids", "attention_mask"], names),
        axes,
        spec,
        int8_rewrite(spec.int8) if BACKEND_PRECISION[spec.backend] == "int8" else None,
    )


def int8_rewrite(name: str | None) -> Callable[[Any], Any]:
    """The one rewrite of every int8 graph (a sentence encoder's ``onnx-int8``, a reranker's int8
    classifier): ``indexer.encoders.int8_graph``'s per-token int8 in the ``Int8Format`` ``name``
    (a graph's ``GraphSpec.int8``; None: this CPU's)."""
    from indexer.encoders.int8_graph import per_token_int8

    weight_max = INT8_FORMATS[name or int8_format().name].weight_max
    return functools.partial(per_token_int8, weight_max=weight_max)


def export_into(
    network: torch.nn.Module,
    module: torch.nn.Module,
    sample: tuple[torch.Tensor, ...],
    names: tuple[list[str], list[str]],
    axes: dict[str, dict[int, str]],
    spec: GraphSpec,
    rewrite: Callable[[Any], Any] | None = None,
) -> None:
    """``module`` (the outputs wanted of ``network``) traced with attention eager, given ONNX
    Runtime's transformer fusions (one ``Attention`` op per layer), rewritten by ``rewrite`` when
    given (int8), and moved into ``spec``'s place with its weights apart: the one export path of
    every graph (sentence vectors and rerankers' logits). ``names``: the inputs and the outputs."""
    try:
        import onnx
        from onnxruntime.transformers import optimizer
    except ImportError:
        raise BadInput("exporting to ONNX needs onnx and onnxruntime: reinstall semsearch") from None
    import warnings

    with _staging(spec) as tmp, warnings.catch_warnings(), _eager_attention(network):
        warnings.simplefilter("ignore")
        plain, fused = Path(tmp) / "plain.onnx", Path(tmp) / "fused.onnx"
        torch.onnx.export(
            module,
            sample,
            str(plain),
            input_names=names[0],
            output_names=names[1],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )
        config = network.config
        model = optimizer.optimize_model(
            str(plain),
            model_type="bert",
            num_heads=config.num_attention_heads,
            hidden_size=config.hidden_size,
            opt_level=1,
            optimization_options=_fusions(),
        )
        model.save_model_to_file(str(fused))
        if rewrite is not None:
            onnx.save_model(rewrite(onnx.load(str(fused))), str(fused))
        _save_with_weights_apart(fused, spec)


def rewrite_graph(source: GraphSpec, spec: GraphSpec, rewrite: Callable[[Any], Any]) -> Path:
    """``spec``'s graph made from ``source``'s exported one by ``rewrite`` (a reranker's int8
    classifier from its fp32 graph: ONNX alone, no network loaded), written as every export is."""
    import onnx

    with _staging(spec) as tmp:
        made = Path(tmp) / "rewritten.onnx"
        onnx.save_model(rewrite(onnx.load(str(source.path))), str(made))
        _save_with_weights_apart(made, spec)
    return spec.path


@contextlib.contextmanager
def _staging(spec: GraphSpec) -> Iterator[Path]:
    """A temporary folder beside ``spec``'s place in the cache to make its graph in (what a killed
    export left there cleared first), the export said on stderr (minutes for a large model)."""
    import tempfile

    from indexer.progress import exporting

    spec.path.parent.mkdir(parents=True, exist_ok=True)
    clear_abandoned(spec.path.parent)
    with (
        exporting(spec.location, spec.path.parent),
        tempfile.TemporaryDirectory(prefix=_export_prefix(), dir=spec.path.parent) as tmp,
    ):
        yield Path(tmp)


def _save_with_weights_apart(graph: Path, spec: GraphSpec) -> None:
    """``graph`` written as ``spec.path`` with its weights in ``spec.weights`` (what ONNX Runtime
    maps at load instead of copying), both made beside ``graph``, their sums kept (``write_sums``)
    and then moved in weights first: a graph in place always finds its weights and its sums (two
    processes exporting one graph write the same bytes, fp32 and int8 alike: checked, so neither
    can pair its graph with other weights)."""
    import onnx

    made = graph.with_name(spec.path.name)
    onnx.save_model(
        onnx.load(str(graph)),
        str(made),
        save_as_external_data=True,
        location=spec.weights.name,
        size_threshold=1024,
    )
    made_weights = made.with_name(spec.weights.name)
    os.chmod(made_weights, made.stat().st_mode & 0o777)  # onnx makes it private; readable as the graph is
    write_sums(spec, made.parent)
    os.replace(made_weights, spec.weights)
    os.replace(made, spec.path)


ABANDONED_AFTER = 86400
"""Seconds after which an export's temporary folder in the cache is taken for abandoned, whoever
made it (one of another machine sharing the cache, or named before folders said their owner)."""


def _export_prefix() -> str:
    """An export's temporary folder names its process and machine, so a later export can tell
    one whose process is gone (``clear_abandoned``)."""
    return f"export-{os.getpid()}-{socket.gethostname()}-"


def clear_abandoned(folder: Path) -> None:
    """Remove what exports killed half-way left in the cache ``folder``: the temporary folders of
    processes of this machine that are gone, and any temporary folder or file a day old. The
    folder of an export still running is never removed (its process is there, and it is younger)."""
    here, now = socket.gethostname(), time.time()
    for found in folder.iterdir():
        pid, _, rest = found.name.removeprefix("export-").partition("-")
        ours = found.name.startswith("export-") and pid.isdigit() and rest.startswith(here + "-")
        if not (ours or found.name.startswith("tmp")):
            continue
        try:
            old = now - found.lstat().st_mtime > ABANDONED_AFTER
        except OSError:
            continue
        if old or (ours and not _running(int(pid))):
            if found.is_dir() and not found.is_symlink():
                shutil.rmtree(found, ignore_errors=True)
            else:
                found.unlink(missing_ok=True)


def _running(pid: int) -> bool:
    """A process of this machine has ``pid`` (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def export_graph(network: torch.nn.Module, spec: GraphSpec) -> Path:
    """The graph of ``spec``, exported from ``network`` (the eval-mode model) unless cached intact."""
    if not intact(spec):
        _export(network, spec)
    return spec.path


def export_failure(exc: Exception) -> str:
    """An exporter's exception as one line: its type and the first line of its message."""
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"


def export_for_queries(network: torch.nn.Module, spec: GraphSpec) -> str | None:
    """Export the graph an index's queries will run on; on failure note why (queries then run on
    torch, and ``info`` says so) and return the reason instead of failing the build."""
    return export_noted(spec, lambda: export_graph(network, spec))


def export_noted(spec: GraphSpec, export: Callable[[], object]) -> str | None:
    """Run ``export`` (which writes ``spec``'s graph: a sentence encoder's, a reranker's); on
    failure note why beside where the graph would lie (``not_exported``: the network runs on
    torch, and nobody retries) and return the reason instead of failing."""
    try:
        export()
    except Exception as exc:  # noqa: BLE001 - any exporter failure means: run on torch
        return not_exported(spec, export_failure(exc))
    spec.failure.unlink(missing_ok=True)
    return None


def not_exported(spec: GraphSpec, reason: str) -> str:
    """Note beside where ``spec``'s graph would lie why it is not exported (so ``info`` can say it
    and nobody retries each query), and return the reason."""
    try:
        spec.failure.parent.mkdir(parents=True, exist_ok=True)
        spec.failure.write_text(reason + "\n", encoding="utf-8")
    except OSError:
        pass
    return reason
