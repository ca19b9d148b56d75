"""The micro-batcher: every text the server embeds (and every pair a reranker scores: ``Pairs``)
goes through it to the one model thread, in batches of whatever is waiting, and each batch's
lookups run together on one lookup thread.

A request's texts are tokenised as it arrives (``tokenize``), so every bound is counted in the
tokens the model will read, as text-embeddings-inference counts them: the model work one request
may cause (``MAX_REQUEST_TOKENS``), the parts a long request is queued in (``PART_TOKENS``), and
what one batch takes from the queue (up to ``max_batch`` texts and the encoder's token budget per
batch, ``indexer.embedding.batching``, whose one rule then cuts the batch into passes). A request
of a few texts that no bound can refuse (``few``) is tokenised instead on the model thread with
the rest of its batch, in one call of the tokenizer that leaves the event loop (and the GIL) to
the HTTP work of the others (``embed_few``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import groupby
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np

from indexer.errors import BadInput
from indexer.vectors import single_threaded

if TYPE_CHECKING:  # queries are embedded without torch (indexer.encoders.onnx_encoder)
    from indexer.encoders.base import NetworkEncoder
    from indexer.encoders.rerankers import PairTokens, Reranker
    from search.read.encoding import Encoding, Roles

MAX_REQUEST_TOKENS = 64 * 256
"""Model work one request may cause, in the tokens the model reads (prefixes and special tokens
included, each text cut at the strategy's max_length): as much as a full batch of 64 queries at
256 tokens, about 10 s of a 2-core machine under load with the default model, at the worst."""
PART_TOKENS = 4096
"""A request's texts reach the model in parts of at most this many tokens, each queued when the one
before is done: other requests get their turn in between, and a request whose client hangs up
stops after the part being embedded."""
INLINE_CHARACTERS = 20_000
"""Up to this many characters a request is tokenised on the event loop (well under a millisecond
for a few queries); a larger one on a worker thread, so it never stalls the other requests."""

FEW_TOKENS = 512
"""A request whose texts cannot read more than this many tokens (its texts times the model's
max_length) is ``few``: it fits one part and any request budget, whatever its texts tokenise to."""

MAX_WAITING = 64
"""Lookups that may wait on the batcher at once (reranked searches, each on a thread of its own
until its pairs are scored); a thread is started only when none is idle."""

T = TypeVar("T")

Tokens = list[list[int]]


def check_budget(ids: Tokens) -> None:
    """Refuse a request whose texts cost the model more than ``MAX_REQUEST_TOKENS``."""
    cost = sum(map(len, ids))
    if cost > MAX_REQUEST_TOKENS:
        raise BadInput(
            f"too much text for one request: {cost} tokens to embed, at most {MAX_REQUEST_TOKENS} "
            "(each text cut at the model's max_length): split it"
        )


def few(encoding: Encoding, texts: Sequence[str]) -> bool:
    """Whether ``texts`` may be tokenised on the model thread with their batch (``embed_few``):
    whatever they tokenise to, no bound refuses or splits them (``FEW_TOKENS``)."""
    if not encoding.embeds or sum(map(len, texts)) > INLINE_CHARACTERS:
        return False
    return len(texts) * cast("NetworkEncoder", encoding.embedder).tokens.max_length <= FEW_TOKENS


def split(ids: Tokens, budget: int = PART_TOKENS) -> list[Tokens]:
    """Consecutive parts of ``ids`` of at most ``budget`` tokens each (one text at least)."""
    parts: list[Tokens] = [[]]
    cost = 0
    for text in ids:
        if parts[-1] and cost + len(text) > budget:
            parts.append([])
            cost = 0
        parts[-1].append(text)
        cost += len(text)
    return parts


class Pairs:
    """A reranker as the batcher runs it (one per reranker, so concurrent requests share batches):
    its pairs' tokens (``PairTokens``, each counted by its length) are the texts, and their scores
    (one per pair, ``Reranker.score_tokens``) the vectors."""

    def __init__(self, reranker: Reranker):
        self.reranker = reranker

    @property
    def budget(self) -> int:
        """The tokens of one batch of passes: the reranker's batching rule."""
        return self.reranker.batching.tokens

    def tokenize(self, question: str, texts: Sequence[str]) -> list[PairTokens]:
        return self.reranker.pair_tokens(question, texts)

    def embed_tokens(self, ids: Sequence[PairTokens]) -> np.ndarray:
        return self.reranker.score_tokens(ids)


class Batched:
    """A reranker whose pairs a search's rerank stage (``search.read.lookup``) scores through the
    micro-batcher: on the model thread, in batches shared with other requests (concurrent
    searches' pairs meet in one), while the search's lookup waits on a thread of its own
    (``MicroBatcher.waiting``), never on the lookup thread other requests need. Jobs with nothing
    to run after are answered without a lookup thread (``MicroBatcher._run``), so the wait cannot
    block its own answer."""

    def __init__(self, pairs: Pairs, batcher: MicroBatcher, loop: asyncio.AbstractEventLoop):
        self.pairs, self.batcher, self.loop = pairs, batcher, loop
        self.folder = pairs.reranker.folder

    def score(self, question: str, texts: Sequence[str]) -> np.ndarray:
        return self.score_pairs([(question, text) for text in texts])

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """Each (question, text) pair's score: a search's whole batch of pairs in one job."""
        ids = [
            tokens
            for question, asked in groupby(pairs, key=lambda pair: pair[0])
            for tokens in self.pairs.tokenize(question, [text for _, text in asked])
        ]
        scoring = self.batcher.run_tokens(self.pairs, ids, None)
        return asyncio.run_coroutine_threadsafe(scoring, self.loop).result()


def batch_tokens(encoding: Encoding | Pairs) -> int:
    """The tokens one batch may take from the queue: the model's budget for a batch of passes."""
    if isinstance(encoding, Pairs):
        return encoding.budget
    return cast("NetworkEncoder", encoding.embedder).decision.batching.tokens


@dataclass
class _Job:
    encoding: Encoding | Pairs
    ids: Tokens | None  # each text's token ids, its role's prefix included; None: ``texts``
    future: asyncio.Future
    after: Callable[[np.ndarray], Any] | None = None  # run on the lookup thread with the vectors
    waits: bool = False  # ``after`` may wait on the batcher itself (a search's rerank pairs)
    texts: Sequence[str] = ()  # ``few`` texts, tokenised as ``role`` on the model thread
    role: Roles = "query"
    counted: bool = False  # its future gets (vectors, the tokens the model read)
    rows: int = field(init=False)
    tokens: int = field(init=False)  # what it takes of a batch's budget

    def __post_init__(self) -> None:
        if self.ids is None:  # counted at a token a character (most tokens cover several)
            self.rows, self.tokens = len(self.texts), sum(len(text) + 2 for text in self.texts)
        else:
            self.rows, self.tokens = len(self.ids), sum(map(len, self.ids))


def _tokenized(encoding: Encoding, jobs: list[_Job]) -> list[Exception | None]:
    """Token ids for each job that came as text (``job.ids``), all in one call of the tokenizer;
    each job's failure: a text with no tokens the model reads fails its own request alone."""
    raw = [job for job in jobs if job.ids is None]
    texts = [text for job in raw for text in job.texts]
    roles = [role for job in raw for role in _roles(job)]
    try:
        ids = encoding.tokenize(texts, roles) if raw else []
    except BadInput:  # one request's text: each tokenised alone, to tell whose
        failed: dict[int, Exception] = {}
        for job in raw:
            try:
                job.ids = encoding.tokenize(job.texts, job.role)
            except BadInput as exc:
                failed[id(job)] = exc
        return [failed.get(id(job)) for job in jobs]
    start = 0
    for job in raw:
        job.ids, start = ids[start : start + job.rows], start + job.rows
    return [None] * len(jobs)


def _roles(job: _Job) -> list[str]:
    return [job.role] * job.rows if isinstance(job.role, str) else list(job.role)


def _embed(encoding: Encoding | Pairs, jobs: list[_Job]) -> tuple[np.ndarray | None, list[Exception | None]]:
    """On the model thread: the vectors of the jobs' texts (tokenising those that came as text,
    ``_tokenized``), None if every job failed, and each job's failure."""
    failures = [None] * len(jobs) if isinstance(encoding, Pairs) else _tokenized(encoding, jobs)
    ids = [text for job, failed in zip(jobs, failures, strict=True) if failed is None for text in job.ids]
    return (encoding.embed_tokens(ids) if ids else None), failures


def _outcomes(jobs: list[_Job], vectors: list[np.ndarray]) -> list[tuple[bool, Any]]:
    """Each job's ``after`` of its vectors (or the vectors), as (True, result) or (False, error);
    a job whose request is gone meanwhile is skipped."""
    outcomes: list[tuple[bool, Any]] = []
    for job, mine in zip(jobs, vectors, strict=True):
        try:
            skip = job.future.done() or job.after is None
            outcomes.append((True, mine if skip else job.after(mine)))
        except Exception as exc:  # the request's own failure (a bad min score, an unreadable index)
            outcomes.append((False, exc))
    return outcomes


class MicroBatcher:
    """Collects concurrent embedding requests and runs them as batches on the one model thread.

    A batch costs two hops off the event loop, whatever its size: the model thread embeds it (in
    the passes the one batching rule plans from its token counts, ``indexer.embedding.batching``:
    a short query is not padded to a long sentence), then the lookup thread runs each job's
    ``after`` (FAISS, SQLite) while the model thread takes the next batch, and hands all the
    answers back at once. A job whose ``after`` waits on the batcher itself (a reranked search
    scores its pairs through it: ``Batched``) runs on a thread of its own from ``waiting``, so
    concurrent searches' pairs meet in the model's batches and no lookup waits on another's.

    Jobs whose requests are gone (cancelled) by the time their batch runs are dropped unembedded;
    a failed or cancelled job never stops the worker, and a worker task that ended is restarted.
    Jobs are grouped by encoding, so each request embeds with its own snapshot's model and
    post-processing, each text read as its role (its prefix). ``run`` is the embedding step of the
    query pipeline (``search.read.requests.Embedding``).
    """

    def __init__(self, max_batch: int):
        self.max_batch = max_batch
        self.model_thread = ThreadPoolExecutor(1, thread_name_prefix="semsearch-model")
        # OpenMP counts its threads per calling thread: the one FAISS thread of a serving process
        # (search.read.engine.configure_threads) is set where the searches run
        self.lookup_thread = ThreadPoolExecutor(
            1, thread_name_prefix="semsearch-lookup", initializer=single_threaded
        )
        self.waiting = ThreadPoolExecutor(
            MAX_WAITING, thread_name_prefix="semsearch-rerank", initializer=single_threaded
        )
        self.queue: asyncio.Queue[_Job] | None = None
        self.task: asyncio.Task | None = None
        self.finishing: set[asyncio.Task] = set()
        self.carried: _Job | None = None  # taken from the queue, past the last batch's budget
        self.largest = 0  # most texts embedded in one pass so far: shows batching at work
        self.dropped = 0  # jobs dropped because their request was gone

    async def embed(self, encoding: Encoding, texts: list[str]) -> np.ndarray:
        """Vectors of ``texts``, queued in parts of at most ``PART_TOKENS`` one after the other."""
        return await self.run(encoding, texts, None)

    async def score(self, pairs: Pairs, question: str, texts: Sequence[str]) -> tuple[np.ndarray, int]:
        """The reranker's score of ``question`` and each of ``texts`` (as ``Reranker.score``), and
        the tokens it read: the pairs tokenised as they arrive (on a worker thread when large),
        checked against the request's budget, scored on the model thread in the batches the
        reranker's budget allows, shared with other requests."""
        if len(question) * len(texts) + sum(map(len, texts)) <= INLINE_CHARACTERS:
            ids = pairs.tokenize(question, texts)
        else:
            ids = await asyncio.get_running_loop().run_in_executor(None, pairs.tokenize, question, texts)
        check_budget(ids)
        return await self.run_tokens(pairs, ids, None), sum(map(len, ids))

    async def tokenize(self, encoding: Encoding, texts: Sequence[str], role: Roles = "query") -> Tokens:
        """The token ids of ``texts`` as ``role`` texts (one role for all, or one per text), checked
        against the request's budget (``check_budget``): tokenised on the event loop when the
        request is small, else on a worker thread."""
        if sum(map(len, texts)) <= INLINE_CHARACTERS:
            ids = encoding.tokenize(texts, role)
        else:
            ids = await asyncio.get_running_loop().run_in_executor(None, encoding.tokenize, texts, role)
        check_budget(ids)
        return ids

    def embed_few(self, encoding: Encoding, texts: Sequence[str], role: Roles = "query") -> asyncio.Future:
        """The vectors of ``few`` texts and the tokens the model read, (vectors, tokens), once
        their batch is embedded: tokenised on the model thread with the rest of their batch
        (``_tokenized``), not on the event loop. A future, not a coroutine: no task of its own."""
        return self._queue(encoding, None, None, texts=texts, role=role, counted=True).future

    async def run(
        self,
        encoding: Encoding,
        texts: Sequence[str],
        after: Callable[[np.ndarray], T] | None,
        role: Roles = "query",
        waits: bool = False,
    ) -> Any:
        """``after(encoding.embed(texts, role=role))`` computed off the event loop (the vectors if
        ``after`` is None): ``tokenize``, then ``run_tokens``. ``waits``: ``after`` may wait on
        this batcher (``_Job.waits``). An encoding that embeds nothing (``Encoding.vectorless``)
        runs no model. A few texts (``few``) are tokenised on the model thread with their batch."""
        if few(encoding, texts):
            return await self._queue(encoding, None, after, waits, texts=texts, role=role).future
        if encoding.embeds:
            ids = await self.tokenize(encoding, texts, role)
            return await self.run_tokens(encoding, ids, after, waits)
        vectors = encoding.embed(texts)
        if after is None:
            return vectors
        pool = self.waiting if waits else self.lookup_thread
        return await asyncio.get_running_loop().run_in_executor(pool, after, vectors)

    async def run_tokens(
        self,
        encoding: Encoding | Pairs,
        ids: Tokens,
        after: Callable[[np.ndarray], T] | None,
        waits: bool = False,
    ) -> Any:
        """``after`` of the vectors of texts tokenised by ``tokenize``: with the rest of its batch on
        the lookup thread when the texts fit in one part, else once every part is embedded."""
        parts = split(ids)
        if len(parts) == 1:
            return await self._embed_part(encoding, parts[0], after, waits)
        vectors = np.concatenate([await self._embed_part(encoding, part, None) for part in parts])
        if after is None:
            return vectors
        pool = self.waiting if waits else self.lookup_thread
        return await asyncio.get_running_loop().run_in_executor(pool, after, vectors)

    async def _embed_part(
        self,
        encoding: Encoding | Pairs,
        ids: Tokens,
        after: Callable[[np.ndarray], Any] | None,
        waits: bool = False,
    ) -> Any:
        return await self._queue(encoding, ids, after, waits).future

    def _queue(self, encoding: Encoding | Pairs, ids: Tokens | None, *job: Any, **given: Any) -> _Job:
        """A job (``_Job``'s fields after ``ids``) queued for the worker, started if need be."""
        loop = asyncio.get_running_loop()
        if self.task is None or self.task.get_loop() is not loop:
            self.queue, self.carried = asyncio.Queue(), None
        if self.task is None or self.task.done() or self.task.get_loop() is not loop:
            self.task = loop.create_task(self._work())
        queued = _Job(encoding, ids, loop.create_future(), *job, **given)
        self.queue.put_nowait(queued)
        return queued

    async def _work(self) -> None:
        """Greedy batching: while one batch is embedded, new requests queue up; the next batch takes
        what waits, up to ``max_batch`` texts and the encoder's token budget (the first job always).
        No timer, so a lone request waits for nothing."""
        while True:
            first, self.carried = self.carried or await self.queue.get(), None
            jobs, rows, tokens = [first], first.rows, first.tokens
            budget = batch_tokens(first.encoding)
            while not self.queue.empty():
                waiting = self.queue.get_nowait()
                if rows + waiting.rows > self.max_batch or tokens + waiting.tokens > budget:
                    self.carried = waiting  # the next batch starts with it
                    break
                jobs.append(waiting)
                rows, tokens = rows + waiting.rows, tokens + waiting.tokens
            groups: dict[int, list[_Job]] = {}
            for job in jobs:
                groups.setdefault(id(job.encoding), []).append(job)
            for group in groups.values():
                await self._run(group)

    async def _run(self, jobs: list[_Job]) -> None:
        live = [job for job in jobs if not job.future.done()]
        self.dropped += len(jobs) - len(live)
        if not live:
            return
        self.largest = max(self.largest, sum(job.rows for job in live))
        loop = asyncio.get_running_loop()
        try:
            vectors, failures = await loop.run_in_executor(self.model_thread, _embed, live[0].encoding, live)
        except Exception as exc:  # hand the failure to every request still waiting
            failures = [exc] * len(live)
        for job, failed in zip(live, failures, strict=True):
            if failed is not None and not job.future.done():
                job.future.set_exception(failed)
        live = [job for job, failed in zip(live, failures, strict=True) if failed is None]
        if not live:
            return
        bounds = np.cumsum([0] + [job.rows for job in live])
        mine = [vectors[start:end] for start, end in zip(bounds[:-1], bounds[1:], strict=True)]
        for job, found in zip(live, mine, strict=True):  # nothing to run after: answered here
            if job.after is None and not job.future.done():
                job.future.set_result((found, sum(map(len, job.ids or ()))) if job.counted else found)
        after = [i for i, job in enumerate(live) if job.after is not None]
        if not after:
            return
        together = [i for i in after if not live[i].waits]  # one hop for the batch's lookups
        hops = [(self.lookup_thread, together)] if together else []
        hops += [(self.waiting, [i]) for i in after if live[i].waits]  # each on a thread of its own
        for pool, rows in hops:  # meanwhile the model takes the next batch
            jobs, vectors = [live[i] for i in rows], [mine[i] for i in rows]
            finishing = loop.create_task(self._finish(pool, jobs, vectors))
            self.finishing.add(finishing)
            finishing.add_done_callback(self.finishing.discard)

    async def _finish(self, pool: ThreadPoolExecutor, jobs: list[_Job], vectors: list[np.ndarray]) -> None:
        loop = asyncio.get_running_loop()
        outcomes = await loop.run_in_executor(pool, _outcomes, jobs, vectors)
        for job, (ok, value) in zip(jobs, outcomes, strict=True):
            if job.future.done():  # its request may have gone while the batch ran
                continue
            if ok:
                job.future.set_result(value)
            else:
                job.future.set_exception(value)
