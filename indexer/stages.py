"""Stages of a pipeline on threads, with bounded queues between them: a stage ahead of its
consumer (``Ahead``: reading the corpus while the model embeds) and one behind its producer
(``Behind``: writing while the next part embeds), so the slowest stage sets the pace.

Threads rather than processes: the work that runs beside another stage is in code that releases
the GIL (the Rust tokenizer, torch and ONNX Runtime kernels, SQLite's steps, file reads and
writes), and the parts pass between stages without being copied. An error in a stage stops every
stage and is raised, as it was raised there, in the thread that runs the pipeline: no thread is
left waiting on a queue nobody reads (each waits in short slices and checks ``stopped``).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Generic, TypeVar

T = TypeVar("T")

_SLICE = 0.05
"""Seconds a stage waits on a queue before it looks whether the pipeline was stopped."""
_END = object()


class _Stage:
    """A thread, its queue and what stopped it."""

    def __init__(self, depth: int, name: str):
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.stopped = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        try:
            self.work()
        except BaseException as exc:  # raised again where the pipeline runs  # noqa: BLE001
            self.error = exc
            self.stopped.set()

    def work(self) -> None:
        raise NotImplementedError

    def _put(self, item: object) -> bool:
        """``item`` onto the queue unless the pipeline stops first; whether it went."""
        while not self.stopped.is_set():
            try:
                self.queue.put(item, timeout=_SLICE)
                return True
            except queue.Full:
                continue
        return False

    def _get(self) -> object:
        """The next item, or ``_END`` once the pipeline stopped."""
        while not self.stopped.is_set():
            try:
                return self.queue.get(timeout=_SLICE)
            except queue.Empty:
                continue
        return _END

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def __enter__(self):  # noqa: ANN204 - each subclass returns itself
        self.thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stopped.set()
        self.thread.join()


class Ahead(_Stage, Generic[T]):
    """``items`` produced on a thread, at most ``depth`` ahead of the loop that iterates this;
    the producer's error is raised in that loop where its item would have come."""

    def __init__(self, items: Iterable[T], depth: int, name: str):
        super().__init__(depth, name)
        self.items = items

    def work(self) -> None:
        for item in self.items:
            if not self._put(item):
                return
        self._put(_END)

    def __iter__(self) -> Iterator[T]:
        while (item := self._get()) is not _END:
            yield item  # type: ignore[misc]
        self._raise()


class Behind(_Stage, Generic[T]):
    """``work(item)`` on a thread for each item ``give``-n, at most ``depth`` items behind;
    ``finish`` waits for the last. Its error is raised at the next ``give`` or at ``finish``."""

    def __init__(self, work: Callable[[T], None], depth: int, name: str):
        super().__init__(depth, name)
        self.apply = work
        self.done = 0
        """Items worked through so far."""

    def work(self) -> None:
        while (item := self._get()) is not _END:
            self.apply(item)  # type: ignore[arg-type]
            self.done += 1

    def give(self, item: T) -> None:
        self._raise()
        if not self._put(item):
            self._raise()

    def finish(self) -> None:
        """Wait until every item given is worked through; raise the stage's error, if any."""
        self._put(_END)
        self.thread.join()
        self._raise()
