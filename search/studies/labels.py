"""Labels for retrieval studies: questions and the qrels that judge which entries answer them
(BEIR's or TREC's layout), and how many of the judged entries the index searched holds: a label
naming an entry the index lacks scores 0 whatever the strategy, so a study says so, and stops
where it holds none (``held``)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from indexer.errors import BadInput
from indexer.reading.decoding import lines_of
from search.read.queries import Query, read_queries


def as_number(value: str) -> float | None:
    """``value`` as a number, or None where it is not one."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Judgements:
    """A qrels file as read: its relevant judgements (query id -> entry id -> relevance above 0),
    every query it judges (relevant entries or not), and whether it judges a pool (``pooled``)."""

    relevant: dict[str, dict[str, int]]
    judged: frozenset[str]
    pooled: bool
    """TREC's layout, or a judgement of 0: the file judges a pool of entries per query, so a query
    it never names is unjudged rather than one without an answer."""


def read_judgements(path: str | Path, encoding: str = "utf-8") -> Judgements:
    """BEIR layout: ``query_id doc_id relevance`` (tab or space separated, header optional), or
    TREC's ``query_id iteration doc_id relevance``."""
    path = Path(path)
    qrels: dict[str, dict[str, int]] = {}
    judged: set[str] = set()
    pooled = False
    for number, line in enumerate(lines_of(path, encoding), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) == 4:  # TREC: query_id iteration doc_id relevance
            parts, pooled = [parts[0], parts[2], parts[3]], pooled or as_number(parts[3]) is not None
        if len(parts) != 3 or as_number(parts[2]) is None:
            if number == 1:
                continue  # header
            raise BadInput(f"{path} line {number}: expected 'query_id doc_id relevance'")
        judged.add(parts[0])
        if float(parts[2]) > 0:
            qrels.setdefault(parts[0], {})[parts[1]] = int(float(parts[2]))
        else:
            pooled = True
    if not qrels:
        raise BadInput(f"{path}: no positive relevance judgements")
    return Judgements(qrels, frozenset(judged), pooled)


def read_qrels(path: str | Path, encoding: str = "utf-8") -> dict[str, dict[str, int]]:
    """The relevant judgements of a qrels file (``read_judgements``)."""
    return read_judgements(path, encoding).relevant


@dataclass(frozen=True)
class RetrievalSet:
    """Questions and their relevant judgements (``qrels``), and what the qrels file says of the
    questions it judges none relevant for (``judged``, ``pooled``: ``Judgements``)."""

    queries: list[Query]
    qrels: dict[str, dict[str, int]]
    judged: frozenset[str] = frozenset()
    pooled: bool = False

    def without_answer(self, named: Collection[str] | None = None) -> frozenset[str] | None:
        """The questions the labels say have no answer in the index, besides those judged
        relevant to entries it lacks (``calibration.observe`` finds those): the ``named`` ones
        (``--unanswerable-ids``) and those the qrels judge with none relevant. None where the
        labels follow the mixed-file convention (qrels of relevant judgements alone, nothing
        named): every question without a relevant judgement is one without an answer."""
        if named is None and not self.pooled:
            return None
        judged_none = {q.id for q in self.queries if q.id in self.judged and q.id not in self.qrels}
        return frozenset(named or ()) | judged_none

    def unjudged(self, named: Collection[str] | None = None) -> str | None:
        """How ``without_answer`` reads the questions with no relevant judgement, in one line
        (None: every question has one)."""
        without = [q.id for q in self.queries if q.id not in self.qrels]
        if not without:
            return None
        said = f"{len(without)} of the {len(self.queries)} questions have no relevant judgement"
        no_answer = self.without_answer(named)
        if no_answer is None:
            return (
                f"{said}: read as ones with no answer in the index (qrels of relevant judgements alone, "
                "beside questions they do not name: the mixed-file convention; evaluate scores the "
                "others); --unanswerable-ids FILE names those with no answer instead, the others left out"
            )
        named = set(named or ())
        counts = {
            "judged with none relevant read as ones with no answer in the index": sum(
                q in self.judged and q not in named for q in without
            ),
            "named by --unanswerable-ids read as ones with no answer in the index": len(named),
            "never judged left out, as evaluate leaves them out": sum(q not in no_answer for q in without),
        }
        parts = [f"{count} {how}" for how, count in counts.items() if count]
        why = (
            " (the qrels judge a pool: TREC's layout or judgements of 0; --unanswerable-ids FILE names "
            "those with no answer)"
            if self.pooled and not named
            else ""
        )
        return f"{said}: {'; '.join(parts)}{why}"


def read_retrieval_set(queries: str | Path, qrels: str | Path, encoding: str = "utf-8") -> RetrievalSet:
    """Queries (``search.read.queries.read_queries``: BEIR's queries.jsonl too) and their judgements,
    both in ``encoding``."""
    judged = read_judgements(qrels, encoding)
    return RetrievalSet(read_queries(str(queries), encoding), judged.relevant, judged.judged, judged.pooled)


SHOWN = 3
"""Missing judged ids a note names (the count says the rest)."""


def judged_ids(data: RetrievalSet) -> list[str]:
    """The entries judged relevant to the questions asked, each once, in the qrels' order."""
    asked = {q.id for q in data.queries}
    return list(dict.fromkeys(doc for q, docs in data.qrels.items() if q in asked for doc in docs))


def held(judged: Sequence[str], holding: Collection[str], reading: str) -> str | None:
    """One line saying how many of the ``judged`` ids are not among the ids the index holds
    (``holding``) and how the study reads their questions (``reading``); None where it holds
    all. ``BadInput`` where it holds none: every score would be 0, from labels of another corpus
    or a build that dropped the rows they name."""
    missing = [doc for doc in judged if doc not in holding]
    if not missing:
        return None
    if len(missing) == len(judged):
        raise BadInput(
            f"none of the {len(judged)} judged ids is in the index (e.g. {', '.join(missing[:SHOWN])}): "
            "are the qrels for this corpus, and did the build keep their rows?"
        )
    named = ", ".join(missing[:SHOWN]) + (", ..." if len(missing) > SHOWN else "")
    return f"{len(missing)} of the {len(judged)} judged ids are not in the index ({named}): {reading}"


def labelled(
    questions: Sequence[Query], qrels: Mapping[str, Mapping[str, int]], no_answer: Collection[str] | None
) -> tuple[list[Query], int]:
    """The questions a calibration reads, and how many it leaves out. Every question with a
    relevant judgement is read; one without is read as having no answer in the index where the
    user says so: in ``no_answer``, or, where that is None, every one (the mixed-file convention:
    qrels of relevant judgements alone, beside the questions without an answer). The others are
    unjudged and left out, as ``evaluate`` leaves them out."""
    if no_answer is None:
        return list(questions), 0
    unknown = sorted(set(no_answer) - {q.id for q in questions})
    if unknown:
        raise BadInput(f"{len(unknown)} unanswerable ids name no question asked: {', '.join(unknown[:3])}")
    relevant = sorted(set(no_answer) & set(qrels))
    if relevant:
        raise BadInput(f"{relevant[0]} is named unanswerable, but the qrels judge an entry relevant to it")
    kept = [q for q in questions if q.id in qrels or q.id in no_answer]
    return kept, len(questions) - len(kept)
