"""``semsearch export-encoder``: an index's query encoder as files other programs load, namely one
ONNX model from token ids to the index's final vectors (``indexer.encoders.standalone``), its
``tokenizer.json`` (truncating at the index's ``max_length``) and a README of inputs and outputs.
The directory is written beside its target and moved in whole (``indexer.files``):
never half an export."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from indexer.embedding.models import config_shape, model_file, read_json
from indexer.errors import BadInput
from indexer.files import staged_dir

if TYPE_CHECKING:
    from indexer.embedding.graphs import GraphSpec
    from indexer.store import StoredIndex

MARKER = "semsearch-encoder.json"
"""What an export says about itself; a directory holding it may be exported over."""
COPIED = ("config.json", "tokenizer_config.json", "special_tokens_map.json")
"""Model files copied as they are (loaders that read a Hugging Face layout want them)."""


@dataclass(frozen=True)
class EncoderExport:
    directory: Path
    dimension: int
    inputs: list[str]
    files: list[str]
    size_bytes: int


def export_encoder(index_dir: str | Path, target: str | Path) -> EncoderExport:
    """Export ``index_dir``'s query encoder into the directory ``target`` (created, or replaced
    if it holds an earlier export; anything else there is refused)."""
    from indexer.encoders.standalone import save, standalone
    from indexer.encoders.tokens import TextTokenizer
    from indexer.store import open_index

    target = Path(target)
    _check_target(target)
    index = open_index(index_dir, vectors=False)
    index.catalog.close()
    strategy = index.strategy
    spec = _graph(index)
    config = read_json(model_file(spec.location, "config.json")) or {}
    num_layers, hidden_size = config_shape(config) or (0, 0)
    tokens = TextTokenizer.from_files(spec.location, strategy)
    model, dimension, inputs = standalone(
        spec,
        strategy,
        num_layers=num_layers,
        hidden_size=hidden_size,
        special_ids=tokens.special_ids,
        transform=index.transform,
    )
    with staged_dir(target, _check_target) as made:
        files = save(model, made / "model.onnx")
        (made / "tokenizer.json").write_text(tokens.truncating.to_str(), encoding="utf-8")
        files.append("tokenizer.json")
        for name in COPIED:
            found = model_file(spec.location, name)
            if found is not None:
                shutil.copyfile(found, made / name)
                files.append(name)
        facts = {
            "index": str(Path(index_dir).resolve()),
            "version": index.version.name,
            "strategy": strategy.to_dict(),
            "description": strategy.describe(),
            "postprocess": strategy.postprocess,
            "dimension": dimension,
            "inputs": inputs,
            "output": "sentence_embedding",
            "max_length": strategy.max_length,
            "pad_id": tokens.pad,
            "query_prefix": strategy.query_prefix,
            "passage_prefix": strategy.passage_prefix,
        }
        (made / MARKER).write_text(json.dumps(facts, indent=2) + "\n", encoding="utf-8")
        (made / "README.md").write_text(_readme(facts), encoding="utf-8")
        files += [MARKER, "README.md"]
    size = sum((target / name).stat().st_size for name in files)
    return EncoderExport(target, dimension, inputs, files, size)


def _check_target(target: Path) -> None:
    if target.exists() and not target.is_dir():
        raise BadInput(f"{target} exists and is not a directory")
    if target.is_dir() and any(target.iterdir()) and not (target / MARKER).is_file():
        raise BadInput(f"{target} is not empty and holds no exported encoder: refusing to overwrite it")


def _graph(index: StoredIndex) -> GraphSpec:
    """The graph of the index's queries: the one it holds, else the cache's, else exported now
    (an index written before indexes held their graph; that needs torch)."""
    from indexer.embedding.graphs import graph_spec
    from indexer.encoders.factory import encoder_for
    from indexer.encoders.options import EmbeddingOptions
    from indexer.store.held import intact

    held = index.graph
    if held is not None and held.exported:
        return held
    spec = graph_spec(index.strategy)
    if not intact(spec):  # absent, or its files no longer the ones exported: exported (again) now
        on_cpu = EmbeddingOptions(device="cpu")  # what the graph runs on: exported from the CPU model
        failure = encoder_for(index.strategy, on_cpu, queries=True).decision.export_failure
        if failure is not None:
            raise BadInput(f"this index's model cannot be exported to ONNX ({failure})")
    return spec


def _readme(facts: dict) -> str:
    inputs = ", ".join(f"`{name}`" for name in facts["inputs"])
    unit = facts["strategy"]["normalize"] or facts["postprocess"] != "none"
    length = "unit length" if unit else "not normalised (the index's strategy says no-normalize)"
    types = (
        "\n- `token_type_ids`: all zeros for one text (the segment the index's vectors were made with)."
        if "token_type_ids" in facts["inputs"]
        else ""
    )
    queries, passages = facts["query_prefix"], facts["passage_prefix"]
    prefixes = (
        f"""
## Prefixes

A graph cannot prepend text: put `{queries!r}` before each query and `{passages!r}` before each
text you index with these vectors, before tokenising, as the index did (its strategy's
`query_prefix` and `passage_prefix`).
"""
        if queries or passages
        else ""
    )
    texts = '["How do I get a refund?", "Where can I park?"]'
    asked = f"[{queries!r} + text for text in {texts}]" if queries else texts
    return f"""# Sentence encoder exported by semsearch

The query encoder of the index `{facts["index"]}` (version `{facts["version"]}`):
{facts["description"]}.

`model.onnx` maps token ids to the vector that index compares: the layers, their combination,
the pooling over the padding mask, the normalisation and the fitted post-processing
(`{facts["postprocess"]}`) are all inside the graph. It uses ONNX Runtime's fused BERT operators:
run it on ONNX Runtime (Vespa, OpenSearch, Qdrant's FastEmbed and Triton's onnxruntime backend do).

## Inputs ({inputs})

- `input_ids`: int64 `[batch, sequence]`, from `tokenizer.json` (it truncates at
  {facts["max_length"]} tokens; pad the batch with id {facts["pad_id"]}).
- `attention_mask`: int64 `[batch, sequence]`, 1 for tokens, 0 for padding.{types}
{prefixes}
## Output

- `sentence_embedding`: float32 `[batch, {facts["dimension"]}]`, {length}; the index compares
  them by cosine.

## Use

```python
import numpy as np, onnxruntime
from tokenizers import Tokenizer

tokenizer = Tokenizer.from_file("tokenizer.json")
tokenizer.enable_padding(pad_id={facts["pad_id"]})
session = onnxruntime.InferenceSession("model.onnx")
batch = tokenizer.encode_batch({asked})
feed = {{
    "input_ids": np.array([e.ids for e in batch], dtype=np.int64),
    "attention_mask": np.array([e.attention_mask for e in batch], dtype=np.int64),
}}
if "token_type_ids" in {{i.name for i in session.get_inputs()}}:
    feed["token_type_ids"] = np.zeros_like(feed["input_ids"])
vectors = session.run(["sentence_embedding"], feed)[0]
```

`{MARKER}` holds the same facts (and the full strategy) as JSON.
"""
