"""An fp32 graph rewritten to int8 with an activation scale per token (``onnx-int8``): ONNX and
NumPy only, no torch and no ONNX Runtime.

Every ``MatMul`` with a constant 2-D weight becomes: the input quantised row by row (one token's
hidden state, its own scale: ``max |x| / 127``, zero point 128, ``QuantizeLinear`` blocked over the
whole row), ``MatMulInteger`` against int8 weights with a scale per output column, and the int32
result scaled back (``DequantizeLinear`` by the row's scale, then ``Mul`` by the columns'). ONNX
Runtime's fused ``Attention`` keeps its QKV projection in fp32, so it is first split into that
projection (a ``MatMul``, then quantised like the others) and ``MultiHeadAttention``.

Why per token: a token's quantised values then depend on that token alone, so a text's vector is
the same alone, in a batch or beside padding (the integer products are exact), and texts run in
padded batches like fp32's. ``quantize_dynamic``'s one scale per input tensor made a text's vector
depend on its batch, so ``onnx-int8`` had to run one text a call (small products, a thread barrier
per operator per text, docs/profile-embed.md); a token's own scale is also closer than one shared
with every token of a batch (cosine to fp32 >= 0.99 here against 0.98 per tensor).

Why unsigned activations and signed weights (U8S8): it is what x86 int8 instructions multiply
(``vpdpbusd`` with VNNI; ``vpmaddubsw`` on AVX2) and what ONNX Runtime's MLAS packs constant
weights for; signed activations on x86 are shifted to unsigned inside MLAS anyway. Without VNNI,
``vpmaddubsw`` adds two products in 16 bits and can saturate; ``Int8Format.weight_max`` (the CPU's
format, ``indexer.embedding.graphs.int8_format``) says how wide the weights may be.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from indexer.embedding.graphs import PER_TOKEN

OPSET = 21
"""``QuantizeLinear`` / ``DequantizeLinear`` with ``block_size`` (a scale per token) need opset 21."""


def per_token_int8(model: onnx.ModelProto, weight_max: int = 127) -> onnx.ModelProto:
    """``model`` (an fp32 graph with its weights loaded) with its constant MatMuls in int8, weights
    within +-``weight_max`` (127: all of int8; 63: 7 bits, where the CPU's product can saturate)."""
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = max(opset.version, OPSET)
    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    made: dict[str, onnx.TensorProto] = {}

    def const(name: str, value: np.ndarray) -> str:
        made.setdefault(name, numpy_helper.from_array(np.asarray(value), name))
        return name

    zero, axis = const("q8_zero_point", np.uint8(128)), const("q8_last_axis", np.array([-1], dtype=np.int64))
    top, floor = const("q8_127", np.float32(127.0)), const("q8_floor", np.float32(1e-12))
    nodes: list[onnx.NodeProto] = []
    rows: dict[str, tuple[str, str]] = {}  # an input already quantised: its int8 rows and scales
    for node in _unfused_attention(graph.node, weights, const):
        weight = weights.get(node.input[1]) if node.op_type == "MatMul" else None
        if weight is None or len(weight.dims) != 2:
            nodes.append(node)
            continue
        x, out = node.input[0], node.output[0]
        w = numpy_helper.to_array(weight).astype(np.float32)
        scale = np.maximum(np.abs(w).max(axis=0), 1e-12) / weight_max
        quantised = np.clip(np.round(w / scale), -weight_max, weight_max).astype(np.int8)
        w_int8 = const(f"{weight.name}.q8", quantised)
        w_scale = const(f"{weight.name}.q8_scale", scale.astype(np.float32))
        if x not in rows:
            p = f"q8/{x}/"
            nodes += [
                helper.make_node("ReduceMax", [x, axis], [p + "max"], keepdims=1),
                helper.make_node("ReduceMin", [x, axis], [p + "min"], keepdims=1),
                helper.make_node("Neg", [p + "min"], [p + "-min"]),
                helper.make_node("Max", [p + "max", p + "-min", floor], [p + "absmax"]),
                helper.make_node("Div", [p + "absmax", top], [p + "scale"]),
                helper.make_node("Shape", [p + "scale"], [p + "shape"]),
                helper.make_node("Expand", [zero, p + "shape"], [p + "zero"]),
                helper.make_node(
                    "QuantizeLinear", [x, p + "scale", p + "zero"], [p + "u8"], axis=-1, block_size=w.shape[0]
                ),
            ]
            rows[x] = (p + "u8", p + "scale")
        u8, row_scale = rows[x]
        p = f"q8/{out}/"
        nodes += [
            helper.make_node("MatMulInteger", [u8, w_int8, zero], [p + "i32"]),
            helper.make_node(
                "DequantizeLinear", [p + "i32", row_scale], [p + "rows"], axis=-1, block_size=w.shape[1]
            ),
            helper.make_node("Mul", [p + "rows", w_scale], [out]),
        ]
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in graph.node for name in node.input}
    kept = [t for t in graph.initializer if t.name in used] + [t for t in made.values() if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    props = {prop.key: prop.value for prop in model.metadata_props}
    helper.set_model_props(model, {**props, **PER_TOKEN})
    return model


def _unfused_attention(nodes, weights, const):  # noqa: ANN001, ANN202 - onnx protobuf containers
    """The nodes, each fused ``Attention`` (input, QKV weight, QKV bias, mask index) replaced by its
    QKV projection as a ``MatMul`` (which the caller quantises), the bias added, the three parts
    split and ``MultiHeadAttention`` over them with the same mask: the same attention in fp32."""
    for node in nodes:
        if node.op_type != "Attention" or node.domain != "com.microsoft" or len(node.input) != 4:
            yield node
            continue
        x, w, bias, mask = node.input
        heads = next(helper.get_attribute_value(a) for a in node.attribute if a.name == "num_heads")
        width = weights[w].dims[1] // 3
        p = f"q8/{node.output[0]}/"
        sizes = const(f"q8_split_{width}", np.array([width] * 3, dtype=np.int64))
        yield helper.make_node("MatMul", [x, w], [p + "qkv"])
        yield helper.make_node("Add", [p + "qkv", bias], [p + "qkv+bias"])
        yield helper.make_node("Split", [p + "qkv+bias", sizes], [p + "q", p + "k", p + "v"], axis=-1)
        yield helper.make_node(
            "MultiHeadAttention",
            [p + "q", p + "k", p + "v", "", mask],
            list(node.output),
            domain="com.microsoft",
            num_heads=heads,
        )
