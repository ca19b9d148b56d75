"""Progress of long work: one bar per task on stderr (count, rate and time left), or nothing.

A task counts in its own unit (entries, sentences, questions) and is done in steps whose pieces
are something else: an encoder's batches of token windows, a scan's blocks of vectors. A step
reports to a ``Share`` (``Progress.step``): it calls it with the share of the step each piece did,
so the bar moves per batch in the task's unit whatever the step's pieces are.

Whether a bar shows is the caller's choice (``enabled``): the CLI shows one on a terminal unless
``--quiet`` (``search.cli.options.progress_options``), never in a pipe.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

Share = Callable[[float], Any]
"""What a step reports to: called after each of its pieces with the share of the step it did."""


class Progress:
    """A bar over ``total`` units of a task, or nothing when not ``enabled`` (then tqdm is not
    even imported: a twentieth of a second of every quiet command). ``total`` None: not known
    ahead (texts streamed from stdin), the bar counts and shows the rate."""

    def __init__(self, total: int | None, desc: str, *, enabled: bool, unit: str = "text"):
        self.total = total
        self.done = 0.0
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit=unit)

    def advance(self, units: float) -> None:
        """``units`` more done (fractions add up: the bar shows whole units)."""
        total = self.total
        self.done = self.done + units if total is None else min(self.done + units, total)
        whole = int(self.done + 1e-9)  # shares of a step add up to its units, to float error
        if self.bar is not None and whole > self.bar.n:
            self.bar.update(whole - self.bar.n)

    def step(self, units: float) -> Share:
        """The ``Share`` of a step that does ``units`` of the task."""
        return lambda share: self.advance(units * share)

    def reach(self, units: float) -> None:
        """At least ``units`` done: where a step that reports no pieces (Ray workers) ends."""
        self.advance(max(0.0, units - self.done))

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if kind is None:  # done: whatever fractions the steps' shares left behind
            self.reach(self.total or 0)
        if self.bar is not None:
            self.bar.close()


def batches(progress: Share | None, total: int) -> Callable[[int], Any] | None:
    """An ``on_batch(count)`` callback for ``total`` pieces, reporting each batch's share."""
    if progress is None or total == 0:
        return None
    return lambda count: progress(count / total)
