"""An index's whole strategy as one ONNX model, for programs that are not semsearch: token ids
and their mask in, the vector the index compares out (``semsearch export-encoder``).

The index's query graph (``indexer.encoders.onnx_graph``: the network up to the hidden states it
reads) gets the rest of the strategy appended as ONNX operators, each the ONNX form of its NumPy
original: the layer choice and combination (``indexer.embedding.head.Head.tokens``), the pooling over the
padding mask without the special tokens when asked (``indexer.embedding.pooling``), the normalisation and
the fitted centering or whitening (``indexer.embedding.transform.Transform.apply``). Inputs and output
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
from indexer.embedding.strategy import BACKEND_PRECISION, Strategy
from indexer.embedding.transform import Transform
from indexer.errors import BadInput

OUTPUT = "sentence_embedding"
SINGLE_FILE_LIMIT = 1 << 30
"""Weights up to this many bytes stay inside ``model.onnx`` (protobuf's limit is 2 GB); a larger
model keeps them beside it in ``model.onnx.data``."""


class _Appender:
    """Operators appended to a graph under names of their own."""

    def __init__(self, graph: onnx.GraphProto):
        self.graph = graph
        self.count = 0

    def _name(self, kind: str) -> str:
        self.count += 1
        return f"semsearch/{kind}_{self.count}"

    def op(self, kind: str, inputs: Sequence[str], *, first: bool = False, **attributes: object) -> str:
        out = self._name(kind)
        node = helper.make_node(kind, list(inputs), [out], name=out, **attributes)
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


def _pooling_mask(ops: _Appender, strategy: Strategy, special_ids: Sequence[int]) -> str:
    """``Pooling.token_mask``: the real tokens, minus the special ones when asked (never none)."""
    mask = ops.op("Cast", ["attention_mask"], to=TensorProto.BOOL)
    if not (strategy.skip_special and special_ids):
        return mask
    special = None
    for token in sorted(set(special_ids)):
        equal = ops.op("Equal", ["input_ids", ops.const(np.int64(token))])
        special = equal if special is None else ops.op("Or", [special, equal])
    content = ops.op("And", [mask, ops.op("Not", [special])])
    found = ops.op("ReduceMax", [ops.op("Cast", [content], to=TensorProto.FLOAT)], axes=[1], keepdims=1)
    some = ops.op("Greater", [found, ops.const(np.float32(0))])
    # content where a row has some, else the whole mask (content lies inside it; no bool Where in ORT)
    return ops.op("Or", [content, ops.op("And", [mask, ops.op("Not", [some])])])


def _combined(ops: _Appender, strategy: Strategy, states: Sequence[str]) -> str:
    """``Head.tokens``: the chosen hidden states, combined."""
    if len(states) == 1:
        return states[0]
    if strategy.combine == "concat":
        return ops.op("Concat", states, axis=-1)
    total = ops.op("Sum", states)
    return total if strategy.combine == "sum" else ops.op("Div", [total, ops.const(np.float32(len(states)))])


def _pooled(ops: _Appender, mode: str, tokens: str, mask: str) -> str:
    """``indexer.embedding.pooling.MODES``: ``[batch, sequence, width]`` -> ``[batch, width]``."""
    if mode == "cls":
        return ops.op("Gather", [tokens, ops.const(np.int64(0))], axis=1)
    if mode == "mean":
        weights = ops.op("Cast", [mask], to=TensorProto.FLOAT)
        tokens_axis = ops.const(np.array([1], np.int64))
        spread = ops.op("Unsqueeze", [weights, ops.const(np.array([2], np.int64))])
        total = ops.op("ReduceSum", [ops.op("Mul", [tokens, spread]), tokens_axis], keepdims=0)
        count = ops.op("ReduceSum", [weights, tokens_axis], keepdims=1)
        return ops.op("Div", [total, ops.op("Max", [count, ops.const(np.float32(1e-9))])])
    if mode == "max":
        spread = ops.op("Unsqueeze", [mask, ops.const(np.array([2], np.int64))])
        kept = ops.op("Where", [spread, tokens, ops.const(np.float32(-np.inf))])
        return ops.op("ReduceMax", [kept], axes=[1], keepdims=0)
    if mode == "mean-max":
        pair = [_pooled(ops, "mean", tokens, mask), _pooled(ops, "max", tokens, mask)]
        return ops.op("Concat", pair, axis=-1)
    weights = ops.op("Cast", [mask], to=TensorProto.FLOAT)
    if mode == "mean-sqrt-len":
        total = _weighted_sum(ops, tokens, weights)
        count = ops.op("ReduceSum", [weights, ops.const(np.array([1], np.int64))], keepdims=1)
        return ops.op("Div", [total, ops.op("Sqrt", [ops.op("Max", [count, ops.const(np.float32(1e-9))])])])
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    ones = ops.op("ConstantOfShape", [ops.op("Shape", [weights])], value=one)
    places = ops.op("CumSum", [ones, ops.const(np.int64(1))])
    positions = ops.op("Mul", [weights, places])  # 1, 2, ... where the mask is
    if mode == "last-token":  # the one token at the last position
        last = ops.op("ReduceMax", [positions], axes=[1], keepdims=1)
        return _weighted_sum(
            ops, tokens, ops.op("Cast", [ops.op("Equal", [positions, last])], to=TensorProto.FLOAT)
        )
    assert mode == "weighted-mean", mode
    count = ops.op("ReduceSum", [positions, ops.const(np.array([1], np.int64))], keepdims=1)
    total = _weighted_sum(ops, tokens, positions)
    return ops.op("Div", [total, ops.op("Max", [count, ops.const(np.float32(1e-9))])])


def _weighted_sum(ops: _Appender, tokens: str, weights: str) -> str:
    """``[batch, sequence, width]`` tokens summed with ``[batch, sequence]`` weights."""
    spread = ops.op("Unsqueeze", [weights, ops.const(np.array([2], np.int64))])
    return ops.op(
        "ReduceSum", [ops.op("Mul", [tokens, spread]), ops.const(np.array([1], np.int64))], keepdims=0
    )


def _projected(ops: _Appender, strategy: Strategy, location: str, vectors: str) -> str:
    """The model folder's modules after pooling (``indexer.embedding.folder.Projection``)."""
    from indexer.embedding.folder import Projection

    for step in Projection(location, strategy.modules).steps:
        if step is None:
            vectors = _unit(ops, vectors)
            continue
        vectors = ops.op(
            "MatMul", [vectors, ops.const(np.ascontiguousarray(step.weight.T, dtype=np.float32))]
        )
        if step.bias is not None:
            vectors = ops.op("Add", [vectors, ops.const(step.bias.astype(np.float32))])
        if step.activation in ("tanh", "relu", "sigmoid"):
            vectors = ops.op(step.activation.capitalize(), [vectors])
        elif step.activation == "silu":
            vectors = ops.op("Mul", [vectors, ops.op("Sigmoid", [vectors])])
    return vectors


def _unit(ops: _Appender, vectors: str) -> str:
    """Rows divided by their length (at least 1e-12), as ``Head`` and ``Transform.apply`` do."""
    length = ops.op("ReduceL2", [vectors], axes=[1], keepdims=1)
    return ops.op("Div", [vectors, ops.op("Max", [length, ops.const(np.float32(1e-12))])])


def exportable(strategy: Strategy) -> None:
    """Refuse what one batched graph cannot reproduce: an onnx-int8 index's graph runs each text
    alone (dynamic quantisation's scales are taken over the whole input, padding included)."""
    if BACKEND_PRECISION[strategy.backend] == "int8":
        raise BadInput(
            "an onnx-int8 index runs each text alone (its vectors depend on the batch otherwise): "
            "only fp32 indexes (backend onnx or torch) can be exported"
        )


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
    exportable(strategy)
    model = _with_weights(spec)
    graph = model.graph
    ops = _Appender(graph)
    if "attention_mask" not in {i.name for i in graph.input}:  # a graph of layer 0 alone
        graph.input.append(_tokens_in("attention_mask"))
    if _wire_token_types(graph, ops):
        graph.input.append(_tokens_in("token_type_ids"))
    if strategy.pooling == "pooler":
        vectors = "pooler"
    else:
        states = [f"h{i % (num_layers + 1)}" for i in strategy.layers or (-1,)]
        tokens = _combined(ops, strategy, states)
        vectors = _pooled(ops, strategy.pooling, tokens, _pooling_mask(ops, strategy, special_ids))
    if strategy.modules:
        vectors = _projected(ops, strategy, spec.location, vectors)
    if strategy.dimensions is not None:  # the first ones, before normalising (``Head``)
        ends = [ops.const(np.array(v, dtype=np.int64)) for v in ([0], [strategy.dimensions], [1])]
        vectors = ops.op("Slice", [vectors, *ends])
    if strategy.normalize:
        vectors = _unit(ops, vectors)
    dimension = strategy.dimension(hidden_size)
    if transform is not None:
        vectors = ops.op("Sub", [vectors, ops.const(transform.mean.astype(np.float32))])
        if transform.matrix is not None:
            vectors = ops.op("MatMul", [vectors, ops.const(transform.matrix.astype(np.float32))])
            dimension = int(transform.matrix.shape[1])
        vectors = _unit(ops, vectors)
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
