"""Training a cross-encoder (a reranker) on labels (``semsearch tune --cross-encoder``).

A cross-encoder reads a question and a text together and gives one logit; its score is the
logit's sigmoid. This module is the torch side: loading the network (a one-label
``*ForSequenceClassification``: the bundled BertModel gets a new head, an existing cross-encoder
continues), scoring pairs, the loss sentence-transformers' ``CrossEncoderTrainer`` uses for one
label (``BinaryCrossEntropyLoss``: soft targets for scored pairs, 1/0 with ``pos_weight`` for a
question, its right entry and its mined hard negatives), the loop with early stopping on a
held-back metric (``training.Budget`` / ``Schedule`` / ``Outcome``, as the bi-encoder's), and the
saved folder in sentence-transformers' current CrossEncoder layout, written here so that
sentence-transformers stays a development dependency. Labels, hard negatives and metrics are
``search.studies.tuning``'s (no torch there).
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from indexer.embedding.cross_folder import read_cross_folder
from indexer.embedding.model_files import model_file, model_json
from indexer.embedding.models import _quiet_transformers, check_model, model_location, unloadable
from indexer.embedding.strategy import DEFAULT_MODEL
from indexer.encoders.pipeline import DTYPES
from indexer.encoders.training import Budget, Outcome, train_loop
from indexer.errors import BadInput

SIGMOID = "torch.nn.modules.activation.Sigmoid"
"""The activation sentence-transformers' CrossEncoder applies to one logit (its name as saved)."""
SCORING_BATCH = 32
"""Pairs per forward pass when scoring (no gradient)."""
CLASSIFIER = "ForSequenceClassification"


@dataclass(frozen=True)
class PairRows:
    """Training rows: ``(first[i], second[i])`` should score ``targets[i]`` (in [0, 1]).
    ``positive_weight``: BCE's ``pos_weight``, the negatives per positive where hard negatives
    were mined (so a question's right entry weighs as much as its wrong ones together)."""

    first: list[str]
    second: list[str]
    targets: list[float]
    positive_weight: float = 1.0

    def __len__(self) -> int:
        return len(self.first)


PairScorer = Callable[[Sequence[tuple[str, str]]], np.ndarray]
"""Scores (after the sigmoid) of pairs, one per pair."""
CrossMeasure = Callable[[PairScorer], float]
"""Held-back metric (higher is better) of a pair scorer."""


@dataclass
class CrossModel:
    """A one-label sequence classifier and its tokenizer, on its device. ``continued``: the
    folder already was a cross-encoder (its head trains on), else the head is new."""

    network: Any
    tokenizer: Any
    max_length: int
    source: str
    continued: bool
    mixed: str = "fp32"
    """``bf16``/``fp16``: the forward pass autocast on a GPU (weights stay fp32)."""

    @property
    def device(self) -> torch.device:
        return next(self.network.parameters()).device

    def logits(self, first: Sequence[str], second: Sequence[str]) -> torch.Tensor:
        """One logit per pair, tokenised as CrossEncoder does (the pair together, truncated
        ``longest_first`` to ``max_length``)."""
        batch = self.tokenizer(
            list(first),
            list(second),
            padding=True,
            truncation="longest_first",
            max_length=self.max_length,
            return_tensors="pt",
        )
        batch = {key: value.to(self.device) for key, value in batch.items()}
        half = self.mixed in ("bf16", "fp16") and self.device.type == "cuda"
        with torch.autocast("cuda", dtype=DTYPES.get(self.mixed, torch.float32), enabled=half):
            return self.network(**batch, return_dict=True).logits.view(-1).float()

    def scores(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """Sigmoid of each pair's logit (``CrossEncoder.predict``'s default), in eval mode, without
        a gradient; pairs of like length share a pass."""
        order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))
        out = np.empty(len(pairs), dtype=np.float32)
        self.network.eval()
        with torch.inference_mode():
            for start in range(0, len(order), SCORING_BATCH):
                rows = order[start : start + SCORING_BATCH]
                logits = self.logits([pairs[i][0] for i in rows], [pairs[i][1] for i in rows])
                out[rows] = torch.sigmoid(logits).cpu().numpy()
        return out


def load_cross(
    model: str | None = None,
    max_length: int | None = None,
    device: str = "cpu",
    mixed: str = "fp32",
    seed: int = 0,
) -> CrossModel:
    """The network to train, from disk only: a one-label cross-encoder folder as it is, or an
    encoder (the bundled model by default) with a new one-label head. ``max_length``: the pair's
    tokens (default: the tokenizer's limit, at most the model's positions). ``seed``: a new
    head's initial weights."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    _quiet_transformers()
    model = model or DEFAULT_MODEL
    location = model_location(model, download=True)
    config = check_model(model, location)
    if config is None:
        raise unloadable(model, location, FileNotFoundError("config.json"))
    continued = any(str(a).endswith(CLASSIFIER) for a in config.get("architectures") or [])
    said: int | None = None
    if continued:  # a reranker already: the reader's checks (one label, a pair tokenizer, its files)
        folder = read_cross_folder(model)
        if folder.prompt or folder.lowercase:
            raise BadInput(
                f"model {model!r} puts a prompt before each question or lower-cases its input: "
                "training it on is not supported"
            )
        said = folder.max_length
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        model_json(model_file(location, name))  # transformers reads them unguarded
    torch.manual_seed(seed)
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, local_files_only=True)
        network = AutoModelForSequenceClassification.from_pretrained(
            location, num_labels=1, local_files_only=True
        )
    except (OSError, ValueError, KeyError) as exc:
        raise unloadable(model, location, exc) from None
    except (RuntimeError, pickle.UnpicklingError):  # sizes at odds with config.json, or more than tensors
        raise BadInput(
            f"cannot load model {model!r}: its weights do not load as a network of its config.json"
        ) from None
    if not getattr(tokenizer, "is_fast", False):
        raise BadInput(f"model {model!r} has no fast tokenizer (tokenizer.json); not supported")
    positions = int(config.get("max_position_embeddings") or 512)
    limit = min(positions, int(min(tokenizer.model_max_length, 10**6)))
    if max_length is not None and not 1 < max_length <= positions:
        raise BadInput(f"--max-length {max_length}: model {model!r} reads pairs of 2 to {positions} tokens")
    network.to(device)
    return CrossModel(network, tokenizer, max_length or said or limit, model, continued, mixed)


def bce_loss(logits: torch.Tensor, targets: torch.Tensor, positive_weight: float = 1.0) -> torch.Tensor:
    """sentence-transformers' ``BinaryCrossEntropyLoss`` on raw logits (``BCEWithLogitsLoss``)."""
    weight = None if positive_weight == 1.0 else torch.tensor(positive_weight, device=logits.device)
    return torch.nn.functional.binary_cross_entropy_with_logits(logits, targets, pos_weight=weight)


def fine_tune_cross(
    cross: CrossModel,
    rows: PairRows,
    measure: CrossMeasure,
    budget: Budget,
    *,
    progress: bool = False,
    report: Callable[[str], object] = lambda line: None,
) -> Outcome:
    """Train ``cross`` in place on ``rows`` through ``tune``'s one loop (``training.train_loop``):
    binary cross-entropy of each pair's logit against its target, the best weights left loaded."""

    def loss_of(batch: Sequence[int]) -> torch.Tensor:
        logits = cross.logits([rows.first[i] for i in batch], [rows.second[i] for i in batch])
        targets = torch.tensor([rows.targets[i] for i in batch], device=logits.device)
        return bce_loss(logits, targets, rows.positive_weight)

    return train_loop(
        cross.network,
        len(rows),
        loss_of,
        lambda: measure(cross.scores),
        budget,
        scaled=cross.mixed == "fp16" and cross.device.type == "cuda",
        progress=progress,
        report=report,
    )


def save_cross(cross: CrossModel, staging: Path, facts: dict[str, Any]) -> None:
    """Write ``cross`` into ``staging`` (the directory that becomes the output whole) as
    sentence-transformers' ``CrossEncoder.save`` writes one label: the network and tokenizer
    (its ``model_max_length`` the trained length), ``config_sentence_transformers.json`` (model
    type CrossEncoder, Sigmoid activation), ``modules.json`` and ``sentence_bert_config.json``
    (one Transformer module read as a sequence classifier); and ``semsearch.json`` (``facts``:
    where it came from, the held-back metric)."""
    import transformers
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()
    network = cross.network.to("cpu")
    network.config.num_labels = 1
    network.save_pretrained(staging, safe_serialization=True)
    cross.tokenizer.model_max_length = cross.max_length
    cross.tokenizer.save_pretrained(staging)
    settings = {
        "__version__": {"pytorch": torch.__version__, "transformers": transformers.__version__},
        "activation_fn": SIGMOID,
        "default_prompt_name": None,
        "model_type": "CrossEncoder",
        "prompts": {},
    }
    modules = [
        {
            "idx": 0,
            "name": "0",
            "path": "",
            "type": "sentence_transformers.base.modules.transformer.Transformer",
        }
    ]
    module = {
        "transformer_task": "sequence-classification",
        "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}},
        "module_output_name": "scores",
    }
    for name, data in (
        ("config_sentence_transformers.json", settings),
        ("modules.json", modules),
        ("sentence_bert_config.json", module),
        ("semsearch.json", {"reranker": True, **facts}),
    ):
        (staging / name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
