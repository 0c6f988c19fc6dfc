"""Progress of a long producer run: a rich progress bar on a terminal, plain lines otherwise.

    with Progress(total=None, label="seeding") as progress:
        producer.submit(progress.track(urls))

On a TTY (or with an explicit rich ``console``) a bar shows count, rate and elapsed time (and
the remaining time when ``total`` is known). Elsewhere (a container log, a pipe) a line like
``seeding: 12000 URLs (2400/s)`` every ``interval_s`` and a final summary line, so logs stay
readable. Not thread-safe: advance from one thread.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import TextIO, TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as RichProgress
from rich.text import Text

T = TypeVar("T")

#: Shortest gap between two updates of the rich bar: advance() may be called per URL.
_RICH_UPDATE_S = 0.1


class _RateColumn(ProgressColumn):
    """Items per second (rich's own speed column counts bytes)."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("-/s" if speed is None else f"{speed:,.0f}/s", style="progress.data.speed")


class Progress:
    """Counts items and shows how fast they go.

    Args:
        total: how many items are expected, or None when unknown.
        label: what is being done ("seeding"), first on every line.
        stream: where to write; default ``sys.stderr``. A TTY gets the rich bar.
        unit: what is counted, in the plain lines.
        interval_s: seconds between two plain lines.
        console: a rich Console to draw the bar on, whatever ``stream`` is (tests).
        clock: monotonic seconds (tests).
    """

    def __init__(self, total: int | None, label: str, stream: TextIO | None = None, *,
                 unit: str = "URLs", interval_s: float = 5.0, console: Console | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self.label = label
        self.unit = unit
        self.interval_s = interval_s
        self.count = 0
        self.stream = sys.stderr if stream is None else stream
        self._clock = clock
        self._started = self._last_line_at = self._last_push_at = clock()
        self._count_at_last_line = 0
        self._pushed = 0
        self._closed = False
        if console is None and _is_tty(self.stream):
            console = Console(file=self.stream)
        self._bar: RichProgress | None = None
        if console is not None:
            self._bar = RichProgress(
                TextColumn("[progress.description]{task.description}"), BarColumn(),
                MofNCompleteColumn(), _RateColumn(), TimeElapsedColumn(),
                *([TimeRemainingColumn()] if total is not None else []),
                console=console, get_time=clock)
            self._task = self._bar.add_task(label, total=total)
            self._bar.start()

    def advance(self, n: int = 1) -> None:
        """Count ``n`` more items; redraws or prints a line when it is time to."""
        if self._closed:
            return
        self.count += n
        now = self._clock()
        if self._bar is not None:
            if now - self._last_push_at >= _RICH_UPDATE_S:
                self._push(now)
        elif now - self._last_line_at >= self.interval_s:
            rate = (self.count - self._count_at_last_line) / (now - self._last_line_at)
            self._line(f"{self._counted()} ({rate:.0f}/s)")
            self._last_line_at, self._count_at_last_line = now, self.count

    def track(self, items: Iterable[T]) -> Iterator[T]:
        """Yield ``items`` unchanged, advancing by one for each."""
        for item in items:
            yield item
            self.advance()

    def close(self, *, failed: bool = False) -> None:
        """Finish: stop the bar, or print the summary line. Idempotent."""
        if self._closed:
            return
        self._closed = True
        now = self._clock()
        elapsed_s = now - self._started
        if self._bar is not None:
            self._push(now)
            self._bar.stop()
            return
        rate = self.count / elapsed_s if elapsed_s > 0 else 0.0
        verb = "stopped after" if failed else "done,"
        self._line(f"{verb} {self._counted()} in {elapsed_s:.1f}s ({rate:.0f}/s)")

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(failed=exc_type is not None)

    def _push(self, now: float) -> None:
        if self._bar is None:
            return
        self._bar.update(self._task, advance=self.count - self._pushed)
        self._pushed, self._last_push_at = self.count, now

    def _counted(self) -> str:
        if self.total is None:
            return f"{self.count} {self.unit}"
        percent = 100 * self.count / self.total if self.total else 100.0
        return f"{self.count}/{self.total} {self.unit}, {percent:.0f}%"

    def _line(self, text: str) -> None:
        print(f"{self.label}: {text}", file=self.stream, flush=True)


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
