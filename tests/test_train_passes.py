"""A training step runs its rows in passes of like length (``indexer.encoders.train_passes``) and
its optimiser fused: the same logits, vectors, gradients and trained weights as one padded pass
and torch's reference AdamW, for less of the CPU."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from indexer.embedding.strategy import Strategy
from indexer.encoders.cross_training import RankingRows, fine_tune_cross, load_cross, ranking_loss
from indexer.encoders.training import Budget, trainable
from tests.helpers import sentence

SHORT = "a cat"
LONG = " ".join(sentence(i) for i in range(6))


@contextmanager
def counted(network: torch.nn.Module) -> Iterator[list[int]]:
    """The rows of each forward pass ``network`` runs inside the block."""
    seen: list[int] = []
    hook = network.register_forward_hook(
        lambda module, args, kwargs, out: seen.append(len(kwargs["input_ids"])), with_kwargs=True
    )
    try:
        yield seen
    finally:
        hook.remove()


def test_a_cross_encoder_step_runs_like_lengths_together_with_the_one_pass_logits_and_gradients(tiny_model):
    cross = load_cross(tiny_model)
    cross.network.eval()  # no dropout: the two ways must agree
    first = ["why", "what is it", "why", "how"] * 2
    second = [SHORT, LONG, SHORT + " too", LONG + " again"] * 2
    grads = []
    for way in (cross.logits, cross.train_logits):
        cross.network.zero_grad()
        with counted(cross.network) as seen:
            logits = way(first, second)
        ranking_loss(logits, [4, 4], [True, False]).backward()
        gradient = [p.grad.clone() for p in cross.network.parameters() if p.grad is not None]
        grads.append((logits.detach(), gradient, seen))
    (one, one_grad, one_passes), (split, split_grad, split_passes) = grads
    assert one_passes == [8] and len(split_passes) >= 2 and sum(split_passes) == 8
    torch.testing.assert_close(split, one, atol=1e-5, rtol=1e-5)
    for a, b in zip(split_grad, one_grad, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_a_bi_encoder_step_runs_like_lengths_together_with_the_one_pass_vectors(tiny_model):
    from indexer.encoders import training

    encoder = trainable(Strategy(model=tiny_model, backend="torch"))
    encoder.model.eval()
    texts = [SHORT, LONG, "a dog", LONG + " and more", "hi"]
    with counted(encoder.model) as seen:
        vectors = training._vectors(encoder, texts)
    assert len(seen) >= 2 and sum(seen) == len(texts)
    for i, text in enumerate(texts):  # each alone: nothing padded, nothing beside it
        alone = training._vectors(encoder, [text])
        torch.testing.assert_close(vectors[i : i + 1], alone, atol=1e-5, rtol=1e-5)


def test_training_steps_with_fused_adamw_and_ends_where_the_reference_adamw_ends(tiny_model, monkeypatch):
    real = torch.optim.AdamW
    made: list[dict] = []

    def spy(params, **kwargs):
        made.append(kwargs)
        return real(params, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", spy)
    rows = RankingRows(["why", "what"] * 3, [[SHORT, LONG, "b"], [LONG, "c", SHORT]] * 3, [True, False] * 3)

    def reference(params, **kwargs):  # torch's AdamW as it runs unasked
        return real(params, **{key: value for key, value in kwargs.items() if key != "fused"})

    ends = []
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(torch.optim, "AdamW", reference)
        cross = load_cross(tiny_model, seed=1)
        rising = itertools.count()  # every measurement better: the last weights are kept
        budget = Budget(epochs=2, batch_size=2, learning_rate=1e-3, patience=9)
        fine_tune_cross(cross, rows, lambda score, rising=rising: next(rising), budget)
        ends.append([p.detach().clone() for p in cross.network.parameters()])
    assert made and made[0].get("fused") is True
    for a, b in zip(*ends, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
