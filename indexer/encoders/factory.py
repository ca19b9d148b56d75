"""The one place that picks an encoder for a strategy, and says what it picked and why
(``Encoder.decision``): for indexing (``build``, ``add``, shards, Ray workers, evaluation) and for
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

- ``--ray``: the same decision, made for the workers (``indexer.encoders.on_ray``), each of which
  embeds on the placement it says and is checked to have.

The choice is one step, ``decide``: ``(strategy, options, held graph) -> Decision`` (runtime,
placement, batching, Ray, why), made from the resolved ``EmbeddingOptions`` without loading
anything; ``encoder_for`` then builds what it says, exporting the graph first where the decision
needs it (an export that fails is the fallback the decision names, not a second decision).
``RUNTIMES`` names the class of each runtime, imported only when chosen, so choosing ONNX Runtime
never imports torch. Nothing else builds an encoder: a sweep, fine-tuning and word vectors get
their torch encoder from ``torch_encoder``.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from importlib import import_module
from typing import TYPE_CHECKING, Any

from indexer.embedding.batching import Batching
from indexer.embedding.graphs import GraphSpec, graph_spec
from indexer.embedding.models import TRUST_FLAG, identified, model_facts_from_files, resolve_strategy
from indexer.embedding.strategy import BACKEND_PRECISION, Strategy
from indexer.encoders.base import Decision, Encoder
from indexer.encoders.devices import Placement
from indexer.encoders.onnx_graph import CACHED, CPU, EXPORTED, cannot_export, graph_step
from indexer.encoders.options import EmbeddingOptions, given
from indexer.errors import BadInput

if TYPE_CHECKING:
    from indexer.encoders.torch_encoder import TorchEncoder

RUNTIMES: dict[str, str] = {
    "torch": "indexer.encoders.torch_encoder:TorchEncoder",
    "onnx": "indexer.encoders.onnx_encoder:OnnxEncoder",
}
"""Runtime -> the encoder class that runs it (``module:Class``). A backend is a runtime and a
precision (``indexer.embedding.strategy.RUNTIME`` and ``PRECISION``): ``onnx-int8`` is ONNX
Runtime in int8."""

HELD = "the index holds its graph"
ASKED = "backend torch asked for"
SWEEP = "every layer in one forward pass (a sweep)"


def runtime(name: str) -> Any:
    """The encoder class of runtime ``name`` (``RUNTIMES``), imported now."""
    module, attribute = RUNTIMES[name].split(":")
    return getattr(import_module(module), attribute)


def decide(
    strategy: Strategy,
    options: EmbeddingOptions | None = None,
    *,
    held: GraphSpec | None = None,
    queries: bool = False,
) -> Decision:
    """The one encoder decision (see the module doc). ``strategy``: resolved for ``queries``;
    ``options`` None: the defaults (``indexer.encoders.options``)."""
    options = given(options)
    if options.ray is not None and not queries:
        here = decide(strategy, options.here(), held=held)
        return replace(here, ray=options.ray, workers=options.ray_workers)
    on = options.placement
    batching = Batching.on(on.on_cpu, options.batch_size)  # the ONNX Runtime's; torch's below
    on_torch = Batching.on(on.on_cpu, options.batch_size, runtime="torch")
    precision = BACKEND_PRECISION[strategy.backend]
    if not on.on_cpu:
        if precision == "int8":
            raise BadInput(f"backend {strategy.backend} runs on the CPU only (--device cpu)")
        return Decision("torch", on, on_torch, f"{on.describe()} asked for")
    provider = options.provider or CPU
    if held is not None and held.exported:  # an index's own graph: its queries and what is added
        on = Placement("cpu", BACKEND_PRECISION[held.backend])
        return Decision("onnx", on, batching, HELD, provider=provider, graph=held)
    if strategy.backend == "torch" and not queries:
        return Decision("torch", on, on_torch, ASKED)
    resolved, spec = _graph(strategy, queries, options.trust_remote_code)
    graph_on = Placement("cpu", precision)
    step, failure = graph_step(spec, retry=not queries)  # queries never retry an export
    if step == "cached":
        return Decision("onnx", graph_on, batching, CACHED, provider=provider, graph=spec, strategy=resolved)
    if failure is not None:
        return _fallback(strategy, on, options.batch_size, failure)
    return Decision("onnx", graph_on, batching, EXPORTED, provider=provider, export=True)


def _graph(strategy: Strategy, queries: bool, trusted: bool) -> tuple[Strategy, GraphSpec | None]:
    """The resolved strategy and its graph, where they can be known without loading the model."""
    if queries:
        return strategy, graph_spec(strategy)
    facts = model_facts_from_files(strategy.model, trusted=trusted)
    if facts is None:
        return strategy, None
    resolved = resolve_strategy(strategy, facts)
    return resolved, graph_spec(resolved, facts.num_layers)


def _fallback(strategy: Strategy, on: Placement, batch_size: int, failure: str) -> Decision:
    """Where the graph cannot be had: fp32 vectors come from torch; int8 ones exist only on it."""
    if BACKEND_PRECISION[strategy.backend] == "int8":
        raise BadInput(f"backend {strategy.backend}: this model cannot be exported to ONNX ({failure})")
    batching = Batching.on(on.on_cpu, batch_size, runtime="torch")
    return Decision("torch", on, batching, cannot_export(failure), export_failure=failure)


def remote_code_refusal(strategy: Strategy, options: EmbeddingOptions) -> BadInput | None:
    """Why ``strategy``, an index's (its model runs code of its own), may not embed with
    ``options`` (without ``--trust-remote-code``); None where it may."""
    if not strategy.remote_code or options.trust_remote_code:
        return None
    return BadInput(
        f"the model {strategy.model} runs code of its own: give {TRUST_FLAG} again to embed with it "
        "(this index was built with it)"
    )


def encoder_for(
    strategy: Strategy | None = None,
    options: EmbeddingOptions | None = None,
    *,
    queries: bool = False,
    export_queries: bool = False,
    held: GraphSpec | None = None,
) -> Encoder:
    """The encoder ``decide`` picks for ``strategy`` with ``options``. ``queries``: for an index's
    questions (the strategy is its stored, resolved one). ``export_queries``: also make sure the
    graph the index's queries will run exists (what a build does; ``decision.export_failure`` says
    why it cannot). ``held``: the graph an index holds for its queries (``StoredIndex.graph``): the
    same network for what is added to it. With ``options.ray``, a build resolves the strategy and
    exports its graph here first; the workers then embed as the decision says."""
    options = given(options)
    request = strategy or Strategy()
    refusal = remote_code_refusal(request, options)
    if refusal is not None:
        raise refusal
    if not queries:
        request = identified(request)
    decision = decide(request, options, held=held, queries=queries)
    if decision.ray is not None:
        from indexer.encoders.on_ray import RayEncoder, worker_options

        if export_queries:  # the strategy resolved and its graph exported once, by the driver
            here = encoder_for(request, options.here(), export_queries=True, held=held)
            request = here.strategy
            decision = replace(here.decision, ray=options.ray, workers=options.ray_workers)
        build = partial(encoder_for, request, worker_options(decision, options), held=held)
        return RayEncoder(request, decision, build)
    spin = not queries  # bulk work keeps ONNX Runtime's threads spinning; a server wants them asleep
    if decision.runtime == "torch":  # what embeds the vectors is what the strategy records
        trusted = options.trust_remote_code
        encoder = runtime("torch")(replace(request, backend="torch"), decision=decision, trusted=trusted)
        if export_queries and not queries and decision.export_failure is None:
            failure = encoder.export_for_queries()
            if failure:
                why = f"{decision.why}; {cannot_export(failure)}"
                encoder.decision = replace(decision, why=why, export_failure=failure)
        return encoder
    graph, resolved = decision.graph, decision.strategy or request
    if decision.export:
        exporting = replace(decision, runtime="torch", placement=options.placement)
        torch = runtime("torch")(request, decision=exporting, trusted=options.trust_remote_code)
        failure = torch.export_for_queries()  # an onnx strategy's graph is its queries' graph
        if failure is not None:
            torch.strategy = replace(torch.strategy, backend="torch")  # what embeds the vectors
            torch.decision = _fallback(request, options.placement, options.batch_size, failure)
            return torch
        resolved, graph = torch.strategy, graph_spec(torch.strategy, torch.num_layers)
        decision = replace(decision, graph=graph, strategy=resolved)
    assert graph is not None
    return runtime("onnx")(resolved, spec=graph, spin=spin, decision=decision)


def torch_encoder(
    strategy: Strategy | None = None,
    options: EmbeddingOptions | None = None,
    *,
    all_layers: bool = False,
    loaded: tuple[Any, Any] | None = None,
) -> TorchEncoder:
    """The strategy's model on torch, whatever its backend (a sweep keeps it in the strategies it
    compares): for what needs the model itself (a sweep's every layer, ``all_layers``; fine-tuning;
    word vectors). ``loaded``: the tokenizer and
    model of another torch encoder of the same model, reused."""
    options = given(options)
    on = options.placement
    why = SWEEP if all_layers else ASKED
    decision = Decision("torch", on, Batching.on(on.on_cpu, options.batch_size, runtime="torch"), why)
    return runtime("torch")(
        strategy or Strategy(),
        decision=decision,
        all_layers=all_layers,
        loaded=loaded,
        trusted=options.trust_remote_code,
    )


def encoder_status(strategy: Strategy, held: GraphSpec | None = None) -> str:
    """What ``info`` shows for an index's queries, without loading anything: ``onnx``, or
    ``torch (why)`` when they cannot run without torch. ``held``: the graph the index holds."""
    decision = decide(strategy, held=held, queries=True)
    if decision.runtime == "torch":
        return f"torch ({decision.export_failure})"
    return "onnx" if not decision.export else "onnx (graph not exported yet: the next query exports it)"
