"""Texts -> vectors without torch or transformers: the read path's encoder, and the indexer's once
the strategy's graph is exported.

A resolved strategy needs only the model's ``tokenizer.json`` (``indexer.encoders.tokens``), the
network exported to ONNX (``indexer.encoders.onnx_graph``) and the NumPy ``Head``. Importing
torch and transformers and loading the model cost seconds per process; this costs a fraction.
"""

from __future__ import annotations

from indexer.embedding.graphs import GraphSpec, graph_spec
from indexer.embedding.head import Head
from indexer.embedding.models import config_shape, model_file, read_json
from indexer.embedding.strategy import Strategy
from indexer.encoders.base import Decision, NetworkEncoder
from indexer.encoders.onnx_graph import CPU, ENCODE, OnnxGraph, side_by_side, usable_cores
from indexer.encoders.tokens import TextTokenizer
from indexer.errors import BadInput


class OnnxEncoder(NetworkEncoder):
    """The strategy's exported graph on ONNX Runtime (``onnx`` or ``onnx-int8``), tokenised by
    ``tokenizers``. ``strategy`` must be resolved (a stored one is). ``spin``: let idle threads
    spin between operators (indexing throughput; a server wants them asleep), and on a many-core
    machine run several sessions side by side (``side_by_side``). ``decision``: the factory's
    (its execution provider, its batching): ``indexer.encoders.factory`` alone builds one."""

    def __init__(
        self,
        strategy: Strategy,
        *,
        spec: GraphSpec | None = None,
        spin: bool = False,
        decision: Decision,
        sessions: tuple[int, int] | None = None,
    ):
        if not strategy.resolved:
            raise BadInput("the ONNX encoder needs a resolved strategy (an index's stored one)")
        spec = spec or graph_spec(strategy)
        provider = decision.provider or CPU
        if not spec.exported:
            raise FileNotFoundError(spec.path)
        tokens = TextTokenizer.from_files(spec.location, strategy)
        shape = config_shape(read_json(model_file(spec.location, "config.json")) or {})
        if shape is None:
            raise BadInput(f"{spec.location} has no config.json saying its layers and width")
        bulk = spin and provider == CPU
        count, threads = sessions or (side_by_side(ENCODE) if bulk else (1, usable_cores()))
        graphs = [OnnxGraph(spec, spin=spin, provider=provider, threads=threads) for _ in range(count)]
        super().__init__(
            strategy,
            tokens,
            Head(strategy, shape[0], tokens.special_ids, spec.location),
            graphs[0],
            hidden_size=shape[1],
            decision=decision,
        )
        self.copies = graphs[1:]
