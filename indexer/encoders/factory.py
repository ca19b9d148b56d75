"""The one place that picks an encoder for a strategy, and says what it picked and why
(``Encoder.choice``): for indexing (``build``, ``add``, shards, Ray workers, evaluation) and for
an index's queries (``queries=True``).

- ``torch`` asked for: the model on torch.
- ``onnx`` / ``onnx-int8``, the graph already exported (cached by the model's fingerprint):
  ONNX Runtime + ``tokenizers`` alone. Importing torch and transformers and loading the model
  cost seconds a process, a large part of indexing a small corpus.
- Not exported yet: the model is loaded on torch, its graph exported (for the next process too)
  and run on ONNX Runtime. A model the exporter fails on is indexed on torch (the strategy then
  says ``torch``: what embedded it); on ``onnx-int8`` that is an error (its vectors exist only on
  the exported graph).
- A GPU (``placement``, from ``--device``; ``indexer.encoders.devices``): the model on torch there,
  through ``indexer.encoders.pipeline`` (the graph its queries run is still exported, from the
  CPU model, first). ONNX Runtime here runs on the CPU only.
- Queries always run the graph (``onnx`` for a ``torch`` index: the same fp32 vectors), exported
  first if that was never tried; on torch, saying why, where it cannot be.

``RUNTIMES`` names the class that runs each backend, imported only when chosen, so choosing ONNX
Runtime never imports torch.
"""

from __future__ import annotations

from dataclasses import replace
from importlib import import_module
from typing import Any

from indexer.encoders.base import Choice, Encoder
from indexer.encoders.devices import CPU as ON_CPU
from indexer.encoders.devices import Placement
from indexer.encoders.onnx_graph import CPU, GraphSpec, graph_spec
from indexer.errors import BadInput
from indexer.models import identified, model_facts_from_files, resolve_strategy
from indexer.strategy import PRECISION, Strategy

RUNTIMES: dict[str, str] = {
    "torch": "indexer.encoders.torch_encoder:TorchEncoder",
    "onnx": "indexer.encoders.onnx_encoder:OnnxEncoder",
    "onnx-int8": "indexer.encoders.onnx_encoder:OnnxEncoder",
}
"""Backend -> the encoder class that runs it (``module:Class``)."""


def runtime(backend: str) -> Any:
    """The encoder class of ``backend`` (``RUNTIMES``), imported now."""
    module, name = RUNTIMES[backend].split(":")
    return getattr(import_module(module), name)


def encoder_for(
    strategy: Strategy | None = None,
    *,
    batch_size: int = 32,
    queries: bool = False,
    export_queries: bool = False,
    provider: str = CPU,
    held: GraphSpec | None = None,
    placement: Placement = ON_CPU,
) -> Encoder:
    """The encoder of ``strategy`` (see the module doc). ``queries``: for an index's questions
    (the strategy is its stored, resolved one). ``export_queries``: also make sure the graph the
    index's queries will run exists (what a build does; ``choice.export_failure`` says why it
    cannot). ``provider``: ONNX Runtime's execution provider. ``held``: the graph an index holds
    for its queries (``StoredIndex.graph``), run before any other (for its queries and for what is
    added to it: the same network, so the same vectors). ``placement``: a GPU embeds on torch there.
    (Embedding on Ray is ``indexer.distributed.RayEncoder``, whose workers each pick their encoder
    here.)"""
    if not placement.on_cpu:
        return _on_device(strategy or Strategy(), placement, batch_size, export_queries and not queries)
    if queries:
        return _for_queries(strategy or Strategy(), provider, held)
    if held is not None and held.exported:  # an index's own graph embeds what is added to it
        return _onnx(strategy or Strategy(), held, HELD, provider, batch_size, spin=True)
    request = identified(strategy or Strategy())
    if request.backend == "torch":
        encoder = runtime("torch")(request, batch_size=batch_size)
        if not export_queries:
            return encoder
        failure = encoder.export_for_queries()
        why = "backend torch asked for" + (f"; its graph cannot be exported ({failure})" if failure else "")
        choice = Choice("torch", why, export_failure=failure)
        return runtime("torch")(encoder.strategy, batch_size=batch_size, choice=choice, loaded=encoder.loaded)
    facts = model_facts_from_files(request.model)
    if facts is not None:
        resolved = resolve_strategy(request, facts)
        spec = graph_spec(resolved, facts.num_layers)
        if spec.exported:
            return _onnx(resolved, spec, "its graph is cached", provider, batch_size, spin=True)
    torch = runtime("torch")(request, batch_size=batch_size)
    failure = torch.export_for_queries()  # an onnx strategy's graph is its queries' graph
    if failure is None:
        spec = graph_spec(torch.strategy, torch.num_layers)
        return _onnx(torch.strategy, spec, EXPORTED, provider, batch_size, spin=True)
    return _on_torch(torch.strategy, failure, batch_size, torch.loaded)


EXPORTED = "its graph was exported now (cached for the next time)"
HELD = "the index holds its graph"


def _on_device(strategy: Strategy, placement: Placement, batch_size: int, export_queries: bool) -> Encoder:
    """The model on torch on a GPU; with ``export_queries``, its CPU query graph exported first."""
    if PRECISION[strategy.backend] == "int8":
        raise BadInput(f"backend {strategy.backend} runs on the CPU only: use --device cpu or --backend onnx")
    encoder = runtime("torch")(replace(strategy, backend="torch"), batch_size=batch_size, placement=placement)
    failure = encoder.export_for_queries() if export_queries else None
    why = f"{placement.describe()} asked for"
    if failure:
        why += f"; its graph cannot be exported ({failure})"
    encoder.choice = Choice("torch", why, export_failure=failure)
    return encoder


def _for_queries(strategy: Strategy, provider: str, held: GraphSpec | None) -> Encoder:
    """The graph the index holds; else the cached one; else export it, unless that failed before
    (its note says why: nobody retries each query); on torch where it cannot be had."""
    if held is not None and held.exported:
        return _onnx(strategy, held, HELD, provider)
    spec = graph_spec(strategy)
    if spec.exported:
        return _onnx(strategy, spec, "its graph is cached", provider)
    failure = spec.failed()
    if failure is not None:
        return _on_torch(strategy, failure)
    torch = runtime("torch")(strategy)
    failure = torch.export_for_queries()
    if failure is None:
        return _onnx(strategy, graph_spec(torch.strategy, torch.num_layers), EXPORTED, provider)
    return _on_torch(strategy, failure, loaded=torch.loaded)


def _onnx(
    strategy: Strategy, spec: GraphSpec, why: str, provider: str, batch_size: int = 32, *, spin: bool = False
) -> Encoder:
    choice = Choice(spec.backend, why, provider=provider)
    return runtime(spec.backend)(
        strategy, batch_size=batch_size, spec=spec, spin=spin, provider=provider, choice=choice
    )


def _on_torch(
    strategy: Strategy, failure: str, batch_size: int = 32, loaded: tuple[Any, Any] | None = None
) -> Encoder:
    """Where the graph cannot be had: fp32 vectors come from torch (and the strategy says so:
    it is what embedded them); int8 vectors exist only on the exported graph."""
    if strategy.backend == "onnx-int8":
        raise BadInput(f"backend onnx-int8: this model cannot be exported to ONNX ({failure})")
    choice = Choice("torch", f"its graph cannot be exported ({failure})", export_failure=failure)
    return runtime("torch")(
        replace(strategy, backend="torch"), batch_size=batch_size, choice=choice, loaded=loaded
    )


def encoder_status(strategy: Strategy, held: GraphSpec | None = None) -> str:
    """What ``info`` shows for an index's queries, without loading anything: ``onnx``, or
    ``torch (why)`` when they cannot run without torch. ``held``: the graph the index holds."""
    if held is not None and held.exported:
        return "onnx"
    spec = graph_spec(strategy)
    if spec.exported:
        return "onnx"
    reason = spec.failed()
    return f"torch ({reason})" if reason else "onnx (graph not exported yet: the next query exports it)"
