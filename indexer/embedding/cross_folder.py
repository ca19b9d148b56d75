"""A cross-encoder (reranker) folder read as its authors saved it, without loading its weights:
what sentence-transformers' ``CrossEncoder(path)`` would run, so semsearch's scores equal its
``predict``.

The formats a reranker comes in:

- **sentence-transformers 6 and later** (``CrossEncoder.save``): ``modules.json`` lists one
  ``Transformer`` module at the folder's root, whose ``sentence_bert_config.json`` says
  ``transformer_task: sequence-classification`` (and may say ``max_seq_length``, ``do_lower_case``,
  ``processor_kwargs.model_max_length``, ``processing_kwargs.text.max_length``);
  ``config_sentence_transformers.json`` says ``model_type: CrossEncoder``, the ``activation_fn``
  (a dotted ``torch.`` class) and the prompts (``default_prompt_name``: its prompt is put before
  the question of each pair).
- **before** (sentence-transformers 4 and 5): no ``modules.json``; ``config.json``'s
  ``sentence_transformers.activation_fn`` (before 4: ``sbert_ce_default_activation_function``).
- **a plain transformers folder** of a ``*ForSequenceClassification`` network: nothing said; one
  label gets ``Sigmoid``, as ``CrossEncoder`` gives it.

The length is ``CrossEncoder``'s: the tokenizer's ``model_max_length`` capped at the network's
``max_position_embeddings``, unless the module's settings name one (then uncapped, as
sentence-transformers sets it). A folder is refused in one line (``BadInput``) where it is no model
folder, is not a one-label sequence classifier, has a tokenizer that cannot take pairs, or fails the
checks every model folder passes (``indexer.embedding.models.check_model``: its sizes against its
weights, JSON it cannot read, links that lead nowhere, code of its own).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from indexer.embedding import graphs
from indexer.embedding.graphs import GraphSpec
from indexer.embedding.hub import fetched, hub_name
from indexer.embedding.model_files import inside, model_file, model_json
from indexer.embedding.models import (
    ENCODERS,
    TOKENIZER_FILES,
    check_model,
    model_fingerprint,
    model_location,
    unloadable,
    weight_files,
)
from indexer.embedding.modules.base import torch_named
from indexer.errors import BadInput

ACTIVATIONS = {"Sigmoid": "sigmoid", "Identity": "identity", "Tanh": "tanh"}
"""``CrossEncoder``'s activation (the torch class its folder names) -> what the reranker applies."""
NAMED = torch_named(ACTIVATIONS)
"""The activations by the exact names a folder may give them."""
SETTINGS = ("modules.json", "config_sentence_transformers.json", "sentence_bert_config.json")
"""The sentence-transformers files that change a reranker's scores beside its network."""
CROSS_ENCODER = "CrossEncoder"
SEQUENCE_CLASSIFICATION = "sequence-classification"
NO_LIMIT = 10**20
"""A tokenizer's ``model_max_length`` at or past this is transformers' "no limit" (10**30)."""
CLASSIFIER_RECIPE = 1
"""Bumped when ``indexer.encoders.cross_export`` exports a classifier differently."""


@dataclass(frozen=True)
class CrossFolder:
    """What a reranker folder says: where it lies, its network, and how ``CrossEncoder`` reads it."""

    path: str
    """The folder (absolute; a cached hub model's snapshot)."""
    architecture: str
    """The network's class, e.g. ``BertForSequenceClassification``."""
    model_type: str
    activation: str
    """``sigmoid``, ``identity`` or ``tanh``: what ``CrossEncoder.predict`` applies to the logit."""
    max_length: int | None
    """Pairs are truncated to this many tokens, longest text first (None: not truncated)."""
    fingerprint: str
    """``sha256:...`` of the network's files and the sentence-transformers settings."""
    lowercase: bool = False
    prompt: str = ""
    """Put before the question of each pair (the folder's default prompt)."""
    format: str = "transformers"
    """``sentence-transformers``, ``sentence-transformers before 6`` or ``transformers``."""
    weight: float = 1.0
    """A reranked hit's score is ``weight x`` the reranker's ``+ (1 - weight) x`` the first stage's:
    1 (the reranker alone) unless ``semsearch tune`` fitted another on held-back questions
    (``fusion`` in its ``semsearch.json``; 0 where the reranker did not beat the first stage)."""
    name: str = ""
    """The Hugging Face name at its commit (``NAME@COMMIT``) where taken by name; "" for a folder."""

    def stored(self) -> dict[str, str]:
        """What an index keeps of it as its default reranker: the folder, the files' identity and
        (taken by name) the name that fetches the same files again where the folder is gone."""
        named = {"name": self.name} if self.name else {}
        return {"path": self.path, "fingerprint": self.fingerprint, **named}

    def describe(self) -> str:
        """One line: what the folder said (``semsearch rerank`` and the docs show it)."""
        said = [self.architecture, self.activation, f"max_length={self.max_length}", self.format]
        if self.lowercase:
            said.append("lowercase")
        if self.prompt:
            said.append(f"prompt {self.prompt!r}")
        if self.weight != 1.0:
            said.append(f"fused with the first stage at weight {self.weight:g}")
        return " ".join(said)


def read_cross_folder(model: str | Path) -> CrossFolder:
    """The reranker at ``model`` (a folder, or a hub name in the Hugging Face cache), checked and
    read as ``CrossEncoder`` reads it; refused in one line otherwise (see the module doc)."""
    name = str(model)
    snapshot = fetched(name) if hub_name(name) is not None else None  # the cache first, else the Hub
    location = model_location(name) if snapshot is None else snapshot.folder
    if model_file(location, "config.json") is None:
        raise unloadable(name, location, FileNotFoundError("config.json"))
    config = check_model(name, location) or {}
    root = model_file(location, "config.json").parent.resolve()  # type: ignore[union-attr]
    architecture = _architecture(name, config)
    if not weight_files(location):
        raise BadInput(f"{name}: no weights there (model.safetensors or pytorch_model.bin)")
    for file in TOKENIZER_FILES:
        model_json(model_file(location, file))
    _check_pairs(name, location)
    modules = model_json(model_file(location, "modules.json"))
    saved = _object(model_json(model_file(location, "config_sentence_transformers.json")))
    current = modules is not None and saved.get("model_type") == CROSS_ENCODER
    settings: dict[str, Any] = {}
    if current:
        _check_modules(name, modules)
        settings = _object(model_json(model_file(location, "sentence_bert_config.json")))
        _check_settings(name, settings)
    activation = _activation(name, saved.get("activation_fn") if current else None, config)
    prompts = saved.get("prompts") if current else None
    prompt = ""
    if isinstance(prompts, dict) and saved.get("default_prompt_name"):
        prompt = str(prompts.get(saved["default_prompt_name"]) or "")
    legacy = "sentence_transformers" in config or "sbert_ce_default_activation_function" in config
    saved_as = "sentence-transformers" if current else "sentence-transformers before 6" if legacy else ""
    return CrossFolder(
        path=str(root),
        architecture=architecture,
        model_type=str(config.get("model_type")),
        activation=activation,
        max_length=_max_length(name, location, config, settings),
        fingerprint=_fingerprint(root, weight := fusion_weight(name, root)),
        lowercase=bool(settings.get("do_lower_case")),
        prompt=prompt,
        format=saved_as or "transformers",
        weight=weight,
        name="" if snapshot is None else snapshot.pinned,
    )


def fusion_weight(name: str, root: Path) -> float:
    """The fused weight ``semsearch tune`` stored in the folder's ``semsearch.json`` (1 where none is)."""
    said = model_json(model_file(str(root), "semsearch.json"))
    fusion = said.get("fusion") if isinstance(said, dict) else None
    if not isinstance(fusion, dict) or "weight" not in fusion:
        return 1.0
    weight = fusion["weight"]
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 <= weight <= 1:
        raise BadInput(f"{name}: semsearch.json's fusion weight must be a number from 0 to 1, not {weight!r}")
    return float(weight)


def cross_graph(folder: CrossFolder, *, int8: bool = False) -> GraphSpec:
    """The exported graph of the folder's classifier (its logits), in the cache the bi-encoders'
    graphs lie in, keyed by the network's files (``GraphSpec.key``) and the classifier recipe;
    ``int8``: that graph rewritten to int8, keyed also by this CPU's int8 format and the int8
    recipe, as a sentence encoder's ``onnx-int8`` graph is."""
    backend = f"onnx-classifier-{CLASSIFIER_RECIPE}"
    if int8:
        return GraphSpec(folder.path, (), False, backend + "-int8", int8=graphs.int8_format().name)
    return GraphSpec(folder.path, (), False, backend)


def _object(read: Any) -> dict[str, Any]:
    return read if isinstance(read, dict) else {}


def _architecture(name: str, config: dict[str, Any]) -> str:
    """The network's one-label sequence-classification class, or a one-line refusal."""
    found = config.get("architectures")
    architecture = str(found[0]) if isinstance(found, list) and found else ""
    if not architecture.endswith("ForSequenceClassification"):
        what = architecture or "no architecture in its config.json"
        raise BadInput(
            f"{name} is not a reranker: its network is {what}, not a *ForSequenceClassification "
            "one (a cross-encoder scores a pair with a classifier head)"
        )
    kind = str(config.get("model_type"))
    if kind not in ENCODERS:
        raise BadInput(
            f"{name} is a {kind} classifier; semsearch reads rerankers of the encoder architectures "
            f"({', '.join(ENCODERS)})"
        )
    labels = config.get("id2label")
    count = len(labels) if isinstance(labels, dict) else config.get("num_labels", 2)
    if count != 1:
        raise BadInput(f"{name}: a reranker gives one score per pair; this folder has {count} labels")
    return architecture


def _check_pairs(name: str, location: str) -> None:
    """The tokenizer must put something between a pair's two texts (a separator), or the network
    cannot tell the question from the text."""
    from tokenizers import Tokenizer

    file = model_file(location, "tokenizer.json")
    if file is None:
        raise BadInput(f"{name} has no tokenizer.json (a fast tokenizer): not supported")
    try:
        processor = Tokenizer.from_file(str(file)).post_processor
    except Exception as exc:  # noqa: BLE001 - tokenizers raises its own Exception for a bad file
        raise BadInput(f"{file} is not a tokenizer semsearch can read ({str(exc)[:80]})") from None
    separated = processor is not None and (
        processor.num_special_tokens_to_add(True) > processor.num_special_tokens_to_add(False)
    )
    if not separated:
        raise BadInput(
            f"{name}: its tokenizer ({file.name}) cannot take pairs: it puts nothing between two texts"
        )


def _check_modules(name: str, modules: Any) -> None:
    """A ``CrossEncoder`` folder's modules: its one Transformer at the folder's root."""
    if not isinstance(modules, list) or not modules:
        raise BadInput(f"{name}: its modules.json lists no modules")
    for module in modules:
        kind = str(module.get("type", "")) if isinstance(module, dict) else ""
        path = str(module.get("path", "")) if isinstance(module, dict) else ""
        if path and not inside(path):
            raise BadInput(
                f"{name}: its modules.json puts module {kind} at {path!r}, outside the model folder"
            )
    first = modules[0] if isinstance(modules[0], dict) else {}
    kind = str(first.get("type", ""))
    transformer = kind.startswith("sentence_transformers.") and kind.endswith(".Transformer")
    if len(modules) != 1 or not transformer:
        listed = ", ".join(str(m.get("type", m)) if isinstance(m, dict) else str(m) for m in modules)
        raise BadInput(
            f"{name}: its modules ({listed[:120]}) are not one Transformer, which semsearch cannot reproduce"
        )
    if first.get("path", ""):
        raise BadInput(f"{name}: its Transformer module lies in {first['path']}/: give that folder")


def _check_settings(name: str, settings: dict[str, Any]) -> None:
    """The Transformer module's settings semsearch reproduces; any other is refused, naming it."""
    task = settings.get("transformer_task", "feature-extraction")
    if task != SEQUENCE_CLASSIFICATION:
        raise BadInput(
            f"{name}: its sentence_bert_config.json says transformer_task {task!r}, not a classifier"
        )
    processing = settings.get("processing_kwargs") or {}
    text = processing.get("text", {}) if isinstance(processing, dict) else None
    if not isinstance(text, dict) or set(processing) - {"text"} or set(text) - {"max_length"}:
        said = json.dumps(processing)[:80]
        raise BadInput(f"{name}: its sentence_bert_config.json processing_kwargs {said} are not reproduced")


def _activation(name: str, said: Any, config: dict[str, Any]) -> str:
    """The activation ``CrossEncoder`` applies: the settings' ``activation_fn``, else
    ``config.json``'s (``sentence_transformers.activation_fn``, before that
    ``sbert_ce_default_activation_function``), else ``Sigmoid`` (one label). One not of torch is
    code of the folder's own, which semsearch does not run."""
    legacy = config.get("sentence_transformers")
    for path in (
        said,
        legacy.get("activation_fn") if isinstance(legacy, dict) else None,
        config.get("sbert_ce_default_activation_function"),
    ):
        if path is None:
            continue
        path = str(path)
        if path in NAMED:
            return NAMED[path]
        if not path.startswith("torch."):
            raise BadInput(
                f"{name}: its activation {path[:80]!r} is code of its own, which semsearch does not run"
            )
        known = ", ".join(n for n in NAMED if n.count(".") > 2)
        raise BadInput(f"{name}: its activation {path[:80]!r} is none semsearch applies ({known})")
    return "sigmoid"


def _max_length(name: str, location: str, config: dict[str, Any], settings: dict[str, Any]) -> int | None:
    """How many tokens a pair keeps, as ``CrossEncoder`` truncates (see the module doc). A length
    the settings name past the network's positions is refused: every longer pair would fail."""
    processor = settings.get("processor_kwargs") or settings.get("tokenizer_args") or {}
    explicit = processor.get("model_max_length") if isinstance(processor, dict) else None
    if explicit is None:
        explicit = settings.get("max_seq_length")
    positions = config.get("max_position_embeddings")
    if isinstance(explicit, int) and explicit > 0:
        limit: int | None = explicit
    else:
        said = _object(model_json(model_file(location, "tokenizer_config.json"))).get("model_max_length")
        limit = said if isinstance(said, int) and 0 < said < NO_LIMIT else None
        if isinstance(positions, int) and positions > 0:
            limit = positions if limit is None else min(limit, positions)
    per_call = ((settings.get("processing_kwargs") or {}).get("text") or {}).get("max_length")
    length = per_call if isinstance(per_call, int) and per_call > 0 else limit
    if length is not None and isinstance(positions, int) and 0 < positions < length:
        raise BadInput(
            f"{name}: its sentence_bert_config.json says a length of {length} tokens, past the "
            f"{positions} positions its network reads (max_position_embeddings): give it at most {positions}"
        )
    return length


def _fingerprint(root: Path, weight: float) -> str:
    """The network's fingerprint (``model_fingerprint``) with the sentence-transformers settings'
    bytes and a fused ``weight`` other than 1: another activation, length or weight is another
    reranker (another score, another no-answer rule)."""
    digest = hashlib.sha256(model_fingerprint(root).encode())
    if weight != 1.0:
        digest.update(f"fusion weight\0{weight!r}".encode())
    for name in SETTINGS:
        file = root / name
        if file.is_file():
            digest.update(f"{name}\0".encode() + file.read_bytes())
    return "sha256:" + digest.hexdigest()
