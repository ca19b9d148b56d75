"""``semsearch tune``: fine-tune the index's model on the user's labels, honestly.

Labels of four kinds become training rows (``indexer.encoders.training.Examples``): scored pairs
(CoSENT), positive pairs (in-batch negatives), retrieval judgements (query -> relevant entry, with
a hard negative mined by the untuned model) and an unlabelled FAQ (question -> its answer). A
share of the labels is held back by group (the connected pieces of the label graph: a thread, an
intent, every pair sharing a sentence), never trained on, and measured before, during (early
stopping, best checkpoint kept) and after training.

This module and ``indexer.encoders.training`` are the tuning code: only the ``tune`` command
imports them (``tests/test_tuning.py`` holds the read path and ``index`` to that).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from indexer.embedding.fields import FieldScoring
from indexer.embedding.strategy import Strategy
from indexer.encoders.options import EmbeddingOptions
from indexer.errors import BadInput
from indexer.files import staged_dir
from indexer.reading.corpus import Rejection
from search.read.components import connected

if TYPE_CHECKING:
    from indexer.encoders.training import Examples

MIN_LABELS = 10
"""Fewer labelled pairs than this leave nothing to hold back and learn from at once."""
HELD_BACK = 0.1
K = 10


@dataclass(frozen=True)
class Labels:
    """Labelled pairs of one kind. ``groups[i]``: the label-graph piece of pair ``i`` (held back
    whole). For ranking kinds, ``candidates`` is the pool a held-back anchor is ranked in and
    ``relevant[anchor]`` the candidate indices it should find."""

    kind: str
    first: list[str]
    second: list[str]
    groups: np.ndarray
    scores: np.ndarray | None = None
    candidates: list[str] | None = None
    relevant: dict[str, set[int]] | None = None
    mine_negatives: bool = False
    rejected: tuple[Rejection, ...] = ()
    """Rows of the labels file that gave no pair (``search.studies.evaluate.read_pairs``)."""
    negatives: dict[str, list[str]] | None = None
    """A question's wrong texts the labels name (0/1 pairs grouped by question)."""
    unanswered: dict[str, int] | None = None
    """Questions the labels give no right text, each with its label-graph piece."""

    def __post_init__(self) -> None:
        pieces = len(set(self.groups.tolist()))
        distinct = len(set(zip(self.first, self.second, strict=True)))
        if distinct < MIN_LABELS or pieces < 2:
            repeated = f" but {distinct} distinct" if distinct < len(self.first) else ""
            raise BadInput(
                f"too few labels: {len(self.first)} {self.kind}{repeated} in {pieces} group(s); tune needs "
                f"at least {MIN_LABELS} distinct pairs in 2 groups or more (a share is held back to measure)"
            )


def components(edges: Sequence[tuple[str, str]]) -> np.ndarray:
    """The connected piece of each edge in the graph the edges make (nodes: any strings)."""
    return connected([a for a, _ in edges], [b for _, b in edges])[2]


def _ranking(
    first: list[str], second: list[str], groups: np.ndarray, kind: str, rejected: tuple[Rejection, ...] = ()
) -> Labels:
    """Positive pairs ranked among every distinct second text."""
    candidates = list(dict.fromkeys(second))
    position = {text: i for i, text in enumerate(candidates)}
    relevant: dict[str, set[int]] = {}
    for a, b in zip(first, second, strict=True):
        relevant.setdefault(a, set()).add(position[b])
    return Labels(kind, first, second, groups, candidates=candidates, relevant=relevant, rejected=rejected)


def pair_labels(
    path: str | Path,
    s1: str = "sentence1",
    s2: str = "sentence2",
    score: str = "score",
    encoding: str = "utf-8",
) -> Labels:
    """Every file ``evaluate sts`` reads (scored pairs), or two text columns (positive pairs)."""
    from search.studies.evaluate import read_pairs

    pairs = read_pairs(path, s1, s2, score, need_score=False, encoding=encoding)
    groups = components(list(zip(pairs.first, pairs.second, strict=True)))
    if pairs.scored:
        return Labels(
            "scored pairs", pairs.first, pairs.second, groups, scores=pairs.gold, rejected=pairs.rejected
        )
    return _ranking(pairs.first, pairs.second, groups, "positive pairs", pairs.rejected)


def retrieval_labels(
    queries: str | Path,
    qrels: str | Path,
    corpus: str | Path,
    text_fields: Sequence[str] | None = None,
    encoding: str = "utf-8",
) -> Labels:
    """``evaluate retrieval``'s inputs: each query -> each relevant entry, grouped by thread (the
    questions and entries the judgements link), ranked against the whole corpus; hard negatives
    are mined when training."""
    from indexer.reading.corpus import read_corpus
    from search.studies.evaluate import read_retrieval_set

    data = read_retrieval_set(queries, qrels, encoding)
    entries = read_corpus(corpus, text_fields=text_fields, encoding=encoding).entries
    position = {e.id: i for i, e in enumerate(entries)}
    texts = {q.id: q.text for q in data.queries}
    unknown_queries = sorted(set(data.qrels) - set(texts))
    unknown_entries = sorted({d for docs in data.qrels.values() for d in docs} - set(position))
    for what, unknown, where in (("query", unknown_queries, queries), ("entry", unknown_entries, corpus)):
        if unknown:
            raise BadInput(
                f"the judgements name {len(unknown)} {what} id(s) not in {where}: {', '.join(unknown[:3])}"
            )
    links = [(q, d) for q, docs in data.qrels.items() for d in sorted(docs)]
    relevant: dict[str, set[int]] = {}
    for q, d in links:
        relevant.setdefault(texts[q], set()).add(position[d])
    pieces = dict(zip(links, components([("q:" + q, "d:" + d) for q, d in links]), strict=True))
    # one training pair per query and distinct entry text (FAQ entries often share their question)
    unique = list({(texts[q], entries[position[d]].text): (q, d) for q, d in links}.values())
    return Labels(
        "query-entry pairs",
        [texts[q] for q, _ in unique],
        [entries[position[d]].text for _, d in unique],
        np.array([pieces[link] for link in unique]),
        candidates=[e.text for e in entries],
        relevant=relevant,
        mine_negatives=True,
    )


def faq_labels(
    corpus: str | Path, text_fields: Sequence[str] | None, also: FieldScoring, encoding: str = "utf-8"
) -> Labels:
    """An unlabelled FAQ: each entry's text (its question) -> its ``also`` text (the answer, or
    question and answer); entries sharing a question are one group."""
    from indexer.reading.corpus import read_corpus

    entries = read_corpus(corpus, text_fields=text_fields, encoding=encoding).entries
    pairs = [(e.text, t) for e, t in zip(entries, also.texts(entries), strict=True) if t != e.text]
    if not pairs:
        raise BadInput("--also: every entry's second text equals its text; name the answer field")
    first, second = [p[0] for p in pairs], [p[1] for p in pairs]
    return _ranking(first, second, components(pairs), "question-answer pairs")


def read_labels(
    *,
    pairs: str | Path | None = None,
    columns: tuple[str, str, str] = ("sentence1", "sentence2", "score"),
    queries: str | Path | None = None,
    qrels: str | Path | None = None,
    corpus: str | Path | None = None,
    text_fields: Sequence[str] | None = None,
    also: FieldScoring | None = None,
    encoding: str = "utf-8",
) -> Labels:
    """The labels one set of inputs gives: ``pairs``; ``queries`` + ``qrels`` + ``corpus``; or
    ``corpus`` + ``also`` (an FAQ without labels); every file in ``encoding``."""
    if pairs is not None:
        if queries or qrels or corpus:
            raise BadInput("give --pairs, or --queries/--qrels/--corpus, not both")
        return pair_labels(pairs, *columns, encoding=encoding)
    if queries is not None or qrels is not None:
        if queries is None or qrels is None or corpus is None:
            raise BadInput("retrieval labels need --queries, --qrels and --corpus together")
        return retrieval_labels(queries, qrels, corpus, text_fields, encoding)
    if corpus is not None:
        if also is None:
            raise BadInput("an FAQ without labels needs --also naming the answer field(s)")
        return faq_labels(corpus, text_fields, also, encoding)
    raise BadInput("nothing to tune on: give --pairs, or --queries/--qrels/--corpus, or --corpus with --also")


def hold_back(labels: Labels, share: float, seed: int) -> np.ndarray:
    """Which pairs are held back: whole groups, shuffled by ``seed``, until ``share`` of the pairs."""
    if not 0 < share < 1:
        raise BadInput(f"held-back share must be in (0, 1), not {share}")
    pieces = sorted(set(labels.groups.tolist()))
    random.Random(seed).shuffle(pieces)
    held: set[int] = set()
    size = np.bincount(labels.groups)
    count = 0
    for piece in pieces[:-1]:  # one group at least stays for training
        if count >= share * len(labels.first):
            break
        held.add(piece)
        count += int(size[piece])
    return np.isin(labels.groups, sorted(held))


def measure_for(labels: Labels, held: np.ndarray) -> Callable[[Callable[..., np.ndarray]], float]:
    """The held-back metric of an ``Encoder.embed``: Spearman x100 of scored pairs (both sides
    queries, as STS is compared), else MRR@10 x100 of held-back anchors (queries) ranked among
    ``candidates`` (passages)."""
    from search.studies.evaluate import retrieval_metrics, sts_scores

    rows = np.flatnonzero(held)
    if labels.scores is not None:
        first, second, gold = (
            [labels.first[i] for i in rows],
            [labels.second[i] for i in rows],
            labels.scores[rows],
        )
        return lambda embed: sts_scores(embed(first), embed(second), gold)["spearman"]
    assert labels.candidates is not None and labels.relevant is not None
    anchors = list(dict.fromkeys(labels.first[i] for i in rows))
    qrels = {a: {str(c): 1 for c in labels.relevant[a]} for a in anchors}
    distinct = list(dict.fromkeys(labels.candidates))
    lookup = {t: i for i, t in enumerate(distinct)}
    where = np.array([lookup[t] for t in labels.candidates])  # each candidate's distinct text

    def measure(embed: Callable[..., np.ndarray]) -> float:
        scores = embed(anchors) @ embed(distinct, role="passage")[where].T
        top = np.argsort(-scores, axis=1, kind="stable")[:, :K]
        ranked = {a: [str(c) for c in row] for a, row in zip(anchors, top, strict=True)}
        return retrieval_metrics(ranked, qrels, K)[f"mrr@{K}"] * 100

    return measure


def wrong_nearest(
    labels: Labels, held: np.ndarray, embed: Callable[..., np.ndarray], count: int = 1
) -> dict[str, list[str]]:
    """For each training anchor, the ``count`` candidate texts the untuned model ranks highest
    among those that are neither relevant to it, nor the same text as a relevant one, nor a
    held-back text: its hard negatives."""
    assert labels.candidates is not None and labels.relevant is not None
    rows = np.flatnonzero(~held)
    banned = {labels.second[i] for i in np.flatnonzero(held)} | {
        labels.first[i] for i in np.flatnonzero(held)
    }
    anchors = list(dict.fromkeys(labels.first[i] for i in rows))
    distinct = list(dict.fromkeys(labels.candidates))
    order = np.argsort(-(embed(anchors) @ embed(distinct, role="passage").T), axis=1)[:, : 4 * K + count]
    nearest: dict[str, list[str]] = {}
    for anchor, ranked in zip(anchors, order, strict=True):
        taken = banned | {labels.candidates[c] for c in labels.relevant[anchor]}
        nearest[anchor] = [distinct[c] for c in ranked if distinct[c] not in taken][:count]
    return nearest


def hard_negatives(labels: Labels, held: np.ndarray, embed: Callable[..., np.ndarray]) -> list[str | None]:
    """For each training pair, its anchor's hardest negative (``wrong_nearest``), or None."""
    nearest = wrong_nearest(labels, held, embed)
    return [next(iter(nearest[labels.first[i]]), None) for i in np.flatnonzero(~held)]


def training_examples(labels: Labels, held: np.ndarray, embed: Callable[..., np.ndarray]) -> Examples:
    """The pairs not held back, as training rows (hard negatives mined with ``embed``, an
    ``Encoder.embed``)."""
    from indexer.encoders.training import Examples

    rows = np.flatnonzero(~held)
    return Examples(
        [labels.first[i] for i in rows],
        [labels.second[i] for i in rows],
        labels.groups[rows].tolist(),
        scores=None if labels.scores is None else labels.scores[rows].tolist(),
        negatives=hard_negatives(labels, held, embed) if labels.mine_negatives else None,
    )


@dataclass(frozen=True)
class TuneReport:
    """What ``tune`` did and where the model is."""

    output: str
    kind: str
    metric: str
    trained_pairs: int
    held_back_pairs: int
    before: float
    after: float
    best_step: int
    steps: int
    epochs: float
    minutes: float
    stopped: str
    losses: list[float]
    strategy: str
    options: str
    reranker: bool = False
    """A cross-encoder was trained (``cross_tune``): ``output`` is a reranker's folder."""
    first_stage: float | None = None
    """A reranker: the held-back metric of the first stage alone, before reranking."""
    verdict: list[str] | None = None
    """A reranker: the lines that compare it with the first stage on the held-back questions."""
    helps: bool | None = None
    """A reranker: whether it beat the first stage there (else a search keeps the first stage's order)."""
    weight: float | None = None
    """A reranker: the weight of its score fused with the first stage's, fitted on the held-back questions."""

    @classmethod
    def of(
        cls,
        output: Path,
        labels: Labels,
        counts: tuple[int, int],
        outcome: Any,
        strategy: str,
        options: str,
        **more: Any,
    ) -> TuneReport:
        """The report of a training ``outcome`` (``indexer.encoders.training.Outcome``) on
        ``counts`` (labels trained on, held back)."""
        return cls(
            str(output),
            labels.kind,
            metric_of(labels),
            *counts,
            outcome.before,
            outcome.best,
            outcome.best_step,
            outcome.steps,
            outcome.epochs,
            outcome.minutes,
            outcome.stopped,
            outcome.losses,
            strategy,
            options,
            **more,
        )

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def tune(
    labels: Labels,
    output: str | Path,
    strategy: Strategy | None = None,
    *,
    held_back: float = HELD_BACK,
    epochs: int = 4,
    max_minutes: float | None = None,
    seed: int = 0,
    batch_size: int = 16,
    learning_rate: float | None = None,
    progress: bool = False,
    report: Callable[[str], object] = lambda line: None,
    options: EmbeddingOptions | None = None,
) -> TuneReport:
    """Fine-tune ``strategy``'s model (default: the index's default) on ``labels`` through that
    strategy, holding back ``held_back`` of the labels by group, and save the best checkpoint to
    ``output`` (a new or empty directory), loadable with ``--model output``. ``batch_size``: pairs
    per training step. ``options``: where it trains (``device``; ``auto``: a GPU torch sees); their
    ``precision`` on a GPU: the forward pass autocast (``auto``: bf16, which needs no loss
    scaling), weights and optimiser in fp32."""
    from indexer.encoders.training import Budget, fine_tune, save_model, trainable

    output = Path(output)
    options, mixed = training_precision(options)
    with staged_dir(output, new_or_empty) as staging:  # claimed now: a second tune to it stops here
        budget = Budget(epochs, max_minutes, batch_size, learning_rate or Budget.learning_rate, seed)
        held = hold_back(labels, held_back, seed)
        rows = np.flatnonzero(~held)
        encoder = trainable(strategy, options)
        examples = training_examples(labels, held, encoder.embed)
        metric = metric_of(labels)
        report(f"{labels.kind}: {len(rows)} trained on, {int(held.sum())} held back ({metric} x100)")
        outcome = fine_tune(
            encoder,
            examples,
            measure_for(labels, held),
            budget,
            progress=progress,
            report=report,
            mixed=mixed,
        )
        encoder.model.to("cpu")  # saved from the CPU, whatever it trained on
        facts = _facts(encoder.strategy.model_id, labels, held, outcome)
        stored = save_model(encoder, staging, output, facts, (strategy or Strategy()).backend)
    counts = (len(rows), int(held.sum()))
    return TuneReport.of(output, labels, counts, outcome, stored.describe(), options_for(stored))


def training_precision(options: EmbeddingOptions | None) -> tuple[EmbeddingOptions, str]:
    """The options checked, and the forward pass's precision: on a GPU ``auto`` is bf16 (no loss
    scaling needed), on the CPU fp32; weights and optimiser stay fp32 either way."""
    from indexer.encoders.devices import AUTO
    from indexer.encoders.options import given

    options = given(options).checked()
    on = options.placement
    return options, "bf16" if options.precision.strip().lower() == AUTO and not on.on_cpu else on.precision


def metric_of(labels: Labels) -> str:
    """What the held-back labels are measured by (x100 in reports)."""
    return "spearman" if labels.scores is not None else f"mrr@{K}"


def _facts(source: str, labels: Labels, held: np.ndarray, outcome: Any) -> dict[str, Any]:
    """What a tuned model's folder records of its training (``semsearch.json``)."""
    measured = {"pairs": int(held.sum()), "metric": metric_of(labels), "before": outcome.before}
    return {"tuned_from": source, "labels": labels.kind, "held_back": {**measured, "after": outcome.best}}


def new_or_empty(output: Path) -> None:
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise BadInput(f"{output} exists and is not an empty directory: choose a new one")


def options_for(stored: Strategy) -> str:
    """The ``index`` options that embed with ``stored`` (its model: the tuned directory), or ''
    when ``--model DIR`` alone does (a single layer, no special-token rule: the directory's
    sentence-transformers config states the rest; a model with its own code needs the flag)."""
    from indexer.embedding.models import resolve_strategy
    from search.studies.sweep import reproduce

    trusted = stored.remote_code  # the tuned model runs the code it was tuned with
    plain = resolve_strategy(Strategy(model=stored.model, backend=stored.backend), trusted=trusted)
    if resolve_strategy(stored, trusted=trusted).differences(plain):
        return reproduce(stored)
    return f"--model {stored.model} --trust-remote-code" if trusted else ""


def index_strategy(index_dir: str | Path) -> Strategy:
    """The strategy an existing index was built with: what ``tune --index`` trains through."""
    from indexer.store import open_index

    return open_index(index_dir, vectors=False).strategy
