"""Training a cross-encoder (a reranker) on labels (``semsearch tune --cross-encoder``).

A cross-encoder reads a question and a text together and gives one logit; its score is the
logit's sigmoid. This module is the torch side: loading the network (a one-label
``*ForSequenceClassification``: the bundled BertModel gets a new head, an existing cross-encoder
continues), scoring pairs, the loss sentence-transformers' ``CrossEncoderTrainer`` uses for one
label for scored pairs (``BinaryCrossEntropyLoss``: soft targets), and for a question, its right
entry and its negatives a listwise loss (``ranking_loss``: softmax cross-entropy of the right
entry against its negatives, as ``MultipleNegativesRankingLoss`` for cross-encoders, plus binary
cross-entropy of each logit so that the score stays an absolute one a no-answer rule can read;
``TEACHER_SHARE`` of a list's target is the first stage's order, and a new head trains faster),
the loop with early stopping on a held-back metric (``training.Budget`` / ``Schedule`` /
``Outcome``, as the bi-encoder's), and the saved folder in sentence-transformers' current
CrossEncoder layout, written here so that sentence-transformers stays a development dependency.
Labels, hard negatives and metrics are ``search.studies.tuning``'s (no torch there).
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
from indexer.embedding.models import check_model, model_location, quiet_transformers, unloadable
from indexer.embedding.strategy import DEFAULT_MODEL
from indexer.encoders.pipeline import DTYPES
from indexer.encoders.train_passes import in_passes
from indexer.encoders.training import Budget, Outcome, train_loop
from indexer.errors import BadInput
from indexer.progress import Share

SIGMOID = "torch.nn.modules.activation.Sigmoid"
"""The activation sentence-transformers' CrossEncoder applies to one logit (its name as saved)."""
SCORING_BATCH = 32
"""Pairs per forward pass when scoring (no gradient)."""
CLASSIFIER = "ForSequenceClassification"


@dataclass(frozen=True)
class PairRows:
    """Training rows of scored pairs: ``(first[i], second[i])`` should score ``targets[i]`` (in [0, 1])."""

    first: list[str]
    second: list[str]
    targets: list[float]

    def __len__(self) -> int:
        return len(self.first)


@dataclass(frozen=True)
class RankingRows:
    """Training lists: ``questions[i]`` against ``texts[i]``, whose first text is the right one
    where ``answered[i]`` (else every text is wrong: a question with no answer). A list is one
    training row: a step reads whole lists, so each right text is ranked against its negatives."""

    questions: list[str]
    texts: list[list[str]]
    answered: list[bool]
    teacher: list[list[float]] | None = None
    """The first stage's cosine of each question and text, where known: the list's order it
    already knows, which the listwise loss keeps a share of (``ranking_loss``)."""

    def __len__(self) -> int:
        return len(self.questions)

    @property
    def pairs(self) -> int:
        return sum(map(len, self.texts))


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
        return self._forward(self._pairs(first, second, padding=True, return_tensors="pt"))

    def train_logits(self, first: Sequence[str], second: Sequence[str]) -> torch.Tensor:
        """``logits`` of a training step's pairs, those of like length in one pass (``in_passes``):
        the same logits, far fewer padded tokens when a step mixes short and long pairs."""
        tokens = self._pairs(first, second)

        def run(rows: list[int]) -> torch.Tensor:
            chosen = {key: [values[i] for i in rows] for key, values in tokens.items()}
            return self._forward(self.tokenizer.pad(chosen, return_tensors="pt"))

        return in_passes([len(ids) for ids in tokens["input_ids"]], self.device, run)

    def _pairs(self, first: Sequence[str], second: Sequence[str], **how: Any) -> Any:
        return self.tokenizer(
            list(first), list(second), truncation="longest_first", max_length=self.max_length, **how
        )

    def _forward(self, batch: Any) -> torch.Tensor:
        batch = {key: value.to(self.device) for key, value in batch.items()}
        half = self.mixed in ("bf16", "fp16") and self.device.type == "cuda"
        with torch.autocast("cuda", dtype=DTYPES.get(self.mixed, torch.float32), enabled=half):
            return self.network(**batch, return_dict=True).logits.view(-1).float()

    def scores(self, pairs: Sequence[tuple[str, str]], progress: Share | None = None) -> np.ndarray:
        """Sigmoid of each pair's logit (``CrossEncoder.predict``'s default), in eval mode, without
        a gradient; pairs of like length share a pass. ``progress``: told each pass's share."""
        order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))
        out = np.empty(len(pairs), dtype=np.float32)
        self.network.eval()
        with torch.inference_mode():
            for start in range(0, len(order), SCORING_BATCH):
                rows = order[start : start + SCORING_BATCH]
                logits = self.logits([pairs[i][0] for i in rows], [pairs[i][1] for i in rows])
                out[rows] = torch.sigmoid(logits).cpu().numpy()
                if progress is not None:
                    progress(len(rows) / len(order))
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

    quiet_transformers()
    model = model or DEFAULT_MODEL
    location = model_location(model, download=True)
    config = check_model(model, location)
    if config is None:
        raise unloadable(model, location, FileNotFoundError("config.json"))
    continued = any(str(a).endswith(CLASSIFIER) for a in config.get("architectures") or [])
    # a new head reads pairs as long as the encoder was trained to read (sentence-transformers'
    # max_seq_length), not its positions: a step costs its longest pair
    said = (model_json(model_file(location, "sentence_bert_config.json")) or {}).get("max_seq_length")
    said = said if isinstance(said, int) and said > 1 else None
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
    length = max_length or min(int(said or limit), limit)
    return CrossModel(network, tokenizer, length, model, continued, mixed)


def bce_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """sentence-transformers' ``BinaryCrossEntropyLoss`` on raw logits (``BCEWithLogitsLoss``)."""
    return torch.nn.functional.binary_cross_entropy_with_logits(logits, targets)


TEACHER_SHARE = 0.8
"""The share of a list's listwise target that is the first stage's order (its cosines' softmax
at ``TEACHER_TEMPERATURE``), the rest the labels' right text: a new head learns from a few
hundred questions what the first stage already knows as well as what it gets wrong."""
NEW_HEAD_TIMES = 30.0
"""A new head's rate over the encoder's: a random linear layer on trained features moves 30 times
as fast as the features, which change slowly so as not to forget what they were trained for."""
TEACHER_TEMPERATURE = 0.05
"""The first stage's cosines are divided by this before their softmax (a scale of 20, as
sentence-transformers' ``MultipleNegativesRankingLoss``)."""


def ranking_loss(
    logits: torch.Tensor,
    sizes: Sequence[int],
    answered: Sequence[bool],
    teacher: torch.Tensor | None = None,
) -> torch.Tensor:
    """Listwise softmax cross-entropy of each list against its target, plus the mean binary
    cross-entropy of every logit against 1 (the right text) or 0: the softmax term ranks (what a
    reranker is for), the pointwise term keeps the logit an absolute score (a question with no
    answer scores low everywhere). A list's target is its right text (its first, where answered);
    with ``teacher`` (the first stage's cosine of each pair) ``TEACHER_SHARE`` of it is the first
    stage's order instead, so a list with no answer is ranked too."""
    targets = torch.zeros_like(logits)
    listwise, start = [], 0
    for size, right in zip(sizes, answered, strict=True):
        span = slice(start, start + size)
        goal = torch.zeros(size, device=logits.device)
        if right:
            targets[start] = goal[0] = 1.0
        if teacher is not None:
            known = torch.softmax(teacher[span].float() / TEACHER_TEMPERATURE, 0)
            goal = (1 - TEACHER_SHARE) * goal + TEACHER_SHARE * known
        if size > 1 and goal.sum() > 0:
            listwise.append(-(goal * torch.log_softmax(logits[span], 0)).sum())
        start += size
    pointwise = torch.nn.functional.binary_cross_entropy_with_logits(logits, targets)
    return (torch.stack(listwise).mean() if listwise else logits.sum() * 0) + pointwise


def fine_tune_cross(
    cross: CrossModel,
    rows: PairRows | RankingRows,
    measure: CrossMeasure,
    budget: Budget,
    *,
    progress: bool = False,
    report: Callable[[str], object] = lambda line: None,
) -> Outcome:
    """Train ``cross`` in place on ``rows`` through ``tune``'s one loop (``training.train_loop``):
    scored pairs by binary cross-entropy of each pair's logit against its target, lists by
    ``ranking_loss``; the best weights left loaded."""

    new_lists = isinstance(rows, RankingRows) and not cross.continued  # a new head's own rate

    def loss_of(batch: Sequence[int]) -> torch.Tensor:
        if isinstance(rows, RankingRows):
            sizes = [len(rows.texts[i]) for i in batch]
            first = [rows.questions[i] for i, size in zip(batch, sizes, strict=True) for _ in range(size)]
            logits = cross.train_logits(first, [t for i in batch for t in rows.texts[i]])
            known = rows.teacher
            teacher = None if known is None else logits.new_tensor([c for i in batch for c in known[i]])
            return ranking_loss(logits, sizes, [rows.answered[i] for i in batch], teacher)
        logits = cross.train_logits([rows.first[i] for i in batch], [rows.second[i] for i in batch])
        targets = torch.tensor([rows.targets[i] for i in batch], device=logits.device)
        return bce_loss(logits, targets)

    return train_loop(
        cross.network,
        len(rows),
        loss_of,
        lambda: measure(cross.scores),
        budget,
        scaled=cross.mixed == "fp16" and cross.device.type == "cuda",
        groups=head_groups(cross.network, budget.learning_rate) if new_lists else None,
        progress=progress,
        report=report,
    )


def head_groups(network: torch.nn.Module, rate: float) -> list[dict[str, Any]]:
    """AdamW's groups for a new head: the encoder's weights at ``rate``, the head's (every
    weight outside the base model) at ``NEW_HEAD_TIMES`` that."""
    body = list(network.base_model.parameters())
    encoder = {id(p) for p in body}
    head = [p for p in network.parameters() if id(p) not in encoder]
    return [{"params": body}, {"params": head, "lr": rate * NEW_HEAD_TIMES}]


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
