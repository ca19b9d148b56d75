"""What ``calibrate`` writes into an index, under the writer lock like any write: the no-answer
rule fitted on its questions (``search.studies.calibration``), the fused weight of its reranker
(``search.studies.fusion``), the keyword share of hybrid search; and what drops a rule."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from indexer.encoders.options import EmbeddingOptions
from indexer.store import Change, apply_change, live_meta, writer_lock
from search.read.confidence import Rule, score_kind, stored_form, stored_rules
from search.read.engine import SearchEngine
from search.read.hybrid import HYBRID, WEIGHT_KEY, check_weight
from search.read.queries import Query
from search.read.reranked import RERANKER_KEY, Reranking, RerankOptions
from search.read.snapshot import Snapshot
from search.studies.calibration import (
    Observation,
    check_features,
    check_precision,
    choose_rule,
    described_labels,
    embedded,
    fit_rule,
    observations,
    self_observations,
)
from search.studies.fusion import fit_fusion
from search.studies.labels import labelled
from search.studies.promise import GUARANTEE, UNANSWERABLE, check_share


def calibrate_index(
    index_dir: str | Path,
    questions: Sequence[Query] | None,
    qrels: Mapping[str, Mapping[str, int]] | None,
    *,
    precision: float = 0.95,
    features: Sequence[str] | None = None,
    guarantee: float | None = None,
    unanswerable: float | None = None,
    mode: str | None = None,
    wait: float = 0,
    progress: bool = False,
    no_answer: Collection[str] | None = None,
    reranking: Reranking | None = None,
    report: Callable[[str], None] = lambda line: None,
) -> Rule:
    """Fit the rule on labelled questions and store it in the index as a new version (under the
    writer lock, like any write). A question judged against ids the index lacks, or one the user
    says has no answer (``no_answer``; None: every question without a relevant judgement,
    ``labelled``), is an example of one it cannot answer; an unjudged one is left out (the
    rule's ``left_out``); each answerable one is also asked with its answers hidden
    (``observe``). No questions (None): made from the corpus itself (``self_observations``).
    ``mode``: the search mode the rule serves (None: the index's default,
    ``Snapshot.default_mode``): fitted on that mode's ranking and signals, and kept beside the
    rules of the other modes (a rule of the same mode is replaced). ``reranking``: with labelled
    questions and no weight given, its fused weight is fitted on them first
    (``search.studies.fusion``: 0 where it does not surely beat the first stage; ``report`` gets
    the verdict and, on a large set, the time it takes); the rule is fitted on the fused scores of
    that mode's candidates, stored under the reranker's score key
    (``search.read.confidence.rule_key``) beside the first stage's rules, and the reranker (with
    its weight) stored as the index's default (``search.read.reranked.RERANKER_KEY``), so a search
    reranks with it and its promise applies."""
    check_precision(precision)
    check_features(features, mode or HYBRID)
    guarantee = check_share("the guarantee", GUARANTEE if guarantee is None else guarantee)
    unanswerable = check_share(
        "the unanswerable share", UNANSWERABLE if unanswerable is None else unanswerable
    )
    asked, left_out = labelled(questions, qrels or {}, no_answer) if questions is not None else ([], 0)
    with writer_lock(Path(index_dir), wait):
        snapshot = SearchEngine(index_dir, rerank=False).snapshot  # a study reranks as it says
        mode = snapshot.mode(mode, fitting=True)
        check_features(features, mode)
        if questions is None:
            seen = self_observations(snapshot, mode=mode, progress=progress, reranking=reranking)
            source, counts = "self", {}
            measured = (
                f"{len(seen) // 2} questions made from the index's own texts (not questions users asked)"
            )
        else:
            seen, reranking = _labelled(snapshot, asked, qrels or {}, mode, progress, reranking, report)
            source, measured = "labels", described_labels(seen, left_out)
            read = [o for o in seen if not o.hidden]
            counts = {
                "asked": len(read),
                "asked_unanswerable": sum(not o.answerable for o in read),
                "left_out": left_out,
            }
        if features is None:
            rule = choose_rule(seen, precision, guarantee, unanswerable)
        else:
            rule = fit_rule(seen, precision, features, guarantee, unanswerable)
        created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        score = score_kind(None if reranking is None else reranking.reranker.folder.fingerprint)
        rule = replace(
            rule, source=source, measured_on=measured, created=created, mode=mode, score=score, **counts
        )
        kept = {**snapshot.stored, rule.key: rule}  # the other modes' and scores' rules stay beside it
        snapshot.close()
        meta: dict[str, object] = {"calibration": stored_form(kept)}
        if reranking is not None:
            meta[RERANKER_KEY] = stored_reranker(reranking)
        apply_change(index_dir, Change(meta=meta))
    return rule


def _labelled(
    snapshot: Snapshot,
    asked: Sequence[Query],
    qrels: Mapping[str, Mapping[str, int]],
    mode: str,
    progress: bool,
    reranking: Reranking | None,
    report: Callable[[str], None],
) -> tuple[list[Observation], Reranking | None]:
    """The labelled questions observed (``observations``), embedded once; reranked, at the weight
    given or fitted on them first (``search.studies.fusion``), the stage returned as fitted."""
    vectors = embedded(snapshot, [q.text for q in asked], progress)
    if reranking is not None and reranking.weight is None:
        reranking = fit_fusion(snapshot, asked, qrels, vectors, reranking, mode, report)[1]
    seen = observations(
        snapshot, asked, qrels, mode=mode, progress=progress, reranking=reranking, vectors=vectors
    )
    return seen, reranking


def stored_reranker(reranking: Reranking) -> dict[str, object]:
    """What an index keeps of its default reranker (``CrossFolder.stored``) and, where fitted or
    given, its weight."""
    weight = {} if reranking.weight is None else {"weight": reranking.weight}
    return {**reranking.reranker.folder.stored(), **weight}


def reranking_of(rerank: RerankOptions, options: EmbeddingOptions | None = None) -> Reranking | None:
    """The rerank stage a rule is fitted on (``RerankOptions.stage``; None: none named), at the
    weight it gives, else at one fitted on the labelled questions (``calibrate_index``)."""
    return rerank.stage(options=options)


def reranker_score(model: str | Path) -> str:
    """The score kind a reranker's rules are stored under (``score_kind``), read from its folder
    alone (nothing loaded)."""
    from indexer.embedding.cross_folder import read_cross_folder

    return score_kind(read_cross_folder(model).fingerprint)


def remove_calibration(
    index_dir: str | Path, wait: float = 0, mode: str | None = None, score: str = ""
) -> bool:
    """Drop the stored rules, or only ``mode``'s fitted on ``score`` (``score_kind``: the first
    stage's by default), or with ``score`` alone every mode's fitted on it (a new version, under the
    writer lock); False if there was none to drop."""
    with writer_lock(Path(index_dir), wait):
        rules = stored_rules(live_meta(Path(index_dir)).calibration)
        everything = mode is None and not score
        dropped = {
            key
            for key, rule in rules.items()
            if everything or (mode is None or rule.mode == mode) and rule.score == score
        }
        if not dropped:
            return False
        kept = {key: rule for key, rule in rules.items() if key not in dropped}
        # a version's meta keys are only ever set: {} is no rule
        apply_change(index_dir, Change(meta={"calibration": stored_form(kept)}))
    return True


def store_hybrid_weight(index_dir: str | Path, weight: float, wait: float = 0) -> float:
    """Store ``weight`` as the index's keyword share (``calibrate --hybrid-weight``: a new version,
    under the writer lock like any write, here beside the rule's writers so the read path writes
    nothing), checked first so a bad one writes nothing."""
    weight = check_weight(weight)
    with writer_lock(Path(index_dir), wait):
        apply_change(index_dir, Change(meta={WEIGHT_KEY: weight}))
    return weight
