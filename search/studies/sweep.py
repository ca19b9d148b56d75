"""Which layer and pooling win on *your* data: a grid of strategies scored from one forward pass
per text (all hidden states at once), so the whole grid costs about as much as one strategy.

Grid: every single hidden state 0..L, last four summed / averaged / concatenated, first-last
average, times cls / mean / max / mean-max, plus the pooler output; optionally times
post-processing (none / center / whiten).

A retrieval sweep also searches its best cell by keywords and hybrid at each keyword share of
``search.read.hybrid.WEIGHTS``, ranked as an index of that strategy ranks (``Modes``): the weight to
store on the index (``calibrate --hybrid-weight``) measured on the user's own labels.
"""

from __future__ import annotations

import shlex
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from indexer.catalog import Catalog
from indexer.embedding.strategy import POOLINGS, POSTPROCESSES, ROLES, SWEPT, Strategy
from indexer.embedding.transform import Transform
from indexer.encoders.options import EmbeddingOptions, given
from indexer.errors import BadInput
from indexer.progress import Progress, note
from indexer.reading.corpus import Entry, read_corpus
from search.read.hybrid import (
    DEFAULT_WEIGHT,
    HYBRID,
    WEIGHTS,
    Ranking,
    Words,
    code_counts,
    depth,
    hybrid_ranking,
    keyword_scores,
)
from search.read.reranked import RerankOptions
from search.studies.evaluate import (
    Pairs,
    RetrievalSet,
    evaluate_retrieval,
    metric_names,
    pair_vectors,
    retrieval_metrics,
    sts_scores,
)
from search.studies.labels import held, judged_ids


@dataclass(frozen=True)
class SweepPlan:
    """What a sweep runs: the shared strategy (model, length, special tokens, whitening width) and
    the poolings and post-processings crossed with every layer choice."""

    base: Strategy
    poolings: tuple[str, ...] = SWEPT
    postprocesses: tuple[str, ...] = ("none",)

    @classmethod
    def checked(
        cls, base: Strategy, poolings: Sequence[str], postprocesses: Sequence[str], *, trusted: bool = False
    ) -> SweepPlan:
        """The plan, or ``BadInput`` naming what is wrong: checked against the model's config
        files only, so a mistake costs no model load and no pass over the data. ``trusted``: a
        model's own code may run (``--trust-remote-code``)."""
        from indexer.embedding.models import resolve_strategy

        pools, posts = tuple(dict.fromkeys(poolings)), tuple(dict.fromkeys(postprocesses))
        for kind, names, known in (("pooling", pools, POOLINGS), ("post-processing", posts, POSTPROCESSES)):
            if not names:
                raise BadInput(f"give at least one {kind} to sweep over")
            unknown = [n for n in names if n not in known]
            if unknown:
                raise BadInput(f"unknown {kind} {unknown[0]!r}: choose from {', '.join(known)}")
        if base.whiten_dims is not None and "whiten" not in posts:
            raise BadInput("whiten_dims needs 'whiten' among the post-processings")
        resolve_strategy(base, trusted=trusted)  # the model is there, layer and length ranges fit it
        return cls(base, pools, posts)


def plan_sweep(
    *,
    model: str | None = None,
    max_length: int | None = None,
    skip_special: bool = False,
    poolings: Sequence[str] = SWEPT,
    postprocesses: Sequence[str] = ("none",),
    whiten_dims: int | None = None,
    query_prefix: str | None = None,
    passage_prefix: str | None = None,
    trusted: bool = False,
) -> SweepPlan:
    """A checked plan from plain values (what the ``sweep`` options give)."""
    if whiten_dims is not None and whiten_dims < 1:
        raise BadInput(f"whiten_dims must be a positive number for whitening, not {whiten_dims}")
    base = Strategy(
        **({"model": model} if model else {}),
        max_length=max_length,
        skip_special=skip_special,
        postprocess="whiten" if whiten_dims else "none",
        whiten_dims=whiten_dims,
        query_prefix=query_prefix,
        passage_prefix=passage_prefix,
    )
    return SweepPlan.checked(base, poolings, postprocesses, trusted=trusted)


@dataclass(frozen=True)
class Cell:
    """One grid cell: a row label (the layer choice), the strategy, and its scores."""

    row: str
    strategy: Strategy
    scores: dict[str, float]


def layer_rows(num_layers: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(label, layers, combine) for every layer choice of the grid."""
    names = {0: " (embeddings)", num_layers - 1: " (second-to-last)", num_layers: " (last)"}
    rows = [(f"layer {i}{names.get(i, '')}", (i,), "mean") for i in range(num_layers + 1)]
    last4 = tuple(range(-min(4, num_layers + 1), 0))
    rows += [(f"last4 {combine}", last4, combine) for combine in ("sum", "mean", "concat")]
    rows.append(("first-last mean", (0, -1), "mean"))
    return rows


def grid(base: Strategy, num_layers: int, poolings: Sequence[str] = SWEPT) -> list[tuple[str, Strategy]]:
    """The cells: each layer row times each pooling. A model folder's modules after pooling (its
    Dense ones) run in the one cell of its own pooling of the last layer; the others read the
    network alone (``Strategy.resolve``)."""
    cells = []
    alone = replace(base, modules=(), width=None)
    for label, layers, combine in layer_rows(num_layers):
        for pooling in poolings:
            if pooling == "pooler":
                if layers == (num_layers,):  # the pooler reads the last layer: one cell, in that row
                    cells.append((label, replace(alone, layers=(-1,), combine="mean", pooling="pooler")))
                continue
            read = base if layers == (num_layers,) and pooling == base.pooling else alone
            cells.append((label, replace(read, layers=layers, combine=combine, pooling=pooling)))
    return cells


def _embed_grid(
    base: Strategy,
    texts: Sequence[tuple[Sequence[str], str]],
    poolings: Sequence[str],
    progress: bool,
    options: EmbeddingOptions | None = None,
):
    """Resolved (row, strategy) cells and, per (text list, role), each cell's vectors (embedded as
    ``options`` say): an index's entries are passages, its questions queries; STS sentences,
    compared with each other, are all queries."""
    from indexer.encoders.factory import torch_encoder

    embedder = torch_encoder(replace(base, postprocess="none", whiten_dims=None), options, all_layers=True)
    if getattr(embedder.model, "pooler", None) is None:  # DistilBERT, ModernBERT: no pooler to read
        poolings = [p for p in poolings if p != "pooler"]
        if not poolings:
            raise BadInput("this model has no pooler output: choose another pooling")
    cells = grid(embedder.strategy, embedder.num_layers, poolings)
    strategies = [s for _, s in cells]
    with Progress(sum(len(t) for t, _ in texts), "embedding", enabled=progress) as bar:
        vectors = [
            embedder.embed_grid(t, strategies, progress=bar.step(len(t)), role=role) for t, role in texts
        ]
    return cells, vectors


def sweep_sts(
    pairs: Pairs,
    base: Strategy | None = None,
    *,
    poolings: Sequence[str] = SWEPT,
    postprocesses: Sequence[str] = ("none",),
    progress: bool = False,
    options: EmbeddingOptions | None = None,
) -> list[Cell]:
    """Every cell's Spearman/Pearson on the pairs, best first (embedded as ``options`` say)."""
    trusted = given(options).trust_remote_code
    plan = SweepPlan.checked(base or Strategy(), poolings, postprocesses, trusted=trusted)
    base, postprocesses = plan.base, plan.postprocesses
    cells, (vectors,) = _embed_grid(base, [(pairs.sentences(), "query")], plan.poolings, progress, options)
    results = []
    for (row, strategy), raw in zip(cells, vectors, strict=True):
        for post in postprocesses:
            cell = replace(
                strategy, postprocess=post, whiten_dims=base.whiten_dims if post == "whiten" else None
            )
            processed = Transform.apply_optional(Transform.for_strategy(cell, raw), raw)
            results.append(Cell(row, cell, sts_scores(*pair_vectors(pairs, processed), pairs.gold)))
    return best_first(results, "spearman")


@dataclass(frozen=True)
class Modes:
    """A retrieval sweep's best cell searched three ways on the same labels: dense (the cell's own
    scores), keyword (BM25 of the corpus texts, as an index's keyword table ranks them) and hybrid
    at each keyword weight of ``WEIGHTS`` (an entry holding the query's codes first, as in a
    search)."""

    cell: Cell
    keyword: dict[str, float]
    hybrid: dict[float, dict[str, float]]  # keyword share -> metrics

    def best_weight(self, metric: str) -> float:
        """The share with the highest ``metric``, ties broken by the next metrics (``ranked_by``);
        a tie on every metric goes to the one nearest the default."""
        return max(self.hybrid, key=lambda w: (ranked_by(self.hybrid[w], metric), -abs(w - DEFAULT_WEIGHT)))

    def dense_wins(self, metric: str) -> bool:
        """No keyword share scores above dense on these labels (``metric``, ties broken by the
        next metrics): storing one would make the default search (hybrid) worse than
        ``--mode dense``."""
        return ranked_by(self.hybrid[self.best_weight(metric)], metric) <= ranked_by(self.cell.scores, metric)

    def keyword_wins(self, metric: str) -> bool:
        """Keyword search alone scores above dense and above hybrid at every weight (``metric``,
        ties broken by the next metrics): then no strategy's vectors help these questions."""
        best = max([self.cell.scores, *self.hybrid.values()], key=lambda scores: ranked_by(scores, metric))
        return ranked_by(self.keyword, metric) > ranked_by(best, metric)

    def saturated(self, metric: str) -> bool:
        """Whether ``metric`` scores the same in dense and at every weight: it cannot choose."""
        return saturated([self.cell.scores, *self.hybrid.values()], metric)


@dataclass(frozen=True)
class RetrievalSweep:
    cells: list[Cell]  # best first
    modes: Modes
    reranked: dict[str, Any] | None = None
    """The best cell's index searched in its default mode and reranked (``evaluate_retrieval``'s
    report with a reranker), where the sweep was given one."""


def retrieval_sweep(
    data: RetrievalSet,
    corpus: str | Path,
    base: Strategy | None = None,
    *,
    text_fields: Sequence[str] | None = None,
    poolings: Sequence[str] = SWEPT,
    postprocesses: Sequence[str] = ("none",),
    progress: bool = False,
    k: int = 10,
    metric: str | None = None,
    options: EmbeddingOptions | None = None,
    encoding: str = "utf-8",
    rerank: RerankOptions | None = None,
) -> RetrievalSweep:
    """Every cell's retrieval metrics at cutoff ``k`` (exact cosine search, as the index does),
    best first by ``metric`` (default ``mrr@k``), and the best cell's ``Modes``; ``encoding``:
    the corpus file's. ``rerank``: a cross-encoder re-ordering the best cell's first stage
    (``search.read.reranked.RerankOptions``): an index of that cell is built and searched, reranked by the
    search's own rerank stage (``evaluate.evaluate_retrieval``)."""
    metric = metric or f"mrr@{k}"
    if metric not in metric_names(k):
        raise BadInput(f"metric must be one of {', '.join(metric_names(k))}, not {metric!r}")
    trusted = given(options).trust_remote_code
    plan = SweepPlan.checked(base or Strategy(), poolings, postprocesses, trusted=trusted)
    base, postprocesses = plan.base, plan.postprocesses
    if rerank is not None and rerank.model is not None:  # said before the grid is embedded
        from indexer.embedding.cross_folder import read_cross_folder

        read_cross_folder(rerank.model)
        rerank.checked(k)
    entries = read_corpus(corpus, text_fields=text_fields, encoding=encoding).entries
    doc_ids = np.array([e.id for e in entries])
    missing = held(judged_ids(data), set(doc_ids.tolist()), "questions judged only against them score 0")
    if missing:  # said before the grid is embedded; none held stops here
        note(missing)
    cells, (docs, queries) = _embed_grid(
        base,
        [([e.text for e in entries], "passage"), ([q.text for q in data.queries], "query")],
        plan.poolings,
        progress,
        options,
    )
    top_k = min(k, len(entries))
    results, raw = [], []
    for (row, strategy), doc_raw, query_raw in zip(cells, docs, queries, strict=True):
        for post in postprocesses:
            cell = replace(
                strategy, postprocess=post, whiten_dims=base.whiten_dims if post == "whiten" else None
            )
            scores = _cosines(cell, doc_raw, query_raw)
            top = np.argsort(-scores, axis=1, kind="stable")[:, :top_k]
            found = {q.id: doc_ids[top[i]].tolist() for i, q in enumerate(data.queries)}
            results.append(Cell(row, cell, retrieval_metrics(found, data.qrels, k)))
            raw.append((doc_raw, query_raw))
    ordered = best_first(results, metric)
    best = ordered[0]
    cosines = _cosines(best.strategy, *raw[results.index(best)])  # again: keeping every cell's costs memory
    modes = _modes(best, cosines, entries, data, k)
    if rerank is None or rerank.model is None:
        return RetrievalSweep(ordered, modes)
    reranked = evaluate_retrieval(
        data,
        corpus=corpus,
        strategy=best.strategy,
        text_fields=text_fields,
        k=k,
        progress=progress,
        options=options,
        encoding=encoding,
        rerank=rerank,
    )
    return RetrievalSweep(ordered, modes, reranked)


def _cosines(cell: Strategy, doc_raw: np.ndarray, query_raw: np.ndarray) -> np.ndarray:
    """Query x document cosines of one cell, post-processed as an index of it would be."""
    transform = Transform.for_strategy(cell, doc_raw)  # fitted on the corpus, as an index is
    d = Transform.apply_optional(transform, doc_raw)
    q = Transform.apply_optional(transform, query_raw)
    d = d / np.linalg.norm(d, axis=1, keepdims=True).clip(min=1e-12)
    q = q / np.linalg.norm(q, axis=1, keepdims=True).clip(min=1e-12)
    return q @ d.T


def keyword_rankings(
    entries: Sequence[Entry], said: Sequence[Words], count: int
) -> list[tuple[Ranking, dict[int, int]]]:
    """Each query's ``count`` best keyword matches (entry position -> keyword share) and the
    entries holding its codes (position -> how many: ``code_counts``), from the same FTS5 table
    an index keeps (``indexer.catalog``), made in a temporary file."""
    with tempfile.TemporaryDirectory(prefix="semsearch-sweep-") as tmp:
        catalog = Catalog.create(Path(tmp) / "keywords.db", {})
        try:
            catalog.put(entries, range(len(entries)), [1] * len(entries))
            everyone = range(len(entries))
            return [(keyword_scores(catalog, w, count), code_counts(catalog, w, everyone)) for w in said]
        finally:
            catalog.close()


def _modes(best: Cell, cosines: np.ndarray, entries: Sequence[Entry], data: RetrievalSet, k: int) -> Modes:
    """``Modes`` of the best cell from its cosines: keyword and hybrid fetched as a search does."""
    doc_ids = np.array([e.id for e in entries])
    said = [Words(q.text, HYBRID) for q in data.queries]
    keyword = keyword_rankings(entries, said, depth(k))
    top = np.argsort(-cosines, axis=1, kind="stable")[:, : depth(k)]  # the most a search fetches

    def hybrid(i: int, weight: float) -> Ranking:
        words, holders = keyword[i]
        near = {int(j): float(cosines[i, j]) for j in top[i]}
        exact = lambda rows: {j: float(cosines[i, j]) for j in rows}  # noqa: E731 (row i's cosines)
        return hybrid_ranking(near, words, said[i], k, exact, lambda _: holders, weight=weight)

    def measured(rankings: Sequence[Ranking]) -> dict[str, float]:
        found = {q.id: doc_ids[list(hits)].tolist() for q, hits in zip(data.queries, rankings, strict=True)}
        return retrieval_metrics(found, data.qrels, k)

    by_keyword = measured([dict(list(words.items())[:k]) for words, _ in keyword])
    by_weight = {w: measured([hybrid(i, w) for i in range(len(data.queries))]) for w in WEIGHTS}
    return Modes(best, by_keyword, by_weight)


COUNTS = ("queries", "pairs")
"""The entries of a cell's scores that count what was measured rather than score it."""


def tie_breakers(scores: Mapping[str, float], metric: str) -> list[str]:
    """The other metrics, which break ``metric``'s ties in the order a report lists them (after
    MRR@k, nDCG@k: graded qrels tell apart what a saturated MRR cannot)."""
    return [name for name in scores if name != metric and name not in COUNTS]


def _value(scores: Mapping[str, float], name: str) -> float:
    """One score as it ranks: one that is not a number (constant vectors give NaN correlations)
    below any other."""
    value = float(scores[name])
    return value if np.isfinite(value) else -np.inf


def ranked_by(scores: Mapping[str, float], metric: str) -> tuple[float, ...]:
    """``scores`` as a sort key, higher better: ``metric``, then each of its ``tie_breakers``."""
    return tuple(_value(scores, name) for name in (metric, *tie_breakers(scores, metric)))


def deciding(first: Mapping[str, float], second: Mapping[str, float], metric: str) -> str:
    """The metric that ranks ``first`` against ``second``: ``metric``, or where they tie on it,
    the first of its ``tie_breakers`` on which they differ (``metric`` where they tie on all)."""
    differing = (n for n in tie_breakers(first, metric) if _value(first, n) != _value(second, n))
    return metric if _value(first, metric) != _value(second, metric) else next(differing, metric)


def saturated(measured: Sequence[Mapping[str, float]], metric: str) -> bool:
    """Whether ``metric`` scores the same everywhere in ``measured`` (more than one): then it tells
    nothing apart (an MRR of 1 where every query's first hit is relevant), and its ties are
    broken by the next metrics."""
    values = {_value(scores, metric) for scores in measured}
    return len(measured) > 1 and len(values) == 1 and np.isfinite(values.pop())


def best_first(cells: list[Cell], metric: str) -> list[Cell]:
    """Highest ``metric`` first, ties broken by the next metrics (``ranked_by``); a cell with no
    score last."""
    return sorted(cells, key=lambda c: tuple(-value for value in ranked_by(c.scores, metric)))


def reproduce(strategy: Strategy) -> str:
    """The `semsearch index` options that give this cell's strategy."""
    parts = [f"--model {strategy.model}"] if strategy.model != Strategy().model else []
    parts.append("--layers " + ",".join(str(i) for i in strategy.layers or ()))
    if strategy.layers and len(strategy.layers) > 1:
        parts.append(f"--combine {strategy.combine}")
    parts.append(f"--pooling {strategy.pooling}")
    if strategy.skip_special:
        parts.append("--skip-special")
    if strategy.remote_code:
        parts.append("--trust-remote-code")
    if strategy.postprocess != "none":
        parts.append(f"--postprocess {strategy.postprocess}")
        if strategy.whiten_dims:
            parts.append(f"--whiten-dims {strategy.whiten_dims}")
    for role in ROLES:
        if strategy.prefix(role):
            parts.append(f"--{role}-prefix {shlex.quote(strategy.prefix(role))}")
    return " ".join(parts)
