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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from indexer.embedding.graphs import INT8_FORMATS, GraphSpec, int8_format
from indexer.embedding.strategy import BACKEND_PRECISION
from indexer.encoders.bidirectional import bidirectional_masks
from indexer.errors import BadInput


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
    rewrite = None
    if BACKEND_PRECISION[spec.backend] == "int8":
        from indexer.encoders.int8_graph import per_token_int8

        weight_max = INT8_FORMATS[spec.int8 or int8_format().name].weight_max
        rewrite = functools.partial(per_token_int8, weight_max=weight_max)
    export_into(
        network,
        _Outputs(network, layers, pooler).eval(),
        (ids, (ids > 0).long()),
        (["input_ids", "attention_mask"], names),
        axes,
        spec,
        rewrite,
    )


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
    import tempfile
    import warnings

    from indexer.progress import exporting

    spec.path.parent.mkdir(parents=True, exist_ok=True)
    with (
        exporting(spec.location, spec.path.parent),  # minutes for a large model: said on stderr
        tempfile.TemporaryDirectory(dir=spec.path.parent) as tmp,
        warnings.catch_warnings(),
        _eager_attention(network),
    ):
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
        _save_with_weights_apart(fused, spec.path, spec.weights)


def _save_with_weights_apart(graph: Path, target: Path, weights: Path) -> None:
    """``graph`` written as ``target`` with its weights in ``weights`` (what ONNX Runtime maps at
    load instead of copying), both made beside ``graph`` and moved in weights first: a graph in
    place always finds its weights (two processes exporting one graph write the same bytes, fp32
    and int8 alike: checked, so neither can pair its graph with other weights)."""
    import onnx

    made = graph.with_name(target.name)
    onnx.save_model(
        onnx.load(str(graph)),
        str(made),
        save_as_external_data=True,
        location=weights.name,
        size_threshold=1024,
    )
    made_weights = made.with_name(weights.name)
    os.chmod(made_weights, made.stat().st_mode & 0o777)  # onnx makes it private; readable as the graph is
    os.replace(made_weights, weights)
    os.replace(made, target)


def export_graph(network: torch.nn.Module, spec: GraphSpec) -> Path:
    """The graph of ``spec``, exported from ``network`` (the eval-mode model) unless cached."""
    if not spec.exported:
        _export(network, spec)
    return spec.path


def export_failure(exc: Exception) -> str:
    """An exporter's exception as one line: its type and the first line of its message."""
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"


def export_for_queries(network: torch.nn.Module, spec: GraphSpec) -> str | None:
    """Export the graph an index's queries will run on; on failure note why (queries then run on
    torch, and ``info`` says so) and return the reason instead of failing the build."""
    try:
        export_graph(network, spec)
    except Exception as exc:  # noqa: BLE001 - any exporter failure means: answer with torch
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
