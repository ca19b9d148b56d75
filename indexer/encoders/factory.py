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

The choice is one step, ``decide``: ``(strategy, held graph, placement) -> Decision`` (runtime,
precision, placement, graph, why), made without loading anything; ``encoder_for`` then builds what
it says, exporting the graph first where the decision needs it. ``RUNTIMES`` names the class of
each runtime, imported only when chosen, so choosing ONNX Runtime never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from importlib import import_module
from typing import Any

from indexer.embedding.models import identified, model_facts_from_files, resolve_strategy
from indexer.embedding.strategy import PRECISION, Strategy
from indexer.encoders.base import Choice, Encoder
from indexer.encoders.devices import CPU as ON_CPU
from indexer.encoders.devices import Placement
from indexer.encoders.onnx_graph import CPU, GraphSpec, graph_spec
from indexer.errors import BadInput

RUNTIMES: dict[str, str] = {
    "torch": "indexer.encoders.torch_encoder:TorchEncoder",
    "onnx": "indexer.encoders.onnx_encoder:OnnxEncoder",
}
"""Runtime -> the encoder class that runs it (``module:Class``). A backend is a runtime and a
precision (``indexer.embedding.strategy.RUNTIME`` and ``PRECISION``): ``onnx-int8`` is ONNX
Runtime in int8."""

EXPORTED = "its graph was exported now (cached for the next time)"
HELD = "the index holds its graph"
CACHED = "its graph is cached"
ASKED = "backend torch asked for"


def runtime(name: str) -> Any:
    """The encoder class of runtime ``name`` (``RUNTIMES``), imported now."""
    module, attribute = RUNTIMES[name].split(":")
    return getattr(import_module(module), attribute)


@dataclass(frozen=True)
class Decision:
    """What runs a strategy's network, at what precision, where, and why: decided before anything
    is loaded. ``graph``: the exported graph ONNX Runtime runs, and ``strategy`` the resolved
    strategy it runs; ``export``: that graph must be exported from the torch model first (a failure
    falls back to torch, saying why)."""

    runtime: str
    precision: str
    placement: Placement
    why: str
    graph: GraphSpec | None = None
    strategy: Strategy | None = None
    export: bool = False
    failure: str | None = None


def decide(
    strategy: Strategy, *, held: GraphSpec | None = None, placement: Placement = ON_CPU, queries: bool = False
) -> Decision:
    """The one encoder decision (see the module doc). ``strategy``: resolved for ``queries``."""
    precision = PRECISION[strategy.backend]
    if not placement.on_cpu:
        if precision == "int8":
            raise BadInput(f"backend {strategy.backend} runs on the CPU only (--device cpu)")
        return Decision("torch", placement.precision, placement, f"{placement.describe()} asked for")
    if held is not None and held.exported:  # an index's own graph: its queries and what is added
        return Decision("onnx", PRECISION[held.backend], placement, HELD, graph=held)
    if strategy.backend == "torch" and not queries:
        return Decision("torch", "fp32", placement, ASKED)
    resolved, spec = _graph(strategy, queries)
    if spec is not None and spec.exported:
        return Decision("onnx", precision, placement, CACHED, graph=spec, strategy=resolved)
    failure = spec.failed() if spec is not None and queries else None  # queries never retry an export
    if failure is not None:
        return _fallback(strategy, placement, failure)
    return Decision("onnx", precision, placement, EXPORTED, export=True)


def _graph(strategy: Strategy, queries: bool) -> tuple[Strategy, GraphSpec | None]:
    """The resolved strategy and its graph, where they can be known without loading the model."""
    if queries:
        return strategy, graph_spec(strategy)
    facts = model_facts_from_files(strategy.model)
    if facts is None:
        return strategy, None
    resolved = resolve_strategy(strategy, facts)
    return resolved, graph_spec(resolved, facts.num_layers)


def _fallback(strategy: Strategy, placement: Placement, failure: str) -> Decision:
    """Where the graph cannot be had: fp32 vectors come from torch; int8 ones exist only on it."""
    if PRECISION[strategy.backend] == "int8":
        raise BadInput(f"backend {strategy.backend}: this model cannot be exported to ONNX ({failure})")
    return Decision("torch", "fp32", placement, f"its graph cannot be exported ({failure})", failure=failure)


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
    """The encoder ``decide`` picks for ``strategy``. ``queries``: for an index's questions (the
    strategy is its stored, resolved one). ``export_queries``: also make sure the graph the index's
    queries will run exists (what a build does; ``choice.export_failure`` says why it cannot).
    ``provider``: ONNX Runtime's execution provider. ``held``: the graph an index holds for its
    queries (``StoredIndex.graph``): the same network for what is added to it. ``placement``: the
    device and precision (a GPU runs torch). (Embedding on Ray is ``indexer.writing.distributed.RayEncoder``,
    whose workers each pick their encoder here.)"""
    request = strategy or Strategy()
    if not queries:
        request = identified(request)
    decision = decide(request, held=held, placement=placement, queries=queries)
    spin = not queries  # bulk work keeps ONNX Runtime's threads spinning; a server wants them asleep
    if decision.runtime == "torch":  # what embeds the vectors is what the strategy records
        on_torch = replace(request, backend="torch")
        encoder = runtime("torch")(on_torch, batch_size=batch_size, placement=decision.placement)
        failure, why = decision.failure, decision.why
        if export_queries and not queries and failure is None:
            failure = encoder.export_for_queries()
            why += f"; its graph cannot be exported ({failure})" if failure else ""
        encoder.choice = Choice("torch", why, export_failure=failure)
        return encoder
    graph, resolved = decision.graph, decision.strategy or request
    if decision.export:
        torch = runtime("torch")(request, batch_size=batch_size)
        failure = torch.export_for_queries()  # an onnx strategy's graph is its queries' graph
        if failure is not None:
            fallback = _fallback(request, decision.placement, failure)
            torch.strategy = replace(torch.strategy, backend="torch")  # what embeds the vectors
            torch.choice = Choice("torch", fallback.why, export_failure=failure)
            return torch
        resolved, graph = torch.strategy, graph_spec(torch.strategy, torch.num_layers)
    assert graph is not None
    choice = Choice(graph.backend, decision.why, provider=provider)
    return runtime("onnx")(
        resolved, batch_size=batch_size, spec=graph, spin=spin, provider=provider, choice=choice
    )


def encoder_status(strategy: Strategy, held: GraphSpec | None = None) -> str:
    """What ``info`` shows for an index's queries, without loading anything: ``onnx``, or
    ``torch (why)`` when they cannot run without torch. ``held``: the graph the index holds."""
    decision = decide(strategy, held=held, queries=True)
    if decision.runtime == "torch":
        return f"torch ({decision.failure})"
    return "onnx" if not decision.export else "onnx (graph not exported yet: the next query exports it)"
