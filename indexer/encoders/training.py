"""Fine-tuning a model through the strategy an index embeds with (``semsearch tune``).

The training forward pass is the encoder's own: ``TorchEncoder``'s tokenizer, its network (cut
after the deepest layer the strategy reads) and its ``indexer.embedding.head.Head`` (layers, combination,
pooling, special-token rule), run on torch tensors so the gradient flows through them. The
held-back metric is measured with ``TorchEncoder.embed`` on the same weights, i.e. exactly as an
index would embed.

Why a small loop and not sentence-transformers' trainer: its ``Transformer`` module hands its
pooling the last layer only and its ``Pooling`` has no special-token rule, so a strategy reading
another layer, combining several or skipping [CLS]/[SEP] cannot be expressed there. The losses
are the ones its trainer would use (``CoSENTLoss``, ``MultipleNegativesRankingLoss`` with hard
negatives), a few lines each.

The output is a plain Hugging Face directory plus sentence-transformers' module files, each
written by its module kind (``save_model``); the network is saved cut after the deepest layer
read, so "the last layer" of the saved model is the layer that was trained, which both semsearch
(``--model DIR``) and sentence-transformers read by default.
"""

from __future__ import annotations

import copy
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from indexer.embedding.head import NetworkOutput, pad_batch
from indexer.embedding.modules.base import save_modules
from indexer.embedding.modules.normalize import Normalize
from indexer.embedding.modules.pooling import Pooling
from indexer.embedding.modules.transformer import Transformer
from indexer.embedding.strategy import Strategy
from indexer.encoders.devices import Placement
from indexer.encoders.factory import torch_encoder
from indexer.encoders.options import EmbeddingOptions, given
from indexer.encoders.pipeline import DTYPES
from indexer.encoders.torch_encoder import TorchEncoder, layer_stack
from indexer.encoders.train_passes import in_passes
from indexer.errors import BadInput

SCALE = 20.0
"""Cosine scale of both losses (sentence-transformers' default for CoSENT and in-batch negatives)."""
MARGIN = 1.5
"""What a step and the measurement after it are reckoned to cost against ``--max-minutes``, as a
multiple of the longest each has taken yet."""


@dataclass(frozen=True)
class Examples:
    """Training rows. ``scores``: scored pairs (CoSENT), symmetric: both sides read as queries
    (with the strategy's query prefix, as STS pairs are compared). Without: ``first`` (a query,
    with the query prefix) -> ``second`` (a passage, with the passage prefix) are positives, every
    other row's ``second`` (and ``negatives``) in the batch is a negative, except rows of the same
    ``group`` (a thread, an intent: they may be relevant too)."""

    first: list[str]
    second: list[str]
    groups: list[int]
    scores: list[float] | None = None
    negatives: list[str] | None = None

    def __len__(self) -> int:
        return len(self.first)


@dataclass(frozen=True)
class Budget:
    """How long and how hard to train. An evaluation of the held-back share runs ``evaluations``
    times per epoch; training stops after ``patience`` evaluations without a better one."""

    epochs: int = 4
    max_minutes: float | None = None
    batch_size: int = 16
    learning_rate: float = 2e-5
    seed: int = 0
    evaluations: int = 2
    patience: int = 3
    started: float | None = None
    """When the budget began (``time.monotonic``; None: when the loop starts): a command that reads,
    mines and measures before training counts that against ``max_minutes`` too."""
    after: float = 0.0
    """Seconds of ``max_minutes`` kept for the command's work after the loop."""

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 2 or self.evaluations < 1 or self.patience < 1:
            raise BadInput("epochs, evaluations and patience must be at least 1, batch size at least 2")
        if self.max_minutes is not None and not 0 < self.max_minutes < math.inf:  # NaN, inf too
            raise BadInput(f"max minutes must be a positive number, not {self.max_minutes}")
        if not 0 < self.learning_rate < 1:
            raise BadInput(f"learning rate must be in (0, 1), not {self.learning_rate}")


@dataclass
class Outcome:
    """What a run did: the held-back metric before and at the kept checkpoint, and why it stopped."""

    before: float
    best: float
    best_step: int
    steps: int
    epochs: float
    minutes: float
    stopped: str
    losses: list[float] = field(default_factory=list)
    """Mean training loss of each evaluation interval."""


Measure = Callable[[Callable[..., np.ndarray]], float]
"""Held-back metric (higher is better) of an ``embed(texts, role=...)`` function (``Encoder.embed``)."""


def trainable(strategy: Strategy | None, options: EmbeddingOptions | None = None) -> TorchEncoder:
    """The strategy's torch encoder, checked to be trainable and savable as a model directory
    whose default reading is the strategy's (one clear line otherwise), its fp32 weights on
    ``options``' device (a GPU's half precision is autocast in the forward pass, ``fine_tune``)."""
    options = given(options)
    on = Placement(options.placement.device, "fp32")
    trusted = options.trust_remote_code
    placed = EmbeddingOptions.at(on, batch_size=options.batch_size, trust_remote_code=trusted)
    encoder = torch_encoder(replace(strategy or Strategy(), backend="torch"), placed)
    encoder.model.to(on.device)
    resolved = encoder.strategy
    if resolved.pooling == "pooler":
        raise BadInput(
            "pooling 'pooler' cannot be tuned and stated in a model directory: choose cls/mean/max"
        )
    if resolved.modules:
        raise BadInput(
            f"the model's Dense modules after pooling ({', '.join(resolved.modules)}) cannot be tuned "
            "and saved with it: tune it with another --pooling or --layers (the network alone)"
        )
    found = layer_stack(encoder.model)
    deepest = max(encoder.head.layers)
    if found is None and deepest != encoder.num_layers:
        raise BadInput(
            f"model {resolved.model!r} cannot be tuned at layer {deepest}: its transformer blocks "
            "are not a BERT-like layer list, so the network cannot be cut there"
        )
    if deepest == 0:
        raise BadInput(
            "layer 0 (the embedding output) cannot be tuned as a sentence encoder: choose a layer >= 1"
        )
    if not any(p.requires_grad for p in encoder.model.parameters()):
        raise BadInput(f"model {resolved.model!r} has no trainable parameters")
    return encoder


def _vectors(encoder: TorchEncoder, texts: Sequence[str], role: str = "query") -> torch.Tensor:
    """Sentence vectors with their gradient: the encoder's tokens (the ``role``'s prefix before
    each text), network and head, on the encoder's device."""
    tokens = encoder.tokens.ids(texts, role)
    device = torch.device(encoder.decision.placement.device)

    def run(rows: list[int]) -> torch.Tensor:
        input_ids, attention = pad_batch([tokens[i] for i in rows], encoder.tokens.pad)
        ids, mask = torch.from_numpy(input_ids).to(device), torch.from_numpy(attention).to(device)
        out = encoder.model(input_ids=ids, attention_mask=mask, output_hidden_states=True, return_dict=True)
        return encoder.head(NetworkOutput(out.hidden_states, getattr(out, "pooler_output", None)), ids, mask)

    return in_passes([len(ids) for ids in tokens], device, run)  # like lengths together


def _unit(vectors: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(vectors, dim=-1)


def cosent_loss(first: torch.Tensor, second: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """CoSENT (Su 2022): every pair ranked above a pair with a lower gold score, by cosine."""
    cosines = (_unit(first) * _unit(second)).sum(-1) * SCALE
    differences = cosines[None, :] - cosines[:, None]  # [i, j]: cos_j - cos_i, penalised when gold_i > gold_j
    wrong_order = scores[:, None] > scores[None, :]
    differences = differences.masked_fill(~wrong_order, -1e12)
    zero = torch.zeros(1, device=differences.device, dtype=differences.dtype)
    return torch.logsumexp(torch.cat([zero, differences.flatten()]), dim=0)


def in_batch_loss(
    anchors: torch.Tensor, candidates: torch.Tensor, groups: torch.Tensor, candidate_groups: torch.Tensor
) -> torch.Tensor:
    """Cross-entropy of each anchor's positive (candidate ``i``) against the other candidates of the
    batch (its positives, then hard negatives); a candidate of the anchor's own group is not a
    negative."""
    logits = _unit(anchors) @ _unit(candidates).T * SCALE
    rows = torch.arange(len(anchors), device=logits.device)
    same = groups[:, None] == candidate_groups[None, :]
    same[rows, rows] = False
    return torch.nn.functional.cross_entropy(logits.masked_fill(same, -1e12), rows)


def _batch_loss(encoder: TorchEncoder, examples: Examples, rows: Sequence[int]) -> torch.Tensor:
    first = _vectors(encoder, [examples.first[i] for i in rows])
    if examples.scores is not None:
        second = _vectors(encoder, [examples.second[i] for i in rows])
        scores = torch.tensor([examples.scores[i] for i in rows], device=first.device)
        return cosent_loss(first, second, scores)
    groups = torch.tensor([examples.groups[i] for i in rows], device=first.device)
    texts = [examples.second[i] for i in rows]
    candidate_groups = groups
    if examples.negatives is not None:
        negatives = [i for i in rows if examples.negatives[i] is not None]
        texts += [examples.negatives[i] for i in negatives]
        candidate_groups = torch.cat([groups, torch.full((len(negatives),), -1, device=groups.device)])
    return in_batch_loss(first, _vectors(encoder, texts, "passage"), groups, candidate_groups)


@dataclass
class Schedule:
    """Learning-rate factor: linear warm-up over the first 10 % of the planned steps, then linear
    decay to 0 at the last. With a time budget the plan shrinks to the steps the budget leaves
    (evaluations included), so a run cut by ``--max-minutes`` ends with its rate decayed, not at
    its peak."""

    total: int
    """The steps the epochs asked for."""
    planned: int = 0

    def __post_init__(self) -> None:
        self.planned = self.planned or self.total

    def rate(self, step: int) -> float:
        warm = max(1, int(0.1 * self.planned))
        if step < warm:
            return step / warm
        return max(0.0, (self.planned - step) / max(1, self.planned - warm))

    def fit(self, done: int, seconds_per_step: float, seconds_left: float) -> None:
        """Plan the asked steps, or fewer: ``done`` plus what ``seconds_left`` allows at this pace."""
        self.planned = min(self.total, done + max(0, int(seconds_left / max(seconds_per_step, 1e-9))))


def _batches(count: int, size: int, rng: random.Random) -> list[list[int]]:
    order = list(range(count))
    rng.shuffle(order)
    batches = [order[i : i + size] for i in range(0, count, size)]
    return [b for b in batches if len(b) >= 2]  # a lone row has no pair to rank


def fine_tune(
    encoder: TorchEncoder,
    examples: Examples,
    measure: Measure,
    budget: Budget,
    *,
    progress: bool = False,
    report: Callable[[str], object] = lambda line: None,
    mixed: str = "fp32",
) -> Outcome:
    """Train ``encoder``'s model in place on ``examples`` (``train_loop``). ``mixed``: ``bf16`` or
    ``fp16`` autocasts the forward pass on a GPU (fp32 weights and optimiser; fp16 with a loss
    scaler)."""
    device = torch.device(encoder.decision.placement.device)
    half = mixed in ("bf16", "fp16") and device.type == "cuda"

    def loss_of(rows: Sequence[int]) -> torch.Tensor:
        if not half:
            return _batch_loss(encoder, examples, rows)
        with torch.autocast("cuda", dtype=DTYPES[mixed]):
            return _batch_loss(encoder, examples, rows)

    return train_loop(
        encoder.model,
        len(examples),
        loss_of,
        lambda: measure(encoder.embed),
        budget,
        scaled=half and mixed == "fp16",
        progress=progress,
        report=report,
    )


@dataclass
class _Checkpoints:
    """The held-back measurements of a run and the best weights yet (possibly the untouched ones):
    what ``train_loop`` keeps between its steps."""

    model: torch.nn.Module
    measure: Callable[[], float]
    outcome: Outcome
    per_epoch: int
    report: Callable[[str], object]
    evaluation: float
    """The longest a measurement has taken (seconds): the last one is kept time for."""
    best_state: dict[str, Any] = field(default_factory=dict)
    since_best: int = 0
    interval: list[float] = field(default_factory=list)
    """The losses since the last measurement."""

    def __post_init__(self) -> None:
        self.best_state = copy.deepcopy(self.model.state_dict())

    def evaluate(self) -> None:
        """Measure the held-back share now; keep these weights if they are the best yet."""
        began = time.monotonic()
        self.model.eval()
        metric = self.measure()
        self.evaluation = max(self.evaluation, time.monotonic() - began)
        outcome = self.outcome
        outcome.losses.append(float(np.mean(self.interval)))
        self.interval = []
        self.report(
            f"step {outcome.steps} (epoch {outcome.steps / self.per_epoch:.2f}): "
            f"loss {outcome.losses[-1]:.4f}, held-back {metric:.4f}"
        )
        if metric > outcome.best:
            outcome.best, outcome.best_step, self.since_best = metric, outcome.steps, 0
            self.best_state = copy.deepcopy(self.model.state_dict())
        else:
            self.since_best += 1


def _step(
    model: torch.nn.Module, loss: torch.Tensor, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler
) -> None:
    """One optimiser step on ``loss``: scaled (fp16), its gradient norm clipped at 1."""
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()


def _fusable(model: torch.nn.Module) -> bool:
    """Whether torch's fused AdamW takes ``model``'s weights (float, on the CPU or a GPU): one
    kernel for the whole step, the same update as the reference (10% of a CPU step's time)."""
    return all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in model.parameters())


def train_loop(
    model: torch.nn.Module,
    count: int,
    loss_of: Callable[[Sequence[int]], torch.Tensor],
    measure: Callable[[], float],
    budget: Budget,
    *,
    scaled: bool = False,
    groups: list[dict[str, Any]] | None = None,
    progress: bool = False,
    report: Callable[[str], object] = lambda line: None,
) -> Outcome:
    """The one training loop of ``tune`` (bi-encoders and cross-encoders): ``model`` trained in
    place on batches of ``count`` rows (``loss_of(rows)``), AdamW with warm-up and linear decay
    (``Schedule``, shrunk to a time budget), gradient norm clipped at 1; the held-back share
    measured (``measure``, the model in eval mode) before, ``budget.evaluations`` times an epoch
    and at the end, stopping after ``budget.patience`` measurements without a better one; the
    best weights (possibly the untouched ones) left loaded. ``budget.max_minutes`` holds the whole
    run, its measurements included: a step starts only when it and one more measurement fit in
    what is left, each reckoned at ``MARGIN`` times the longest yet. Memory stays bounded: one
    batch's activations and one copy of the best weights.
    ``scaled``: fp16 on a GPU, with a loss scaler; ``groups``: AdamW's, rates of their own."""
    from indexer.progress import Progress

    torch.manual_seed(budget.seed)
    rng = random.Random(budget.seed)
    started = time.monotonic()
    begun = started if budget.started is None else budget.started
    deadline = None if budget.max_minutes is None else begun + budget.max_minutes * 60 - budget.after
    per_epoch = max(1, len(_batches(count, budget.batch_size, random.Random(0))))
    total = per_epoch * budget.epochs
    every = max(1, math.ceil(per_epoch / budget.evaluations))
    weights = groups or model.parameters()
    optimizer = torch.optim.AdamW(weights, lr=budget.learning_rate, weight_decay=0.01, fused=_fusable(model))
    plan = Schedule(total)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, plan.rate)
    scaler = torch.amp.GradScaler("cuda", enabled=scaled)

    model.eval()
    before = measure()
    evaluation = time.monotonic() - started  # what one measurement costs: the last one is kept time for
    report(f"held-back metric before tuning: {before:.4f}")
    outcome = Outcome(before, before, 0, 0, 0.0, 0.0, "epochs done")
    run = _Checkpoints(model, measure, outcome, per_epoch, report, evaluation)
    training_started, longest_step = time.monotonic(), 0.0
    epochs = (rows for _ in range(budget.epochs) for rows in _batches(count, budget.batch_size, rng))
    with Progress(total, "tuning", enabled=progress, unit="step", fills=False) as bar:
        for rows in epochs:
            # a step starts only if it and the evaluation after it fit in the time left (a first
            # step is guessed to cost a measurement), each with half again as margin: on a shared
            # machine one can take longer than any before it, and the budget holds the whole run
            step = longest_step or run.evaluation
            if deadline is not None and time.monotonic() + MARGIN * (step + run.evaluation) > deadline:
                outcome.stopped = "time budget spent"
                break
            began = time.monotonic()
            model.train()
            loss = loss_of(rows).float()
            _step(model, loss, optimizer, scaler)
            outcome.steps += 1
            now = time.monotonic()
            longest_step = max(longest_step, now - began)
            if deadline is not None:  # lay the decay out over the steps the budget leaves
                plan.fit(outcome.steps, (now - training_started) / outcome.steps, deadline - now)
            schedule.step()
            run.interval.append(loss.item())
            bar.show(f"loss={run.interval[-1]:.4f}")
            bar.advance(1)
            if outcome.steps % every == 0 or outcome.steps == total:
                run.evaluate()
                if run.since_best >= budget.patience:
                    outcome.stopped = "held-back metric stopped improving"
                    break
        if run.interval:  # steps the budget stopped before their evaluation: measured in the time kept
            run.evaluate()
    model.load_state_dict(run.best_state)
    model.eval()
    outcome.epochs = outcome.steps / per_epoch
    outcome.minutes = (time.monotonic() - begun) / 60
    return outcome


def save_model(
    encoder: TorchEncoder, staging: Path, output: Path, facts: dict[str, Any], backend: str
) -> Strategy:
    """Write the tuned model into ``staging``, the directory that becomes ``output`` whole
    (``indexer.files.staged_dir``, claimed before training): config, safetensors,
    tokenizer, sentence-transformers' modules, each saved by its own ``save`` (the network's length,
    pooling and normalising as the strategy does) and
    ``semsearch.json`` (the strategy, on ``backend``, and ``facts``). Returns that strategy: the
    one an index of the tuned model must be built with."""
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # saving is quick: no bar in a pipe
    resolved = encoder.strategy
    blocks = max(encoder.head.layers)  # the network is cut there: the saved model's last layer
    model = encoder.model
    model.config.num_hidden_layers = blocks
    layers = tuple(-1 if i == blocks else i for i in encoder.head.layers)
    stored = replace(
        resolved, model=str(output.resolve()), layers=layers, backend=backend, model_fingerprint=None
    )
    model.save_pretrained(staging, safe_serialization=True)
    encoder.tokenizer.save_pretrained(staging)
    modules = [Transformer(resolved.max_length), Pooling(resolved.pooling, width=model.config.hidden_size)]
    save_modules(staging, [*modules, *([Normalize()] if resolved.normalize else [])])
    (staging / "semsearch.json").write_text(
        json.dumps({"strategy": stored.to_dict(), **facts}, indent=2) + "\n", encoding="utf-8"
    )
    return stored
