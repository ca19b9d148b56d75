"""Progress of long work on stderr: one bar per task on a terminal (count, rate and time left), a
line at least every ``INTERVAL`` seconds in a file or a pipe (a log shows the work is alive), or
nothing.

A task counts in its own unit (entries, sentences, questions) and is done in steps whose pieces
are something else: an encoder's batches of token windows, a scan's blocks of vectors. A step
reports to a ``Share`` (``Progress.step``): it calls it with the share of the step each piece did,
so the bar moves per batch in the task's unit whatever the step's pieces are.

Whether progress shows is the caller's choice (``enabled``): the CLI shows it unless ``--quiet``
(``search.cli.options.progress_options``); where stderr is a terminal it is a bar, elsewhere lines.
Work that is neither (exporting a model to ONNX once) says when it starts and ends (``note``).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

Share = Callable[[float], Any]
"""What a step reports to: called after each of its pieces with the share of the step it did."""

INTERVAL = 30.0
"""Seconds between two progress lines in a file or a pipe (none for work shorter than this)."""

clock = time.monotonic
"""What a progress line reads the time from (a test sets a fake one)."""


def note(line: str) -> None:
    """One line to the user on stderr: what the library does that they would otherwise wait on
    without a word."""
    print(line, file=sys.stderr, flush=True)


def _on_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed
        return False


class Progress:
    """A bar over ``total`` units of a task on a terminal, lines in a file or a pipe, or nothing
    when not ``enabled`` (then tqdm is not even imported: a twentieth of a second of every quiet
    command). ``total`` None: not known ahead (texts streamed from stdin), it counts and shows the
    rate. ``fills``: an end without an error completes the count (a task that can stop early,
    as training does, does not)."""

    def __init__(
        self, total: int | None, desc: str, *, enabled: bool, unit: str = "text", fills: bool = True
    ):
        self.total, self.desc, self.unit, self.fills = total, desc, unit, fills
        self.done = 0.0
        self.bar = None
        self.lines = enabled and not _on_terminal()
        self.started = self.said = clock()
        self.extra = ""
        if enabled and not self.lines:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit=unit)

    def advance(self, units: float) -> None:
        """``units`` more done (fractions add up: the bar shows whole units)."""
        total = self.total
        self.done = self.done + units if total is None else min(self.done + units, total)
        whole = int(self.done + 1e-9)  # shares of a step add up to its units, to float error
        if self.bar is not None and whole > self.bar.n:
            self.bar.update(whole - self.bar.n)
        if self.lines and clock() - self.said >= INTERVAL:
            self._line()

    def show(self, text: str) -> None:
        """A short state beside the count (a training loss)."""
        self.extra = text
        if self.bar is not None:
            self.bar.set_postfix_str(text)

    def _line(self, ended: bool = False) -> None:
        """``desc: done/total units (share), rate, time left`` (or the time it took, ``ended``)."""
        now = clock()
        self.said, spent, whole = now, now - self.started, int(self.done + 1e-9)
        rate = whole / spent if spent > 0 else 0.0
        count = f"{whole:,}" if self.total is None else f"{whole:,}/{self.total:,}"
        share = f" ({whole / self.total:.0%})" if self.total else ""
        if ended:
            timing = f"done in {spent:.0f}s"
        elif self.total and rate > 0:
            timing = f"about {(self.total - whole) / rate:.0f}s left"
        else:
            timing = f"{spent:.0f}s so far"
        extra = f", {self.extra}" if self.extra else ""
        note(f"{self.desc}: {count} {self.unit}s{share}, {rate:.1f} {self.unit}s/s, {timing}{extra}")

    def step(self, units: float) -> Share:
        """The ``Share`` of a step that does ``units`` of the task."""
        return lambda share: self.advance(units * share)

    def total_is(self, total: int) -> None:
        """The total, once known (a corpus streamed: at the end of its read)."""
        self.total = total
        if self.bar is not None:
            self.bar.total = total
            self.bar.refresh()

    def reach(self, units: float) -> None:
        """At least ``units`` done: where a step that reports no pieces (Ray workers) ends."""
        self.advance(max(0.0, units - self.done))

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if kind is None:  # done: whatever fractions the steps' shares left behind
            if self.fills:
                self.reach(self.total or 0)
            if self.lines and self.said > self.started:  # a task long enough to have said lines
                self._line(ended=True)
        if self.bar is not None:
            self.bar.close()


def batches(progress: Share | None, total: int) -> Callable[[int], Any] | None:
    """An ``on_batch(count)`` callback for ``total`` pieces, reporting each batch's share."""
    if progress is None or total == 0:
        return None
    return lambda count: progress(count / total)


def size_of(directory: Path) -> int:
    """Bytes of the files under ``directory`` (0 where it is not there)."""
    with contextlib.suppress(OSError):
        return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
    return 0


@contextlib.contextmanager
def exporting(model: str, into: Path) -> Iterator[None]:
    """Say that ``model`` is being exported to ONNX into the cache ``into`` (minutes for a large
    model, with nothing else to show), and when it is done, how long it took and what the cache
    holds now."""
    note(f"exporting {model} to ONNX once, into {into} (a large model takes minutes; later runs reuse it)")
    began = clock()
    yield
    size = size_of(into) / 1e6
    note(f"exported {model} to ONNX in {clock() - began:.0f}s: {into} now holds {size:,.0f} MB")
