"""ONNX Runtime inference for the Embedder (the ``onnx`` extra): the same network, exported once
with exactly the hidden states the strategy reads, optionally int8-quantised.

``onnx`` matches torch fp32 (same vectors to float error); ``onnx-int8`` fuses attention and
quantises the weights
(dynamic int8 MatMuls): about 1.6x the speed on a CPU for a measured, small quality loss (see
``bench/embed.py``). Its activations are quantised per batch, so a vector also depends a little on
the batch it was embedded in (cosine ~0.99 to itself embedded alone).

Exports are cached under ``$SEMSEARCH_CACHE`` (default ``~/.cache/semsearch``), keyed by model,
layers and backend, and written atomically.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from indexer.errors import BadInput
from indexer.models import cache_root
from indexer.network import NetworkOutput


def cache_dir() -> Path:
    return cache_root() / "onnx"


class _Outputs(torch.nn.Module):
    """The network with the chosen hidden states (and the pooler output) as plain outputs."""

    def __init__(self, network: torch.nn.Module, layers: Sequence[int], pooler: bool):
        super().__init__()
        self.network, self.layers, self.pooler = network, list(layers), pooler

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.network(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        states = tuple(out.hidden_states[i] for i in self.layers)
        return (*states, out.pooler_output) if self.pooler else states


def _key(location: str, layers: Sequence[int], pooler: bool, backend: str, hidden: int, heads: int) -> str:
    weights = sorted(Path(location).glob("*.safetensors")) + sorted(Path(location).glob("*.bin"))
    stamp = [f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in weights]
    text = repr(
        (
            str(Path(location).resolve()),
            stamp,
            list(layers),
            pooler,
            backend,
            hidden,
            heads,
            torch.__version__,
        )
    )
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _export(
    network: torch.nn.Module, layers: Sequence[int], pooler: bool, backend: str, target: Path
) -> None:
    try:
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic
        from onnxruntime.transformers import optimizer
    except ImportError:
        raise BadInput("the onnx backends need the 'onnx' extra: pip install 'semsearch[onnx]'") from None
    import tempfile
    import warnings

    config = network.config
    names = [f"h{i}" for i in layers] + (["pooler"] if pooler else [])
    ids = torch.tensor([[101, 7592, 2088, 102], [101, 7592, 102, 0]])
    axes = {"input_ids": {0: "batch", 1: "tokens"}, "attention_mask": {0: "batch", 1: "tokens"}}
    axes.update({n: {0: "batch", 1: "tokens"} for n in names if n != "pooler"})
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain, fused = Path(tmp) / "plain.onnx", Path(tmp) / "fused.onnx"
        torch.onnx.export(
            _Outputs(network, layers, pooler).eval(),
            (ids, (ids > 0).long()),
            str(plain),
            input_names=["input_ids", "attention_mask"],
            output_names=names,
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )
        model = optimizer.optimize_model(
            str(plain),
            model_type="bert",
            num_heads=config.num_attention_heads,
            hidden_size=config.hidden_size,
            opt_level=1,
        )
        model.save_model_to_file(str(fused))
        result = Path(tmp) / "final.onnx"
        if backend == "onnx-int8":
            quantize_dynamic(
                str(fused),
                str(result),
                weight_type=QuantType.QInt8,
                extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
            )
        else:
            fused.replace(result)
        os.replace(result, target)


class OnnxNetwork:
    """A ``Network`` on ONNX Runtime: ``hidden_states[i]`` for the exported layers and the pooler
    output. ``network`` is the (cut) torch model, exported on first use."""

    def __init__(
        self, network: torch.nn.Module, location: str, layers: Sequence[int], pooler: bool, backend: str
    ):
        import onnxruntime

        config = network.config
        self.layers = sorted(set(layers))
        self.pooler = pooler
        key = _key(location, self.layers, pooler, backend, config.hidden_size, config.num_attention_heads)
        path = cache_dir() / f"{key}.onnx"
        if not path.is_file():
            _export(network, self.layers, pooler, backend, path)
        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = torch.get_num_threads()
        options.log_severity_level = 3
        self.session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def __call__(self, input_ids: torch.Tensor, attention: torch.Tensor) -> NetworkOutput:
        outputs = self.session.run(
            None,
            {
                "input_ids": input_ids.numpy().astype(np.int64),
                "attention_mask": attention.numpy().astype(np.int64),
            },
        )
        states = {layer: torch.from_numpy(out) for layer, out in zip(self.layers, outputs, strict=False)}
        pooler = torch.from_numpy(outputs[-1]) if self.pooler else None
        return NetworkOutput(states, pooler)
