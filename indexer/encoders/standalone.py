"""An index's whole strategy as one ONNX model, for programs that are not semsearch: token ids
and their mask in, the vector the index compares out (``semsearch export-encoder``).

The index's query graph (``indexer.encoders.onnx_graph``: the network up to the hidden states it
reads) gets the rest of the strategy appended as ONNX operators, each the ONNX form of its NumPy
original: the layer choice and combination (``indexer.embedding.head.Head.tokens``), then each module's
own ``export`` (``indexer.embedding.modules``): the pooling over the padding mask without the special
tokens when asked, the model folder's modules after it, the normalisation; and the fitted centering
or whitening (``indexer.embedding.transform.Transform.apply``). Inputs and output
follow the names sentence-transformers' ONNX exports use, which Vespa, OpenSearch, Qdrant's
FastEmbed and Triton load: ``input_ids``, ``attention_mask`` (and ``token_type_ids`` where the
network reads it) in, ``sentence_embedding`` out. The graph keeps ONNX Runtime's fused BERT
operators (``com.microsoft``): it runs wherever ONNX Runtime does.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from indexer.embedding.graphs import GraphSpec
from indexer.embedding.modules.base import after_pooling
from indexer.embedding.modules.normalize import Normalize
from indexer.embedding.modules.pooling import Pooling
from indexer.embedding.strategy import Strategy
from indexer.embedding.transform import Transform
from indexer.errors import BadInput

OUTPUT = "sentence_embedding"
SINGLE_FILE_LIMIT = 1 << 30
"""Weights up to this many bytes stay inside ``model.onnx`` (protobuf's limit is 2 GB); a larger
model keeps them beside it in ``model.onnx.data``."""


AXES_AS_INPUT = 18
"""The opset from which ``ReduceMax``/``ReduceL2`` take their axes as an input, not an attribute
(an int8 graph is opset 21: ``indexer.encoders.int8_graph``)."""


class _Appender:
    """Operators appended to a graph under names of their own (the modules' ``Graph``), in the
    graph's own opset: a reduction's ``axes`` is written as the opset reads it."""

    FLOAT = TensorProto.FLOAT
    BOOL = TensorProto.BOOL

    def __init__(self, model: onnx.ModelProto):
        self.graph = model.graph
        self.count = 0
        self.opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=17)

    def _name(self, kind: str) -> str:
        self.count += 1
        return f"semsearch/{kind}_{self.count}"

    def op(self, kind: str, inputs: Sequence[str], *, first: bool = False, **attributes: object) -> str:
        out = self._name(kind)
        if kind.startswith("Reduce") and "axes" in attributes and self.opset >= AXES_AS_INPUT:
            axes = np.array(attributes.pop("axes"), dtype=np.int64)
            inputs = [*inputs, self.const(axes)]
        tensors = {
            k: numpy_helper.from_array(v) if isinstance(v, np.ndarray) else v for k, v in attributes.items()
        }
        node = helper.make_node(kind, list(inputs), [out], name=out, **tensors)
        if first:  # feeds the network: before its nodes, so the list stays in topological order
            self.graph.node.insert(0, node)
        else:
            self.graph.node.append(node)
        return out

    def const(self, value: np.ndarray) -> str:
        name = self._name("const")
        self.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
        return name


def _tokens_in(ids: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(ids, TensorProto.INT64, ["batch", "sequence"])


def _wire_token_types(graph: onnx.GraphProto, ops: _Appender) -> bool:
    """Feed a ``token_type_ids`` input to the network's segment embedding (exported reading the
    model's all-zero default); False where the network has none."""
    table = next((t.name for t in graph.initializer if "token_type_embeddings" in t.name), None)
    if table is None:
        return False
    for node in graph.node:
        if node.op_type == "EmbedLayerNormalization" and len(node.input) > 4 and node.input[4] == table:
            node.input[1] = ops.op("Cast", ["token_type_ids"], first=True, to=TensorProto.INT32)
            return True
        if node.op_type == "Gather" and node.input[0] == table:
            node.input[1] = "token_type_ids"
            return True
    return False


def _combined(ops: _Appender, strategy: Strategy, states: Sequence[str]) -> str:
    """``Head.tokens``: the chosen hidden states, combined."""
    if len(states) == 1:
        return states[0]
    if strategy.combine == "concat":
        return ops.op("Concat", states, axis=-1)
    total = ops.op("Sum", states)
    return total if strategy.combine == "sum" else ops.op("Div", [total, ops.const(np.float32(len(states)))])


def standalone(
    spec: GraphSpec,
    strategy: Strategy,
    *,
    num_layers: int,
    hidden_size: int,
    special_ids: Sequence[int],
    transform: Transform | None,
) -> tuple[onnx.ModelProto, int, list[str]]:
    """The graph of ``spec`` with ``strategy``'s head (and ``transform``) appended: the model,
    its output width and its input names."""
    model = _with_weights(spec)
    graph = model.graph
    ops = _Appender(model)
    if "attention_mask" not in {i.name for i in graph.input}:  # a graph of layer 0 alone
        graph.input.append(_tokens_in("attention_mask"))
    if _wire_token_types(graph, ops):
        graph.input.append(_tokens_in("token_type_ids"))
    if strategy.pooling == "pooler":
        vectors = "pooler"
    else:
        states = [f"h{i % (num_layers + 1)}" for i in strategy.layers or (-1,)]
        tokens = _combined(ops, strategy, states)
        pooling = Pooling(strategy.pooling, skip_special=strategy.skip_special, special_ids=special_ids)
        vectors = pooling.export(ops, tokens)
    for step in after_pooling(spec.location, strategy.modules):
        vectors = step.export(ops, vectors)
    if strategy.dimensions is not None:  # the first ones, before normalising (``Head``)
        ends = [ops.const(np.array(v, dtype=np.int64)) for v in ([0], [strategy.dimensions], [1])]
        vectors = ops.op("Slice", [vectors, *ends])
    if strategy.normalize:
        vectors = Normalize().export(ops, vectors)
    dimension = strategy.dimension(hidden_size)
    if transform is not None:
        vectors = ops.op("Sub", [vectors, ops.const(transform.mean.astype(np.float32))])
        if transform.matrix is not None:
            vectors = ops.op("MatMul", [vectors, ops.const(transform.matrix.astype(np.float32))])
            dimension = int(transform.matrix.shape[1])
        vectors = Normalize().export(ops, vectors)
    graph.node.append(helper.make_node("Identity", [vectors], [OUTPUT], name=OUTPUT))
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", dimension]))
    return model, dimension, [i.name for i in graph.input]


def _with_weights(spec: GraphSpec) -> onnx.ModelProto:
    """The graph with its weights read into it from ``spec.weights``, by hand: ``onnx.load``
    refuses a weights file with several hard links, which is what an index holds
    (``indexer.store.held``)."""
    model = onnx.load(str(spec.path), load_external_data=False)
    with spec.weights.open("rb") as weights:
        for tensor in model.graph.initializer:
            if tensor.data_location != TensorProto.EXTERNAL:
                continue
            where = {entry.key: entry.value for entry in tensor.external_data}
            if where.get("location") != spec.weights.name:
                raise BadInput(f"{spec.path.name} names weights other than {spec.weights.name}")
            weights.seek(int(where.get("offset", 0)))
            tensor.raw_data = weights.read(int(where["length"]))
            tensor.data_location = TensorProto.DEFAULT
            del tensor.external_data[:]
    return model


def save(model: onnx.ModelProto, target: Path) -> list[str]:
    """``model`` as ``target`` (one file, or its weights beside it past ``SINGLE_FILE_LIMIT``);
    returns the names of the files written."""
    weights = sum(t.ByteSize() for t in model.graph.initializer)
    if weights <= SINGLE_FILE_LIMIT:
        onnx.save_model(model, str(target))
        return [target.name]
    data = target.name + ".data"
    onnx.save_model(model, str(target), save_as_external_data=True, location=data, size_threshold=1024)
    return [target.name, data]
