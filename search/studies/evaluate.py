"""Measure a strategy on the user's own data: STS (correlation of cosine with gold similarity) and
retrieval (MRR, nDCG, recall and success of ranked hits against relevance judgements).

Retrieval metrics are written here (a few lines each, BEIR/trec_eval definitions with linear gain)
rather than pulled from pytrec_eval or ranx: those bring a compiler step or numba for arithmetic
this small. Correlations come from scipy.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from indexer.embedding.fields import FieldScoring
from indexer.embedding.strategy import Strategy
from indexer.encoders.options import EmbeddingOptions
from indexer.errors import BadInput
from indexer.progress import Progress, note
from indexer.reading.corpus import Rejection, rejection_summary
from indexer.reading.decoding import GZIP_SUFFIX, lines_of
from search.read.hybrid import MODES
from search.studies.labels import RetrievalSet, as_number, held, judged_ids
from search.studies.labels import read_judgements as read_judgements  # where studies read them
from search.studies.labels import read_qrels as read_qrels
from search.studies.labels import read_retrieval_set as read_retrieval_set

if TYPE_CHECKING:
    from indexer.encoders.rerankers import Reranker
    from search.read.requests import Hit
    from search.read.reranked import RerankOptions
    from search.read.snapshot import Plan, Snapshot


@dataclass(frozen=True)
class Pairs:
    first: list[str]
    second: list[str]
    gold: np.ndarray
    scored: bool = True
    """False: pairs read without a score column (each a positive pair; ``gold`` is all ones)."""
    rejected: tuple[Rejection, ...] = ()
    """The rows that gave no pair, with why (printed as an index's rejected rows are)."""

    def sentences(self) -> list[str]:
        """Each distinct sentence once, so a sentence shared by pairs is embedded once."""
        return list(dict.fromkeys(self.first + self.second))


def read_pairs(
    path: str | Path,
    s1: str = "sentence1",
    s2: str = "sentence2",
    score: str = "score",
    *,
    need_score: bool = True,
    encoding: str = "utf-8",
) -> Pairs:
    """Sentence pairs with gold scores from CSV/TSV with a header, JSONL, or the original STS
    Benchmark files (tab-separated, no header: genre, file, year, id, score, s1, s2, ...).
    Without ``need_score``, a file with no score column gives positive pairs (``scored`` False):
    its ``s1``/``s2`` columns, or its only two columns. Lines are split as a corpus's are, and
    one ``encoding`` cannot decode is an error naming the encoding to try."""
    path = Path(path)
    lines = lines_of(path, encoding)
    named = Path(path.stem) if path.suffix.lower() == GZIP_SUFFIX else path  # pairs.jsonl.gz: JSON Lines
    if named.suffix.lower() in (".jsonl", ".ndjson"):
        rows = [json.loads(line) for line in lines if line.strip()]
        keys = list(rows[0]) if rows and isinstance(rows[0], dict) else []
        if not need_score and {s1, s2} - set(keys) and len(keys) == 2:
            rows = [dict(zip((s1, s2), (r.get(k) for k in keys), strict=True)) for r in rows]
    else:
        tabbed = "\t" in (lines[0] if lines else "")
        # a lone \r ends a CSV record, as in a corpus
        records = [piece for line in lines for piece in line.split("\r")]
        reader = csv.reader(records, **({"delimiter": "\t", "quoting": csv.QUOTE_NONE} if tabbed else {}))
        table = [row for row in reader if row]
        if not table:
            raise BadInput(f"{path} is empty")
        header = [h.strip() for h in table[0]]
        if {s1, s2, score} <= set(header) or (not need_score and {s1, s2} <= set(header)):
            rows = [dict(zip(header, row, strict=False)) for row in table[1:]]
        elif len(header) >= 7 and as_number(header[4]) is not None:  # STS Benchmark as distributed
            rows = [{score: r[4], s1: r[5], s2: r[6]} for r in table if len(r) >= 7]
        elif len(header) == 3 and as_number(header[2]) is not None:  # text, text, score; no header
            rows = [{s1: r[0], s2: r[1], score: r[2]} for r in table if len(r) == 3]
        elif not need_score and len(header) == 2:  # two text columns, named anything
            rows = [dict(zip((s1, s2), row, strict=False)) for row in table[1:]]
        else:
            raise BadInput(
                f"{path}: no columns {s1!r}, {s2!r}, {score!r} in the header "
                f"({', '.join(ascii(h[:30]) for h in header[:8])}); "
                "name them with --sentence1/--sentence2/--score"
            )
    scored = need_score or any(isinstance(r, dict) and r.get(score) not in (None, "") for r in rows)
    usable: list[tuple[str, str, float]] = []
    rejected: list[Rejection] = []
    for number, row in enumerate(rows, 1):
        reason = _unusable(row, (s1, s2), score if scored else None)
        if reason:
            rejected.append(Rejection(number, reason))
        else:
            usable.append((str(row[s1]), str(row[s2]), as_number(row[score]) if scored else 1.0))
    if len(usable) < 3:
        dropped = f" ({len(rejected)} rows rejected: {rejection_summary(rejected)})" if rejected else ""
        raise BadInput(f"{path}: fewer than 3 usable sentence pairs{dropped}")
    gold = np.array([g for _, _, g in usable])
    if scored and np.ptp(gold) == 0:
        raise BadInput(
            f"{path}: all {len(usable)} pairs score {gold[0]:g}: a correlation needs two different scores, "
            "and so does learning an order"
        )
    return Pairs([a for a, _, _ in usable], [b for _, b, _ in usable], gold, scored, tuple(rejected))


def _unusable(row: object, texts: tuple[str, str], score: str | None) -> str | None:
    """Why a row gives no pair (None: it does): a missing sentence, or a score that is missing
    or not a finite number (NaN and infinity rank nothing)."""
    if not isinstance(row, dict):
        return "not an object"
    for name in texts:
        if not row.get(name):
            return f"no {name}"
    if score is None:
        return None
    value = row.get(score)
    if value in (None, ""):
        return f"no {score}"
    read = as_number(value)
    finite = read is not None and math.isfinite(read)
    return None if finite else f"{score} is not a finite number: {value!r}"


def sts_scores(first: np.ndarray, second: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    """Spearman and Pearson x100 between pair cosines and gold scores."""
    a = first / np.linalg.norm(first, axis=1, keepdims=True).clip(min=1e-12)
    b = second / np.linalg.norm(second, axis=1, keepdims=True).clip(min=1e-12)
    return correlations((a * b).sum(axis=1), gold)


def correlations(scores: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    """Spearman and Pearson x100 between one score per pair (a cosine, a cross-encoder's) and gold."""
    from scipy.stats import pearsonr, spearmanr

    with warnings.catch_warnings():  # constant scores (e.g. layer-0 [CLS]) give NaN, said in the table
        warnings.simplefilter("ignore")
        return {
            "spearman": float(spearmanr(scores, gold).statistic * 100),
            "pearson": float(pearsonr(scores, gold).statistic * 100),
            "pairs": len(gold),
        }


def pair_vectors(pairs: Pairs, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``vectors`` (one per ``pairs.sentences()``) for the first and second sentences."""
    position = {s: i for i, s in enumerate(pairs.sentences())}
    return vectors[[position[s] for s in pairs.first]], vectors[[position[s] for s in pairs.second]]


def evaluate_sts(
    pairs: Pairs,
    strategy: Strategy | None = None,
    *,
    progress: bool = False,
    options: EmbeddingOptions | None = None,
) -> dict[str, float]:
    """Embed every sentence once with the strategy (post-processing fitted on these sentences), on
    the encoder an index of it would be built with (no torch once its graph is cached), as
    ``options`` say (``indexer.encoders.options``)."""
    from indexer.embedding.transform import Transform
    from indexer.encoders.factory import encoder_for

    embedder = encoder_for(strategy, options)
    sentences = pairs.sentences()
    with Progress(len(sentences), "embedding", enabled=progress) as bar:
        vectors = embedder.embed(sentences, progress=bar.step(len(sentences)))
    vectors = Transform.apply_optional(Transform.for_strategy(embedder.strategy, vectors), vectors)
    return {**sts_scores(*pair_vectors(pairs, vectors), pairs.gold), "strategy": embedder.strategy.describe()}


PAIRS_AT_ONCE = 512
"""Pairs a reranker scores in one call of a study, between moves of its progress bar."""


def evaluate_sts_reranked(
    pairs: Pairs,
    model: str | Path,
    *,
    progress: bool = False,
    options: EmbeddingOptions | None = None,
) -> dict[str, float | str]:
    """Spearman and Pearson of a cross-encoder's score of each pair (after its activation, as
    ``CrossEncoder.predict`` gives it) against gold: the reranker read as the STS model it is,
    on the runtime ``reranker_for`` decides (``indexer.encoders.rerankers``)."""
    reranker = reranker_of(model, options)
    asked = list(zip(pairs.first, pairs.second, strict=True))
    parts = []
    with Progress(len(asked), "scoring pairs", enabled=progress) as bar:
        for start in range(0, len(asked), PAIRS_AT_ONCE):  # a pair's score is its own: the bar moves
            parts.append(reranker.score_pairs(asked[start : start + PAIRS_AT_ONCE]))
            bar.step(len(parts[-1]))(1.0)
    scores = np.concatenate(parts)
    return {**correlations(scores, pairs.gold), "reranker": described_reranker(reranker)}


def described_reranker(reranker: Reranker) -> str:
    """What a report says a reranker is: its folder, runtime and activation."""
    folder = reranker.folder
    return f"{folder.path} ({folder.architecture}, {folder.activation} activation, on {reranker.runtime})"


def metric_names(k: int = 10) -> list[str]:
    """The retrieval metrics, named by the cutoff they are computed at."""
    return [f"mrr@{k}", f"ndcg@{k}", "recall@1", f"recall@{k}", "success@1", "success@3"]


def retrieval_metrics(
    ranked: Mapping[str, Sequence[str]], qrels: Mapping[str, Mapping[str, int]], k: int = 10
) -> dict[str, float]:
    """MRR@k, nDCG@k (linear gain), Recall@1/@k and Success@1/@3 averaged over judged queries;
    ``k`` a whole number as a search takes it (``check_k``: no bool, no float)."""
    from search.read.requests import check_k

    k = check_k(k)
    mrr, ndcg, recall1, recall, success1, success3 = metric_names(k)
    totals = dict.fromkeys(metric_names(k), 0.0)
    judged = [q for q in ranked if q in qrels]
    if not judged:
        raise BadInput("no query has relevance judgements: check that the query ids match the qrels")
    for query_id in judged:
        relevant = qrels[query_id]
        hits = list(ranked[query_id])[:k]
        gains = [relevant.get(doc, 0) for doc in hits]
        first = next((rank for rank, g in enumerate(gains, 1) if g > 0), None)
        totals[mrr] += 1 / first if first else 0.0
        dcg = sum(g / math.log2(rank + 1) for rank, g in enumerate(gains, 1))
        ideal = sorted(relevant.values(), reverse=True)[:k]
        totals[ndcg] += dcg / sum(g / math.log2(rank + 1) for rank, g in enumerate(ideal, 1))
        totals[recall1] += sum(g > 0 for g in gains[:1]) / len(relevant)
        totals[recall] += sum(g > 0 for g in gains) / len(relevant)
        totals[success1] += float(first == 1)
        totals[success3] += float(first is not None and first <= 3)
    return {**{name: value / len(judged) for name, value in totals.items()}, "queries": len(judged)}


def evaluate_retrieval(
    data: RetrievalSet,
    *,
    index_dir: str | Path | None = None,
    corpus: str | Path | None = None,
    strategy: Strategy | None = None,
    text_fields: Sequence[str] | None = None,
    k: int = 10,
    also: FieldScoring | None = None,
    progress: bool = False,
    options: EmbeddingOptions | None = None,
    encoding: str = "utf-8",
    rerank: RerankOptions | None = None,
) -> dict[str, Any]:
    """Query an existing index, or build a temporary one from ``corpus`` (in ``encoding``) with
    ``strategy`` (and ``also`` fields) embedded as ``options`` say; metrics at cutoff ``k`` in
    every mode the index serves. ``rerank``: a cross-encoder re-ordering the default mode's best
    (``search.read.reranked.RerankOptions``) through the search's own rerank stage, a batch of
    questions at a time: its metrics first, each mode's first stage beside them."""
    from search.read.requests import check_k
    from search.studies.calibration import RERANKED_AT_ONCE, embedded

    k = check_k(k)  # before an index is opened or built
    built = {"text_fields": text_fields, "also": also, "options": options}
    with opened(index_dir, corpus, strategy, progress=progress, encoding=encoding, **built) as snapshot:
        judged = judged_ids(data)
        missing = held(judged, snapshot.holding(judged), "questions judged only against them score 0")
        if missing:
            note(missing)
        texts = [q.text for q in data.queries]
        vectors = embedded(snapshot, texts, progress)
        default = snapshot.mode(None)

        def measured(results: Sequence[Sequence[Hit]]) -> dict[str, float]:
            ranked = {q.id: [h.id for h in hits] for q, hits in zip(data.queries, results, strict=True)}
            return retrieval_metrics(ranked, data.qrels, k)

        report: dict[str, Any] = {}
        if rerank is not None and rerank.model is not None:
            fields = {"mode": default, "rerank": rerank}
            whole = snapshot.plan(texts, k, reranker=rerank.load(options), **fields)
            found: list[list[Hit]] = []
            with Progress(len(texts), "reranking", enabled=progress) as bar:
                for start in range(0, len(texts), RERANKED_AT_ONCE):  # the bar moves as they are reranked
                    part = texts[start : start + RERANKED_AT_ONCE]
                    plan = snapshot.plan(part, k, reranker=whole.reranker, **fields)
                    found += snapshot.run(plan, vectors[start : start + len(part)])
                    bar.step(len(part))(1.0)
            report = {**measured(found), "mode": f"{default} reranked", **reranked(whole)}
        for mode in modes_served(snapshot):
            scores = measured(snapshot.run(snapshot.plan(texts, k, mode=mode), vectors))
            if mode == default and "reranker" not in report:
                report = {**scores, "mode": mode, **report}
            report.update({f"{mode} {name}": value for name, value in scores.items() if name != "queries"})
        return {**report, **described(snapshot)}


def reranker_of(model: str | Path, options: EmbeddingOptions | None = None) -> Reranker:
    """The reranker of ``model`` (``search.read.reranked.load_reranker``), loaded once for a study."""
    from search.read.reranked import load_reranker

    return load_reranker(model, options)


def reranked(plan: Plan) -> dict[str, str]:
    """What a report of a reranked search adds (nothing where it is not reranked): the reranker
    and how deep it reranked."""
    if plan.reranker is None:
        return {}
    return {"reranker": described_reranker(plan.reranker), "rerank depth": str(plan.reranking.depth)}


@contextlib.contextmanager
def opened(
    index_dir: str | Path | None,
    corpus: str | Path | None,
    strategy: Strategy | None = None,
    *,
    progress: bool = False,
    encoding: str = "utf-8",
    **build: Any,
) -> Iterator[Snapshot]:
    """The snapshot a study searches: of ``index_dir``, else of a temporary index built from
    ``corpus`` (in ``encoding``) with ``strategy`` and the ``build_index`` options ``build``
    (text fields, also fields, embedding options...), removed when the study is done."""
    from indexer.writing.build import build_index
    from search.read.engine import SearchEngine

    with tempfile.TemporaryDirectory(prefix="semsearch-study-") as tmp:
        if index_dir is None:
            if corpus is None:
                raise BadInput("give a corpus to index, or an existing index")
            index_dir = Path(tmp) / "index"
            build_index(
                corpus,
                index_dir,
                strategy,
                progress=progress,
                encoding=encoding,
                **build,
            )
        yield SearchEngine(index_dir, rerank=False).snapshot  # a study reranks as it says, never by default


def modes_served(snapshot: Snapshot) -> list[str]:
    """The search modes (``search.read.hybrid.MODES``) this index answers in, side by side in a report."""
    served = []
    for mode in MODES:
        with contextlib.suppress(BadInput):
            served.append(snapshot.serves(mode))
    return served


def described(snapshot: Snapshot) -> dict[str, str]:
    """What an evaluation ran on: the strategy, and the also fields when the index scores two."""
    scoring = snapshot.scoring
    also = {"also": f"{','.join(scoring.also)} weight {scoring.weight:g}"} if scoring else {}
    return {"strategy": snapshot.index.strategy.describe(), **also}
