"""The micro-batcher: every text the server embeds goes through it to the one model thread, in
batches of whatever is waiting, and each batch's lookups run together on one lookup thread.
Also the bound on the model work one request may cause (``check_budget``) and the parts a long
request is queued in (``split``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from indexer.errors import BadInput

if TYPE_CHECKING:  # queries are embedded without torch (indexer.encoders.onnx_encoder)
    from search.encoding import Encoding, Roles

# Model work one request may cause, in tokens: each text counts its characters (WordPiece makes at
# most one token of a character), capped at the strategy's max_length (where the model cuts it).
# As much as a full batch of 64 queries at 256 tokens: about 10 s of this 2-core machine under load
# with the default model, at the worst.
MAX_REQUEST_TOKENS = 64 * 256
# A request's texts reach the model in parts of at most this many tokens (counted the same way),
# each queued when the one before is done: other requests get their turn in between, and a request
# whose client hangs up stops after the part being embedded.
PART_TOKENS = 4096

T = TypeVar("T")


def token_bound(text: str, max_length: int) -> int:
    """Most tokens ``text`` can cost the model: WordPiece makes at most one token of a character,
    and the model reads at most ``max_length``."""
    return min(len(text), max_length)


def check_budget(texts: Sequence[str], max_length: int) -> None:
    """Refuse a request whose texts may cost the model more than ``MAX_REQUEST_TOKENS``."""
    bound = sum(token_bound(t, max_length) for t in texts)
    if bound > MAX_REQUEST_TOKENS:
        raise BadInput(
            f"too much text for one request: up to {bound} tokens to embed, at most {MAX_REQUEST_TOKENS} "
            "(each text counts its characters, up to the model's max_length): split it"
        )


def split(texts: Sequence[str], max_length: int, budget: int = PART_TOKENS) -> list[list[str]]:
    """Consecutive parts of ``texts`` of at most ``budget`` tokens each (one text at least)."""
    parts: list[list[str]] = [[]]
    cost = 0
    for text in texts:
        tokens = token_bound(text, max_length)
        if parts[-1] and cost + tokens > budget:
            parts.append([])
            cost = 0
        parts[-1].append(text)
        cost += tokens
    return parts



def _embed(encoding: Encoding, texts: list[str], roles: list[str]) -> np.ndarray:
    return encoding.embed(texts, role=roles)


@dataclass
class _Job:
    encoding: Encoding
    texts: list[str]
    future: asyncio.Future
    after: Callable[[np.ndarray], Any] | None = None  # run on the lookup thread with the vectors
    roles: list[str] = field(default_factory=list)  # each text's role: query or passage (its prefix)


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
    answers back at once.

    Jobs whose requests are gone (cancelled) by the time their batch runs are dropped unembedded;
    a failed or cancelled job never stops the worker, and a worker task that ended is restarted.
    Jobs are grouped by encoding, so each request embeds with its own snapshot's model and
    post-processing, each text read as its role (its prefix). ``run`` is the embedding step of the
    query pipeline (``search.requests.Embedding``).
    """

    def __init__(self, max_batch: int):
        self.max_batch = max_batch
        self.model_thread = ThreadPoolExecutor(1, thread_name_prefix="semsearch-model")
        self.lookup_thread = ThreadPoolExecutor(1, thread_name_prefix="semsearch-lookup")
        self.queue: asyncio.Queue[_Job] | None = None
        self.task: asyncio.Task | None = None
        self.finishing: set[asyncio.Task] = set()
        self.largest = 0  # most texts embedded in one pass so far: shows batching at work
        self.dropped = 0  # jobs dropped because their request was gone

    async def embed(self, encoding: Encoding, texts: list[str]) -> np.ndarray:
        """Vectors of ``texts``, queued in parts of at most ``PART_TOKENS`` one after the other."""
        return await self.run(encoding, texts, None)

    async def run(
        self,
        encoding: Encoding,
        texts: list[str],
        after: Callable[[np.ndarray], T] | None,
        role: Roles = "query",
    ) -> Any:
        """``after(encoding.embed(texts, role=role))`` computed off the event loop (the vectors if
        ``after`` is None): with the rest of its batch on the lookup thread when the texts fit in
        one part, else once every part is embedded. ``role``: the texts are queries or passages
        (their prefix), all of them or one per text. Texts over the request budget are refused first
        (``check_budget``)."""
        check_budget(texts, encoding.strategy.max_length)
        roles = [role] * len(texts) if isinstance(role, str) else list(role)
        parts = split(texts, encoding.strategy.max_length)
        if len(parts) == 1:
            return await self._embed_part(encoding, parts[0], after, roles)
        starts = np.cumsum([0] + [len(part) for part in parts])
        vectors = np.concatenate(
            [
                await self._embed_part(encoding, part, None, roles[start : start + len(part)])
                for part, start in zip(parts, starts, strict=False)
            ]
        )
        return vectors if after is None else await asyncio.to_thread(after, vectors)

    async def _embed_part(
        self,
        encoding: Encoding,
        texts: list[str],
        after: Callable[[np.ndarray], Any] | None,
        roles: list[str],
    ) -> Any:
        loop = asyncio.get_running_loop()
        if self.task is None or self.task.get_loop() is not loop:
            self.queue = asyncio.Queue()
        if self.task is None or self.task.done() or self.task.get_loop() is not loop:
            self.task = loop.create_task(self._work())
        future = loop.create_future()
        self.queue.put_nowait(_Job(encoding, texts, future, after, roles))
        return await future

    async def _work(self) -> None:
        """Greedy batching: while one batch is embedded, new requests queue up; the next batch takes
        all of them. No timer, so a lone request waits for nothing."""
        while True:
            jobs = [await self.queue.get()]
            size = len(jobs[0].texts)
            while size < self.max_batch and not self.queue.empty():
                jobs.append(self.queue.get_nowait())
                size += len(jobs[-1].texts)
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
        texts = [t for job in live for t in job.texts]
        self.largest = max(self.largest, len(texts))
        loop = asyncio.get_running_loop()
        try:
            roles = [r for job in live for r in job.roles]
            vectors = await loop.run_in_executor(self.model_thread, _embed, live[0].encoding, texts, roles)
        except Exception as exc:  # hand the failure to every request still waiting
            for job in live:
                if not job.future.done():
                    job.future.set_exception(exc)
            return
        bounds = np.cumsum([0] + [len(job.texts) for job in live])
        mine = [vectors[start:end] for start, end in zip(bounds[:-1], bounds[1:], strict=True)]
        finishing = loop.create_task(self._finish(live, mine))  # the model takes the next batch
        self.finishing.add(finishing)
        finishing.add_done_callback(self.finishing.discard)

    async def _finish(self, jobs: list[_Job], vectors: list[np.ndarray]) -> None:
        loop = asyncio.get_running_loop()
        outcomes = await loop.run_in_executor(self.lookup_thread, _outcomes, jobs, vectors)
        for job, (ok, value) in zip(jobs, outcomes, strict=True):
            if job.future.done():  # its request may have gone while the batch ran
                continue
            if ok:
                job.future.set_result(value)
            else:
                job.future.set_exception(value)
