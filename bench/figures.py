"""The bench's arithmetic and its table: pure functions, no services.

Every figure is a ratio or a per-unit cost measured within one run, so a noisy shared machine
moves numerator and denominator together.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any


def rate_per_s(times_s: Sequence[float]) -> float:
    """Events per second over the span of ``times_s``: count / (last - first)."""
    if len(times_s) < 2:
        return 0.0
    span = max(times_s) - min(times_s)
    return len(times_s) / span if span > 0 else 0.0


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (pct in 0..100) of ``values``; nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def min_duration_s(requests: int, amount: int, window_s: float) -> float:
    """The shortest first-to-last span a limit of ``amount`` per ``window_s`` allows for
    ``requests`` requests: bursts of ``amount`` one window apart."""
    if requests <= 1:
        return 0.0
    return (math.ceil(requests / amount) - 1) * window_s


def window_excess_s(times_s: Iterable[float], amount: int, window_s: float) -> list[float]:
    """For each request from the ``amount + 1``-th on: how much later than the limit allows it
    came, i.e. its distance to the request ``amount`` before it, minus ``window_s`` (negative:
    that window was over the limit). The requests form ``amount`` interleaved chains, each
    request one window after its predecessor at best: the sum divided by ``amount`` is about
    the time the crawl lost against the limit's pace."""
    ordered = sorted(times_s)
    return [b - a - window_s for a, b in zip(ordered, ordered[amount:], strict=False)]


def windows_over_limit(times_s: Iterable[float], amount: int, window_s: float) -> int:
    """How many requests open a window ``[t, t + window_s)`` holding more than ``amount``
    requests. Any sliding window over the limit contains such a start, so 0 means the limit
    held everywhere."""
    ordered = sorted(times_s)
    over = 0
    end = 0
    for start, t in enumerate(ordered):
        end = max(end, start)
        while end < len(ordered) and ordered[end] < t + window_s:
            end += 1
        if end - start > amount:
            over += 1
    return over


@dataclass
class Row:
    """One line of the table: a figure, its value, the target and the verdict."""

    figure: str
    value: float | None
    unit: str = ""
    target: str = ""
    verdict: str = "info"  # "pass" | "FAIL" | "info" | "skipped"
    digits: int = 2
    note: str = ""

    def value_text(self) -> str:
        if self.value is None or (isinstance(self.value, float) and math.isnan(self.value)):
            return "n/a"
        if abs(self.value) >= 1000:
            return f"{self.value:,.0f}"
        return f"{self.value:.{self.digits}f}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def judge(value: float | None, *, at_most: float | None = None,
          at_least: float | None = None) -> str:
    if value is None or math.isnan(value):
        return "FAIL"
    if at_most is not None and value > at_most:
        return "FAIL"
    if at_least is not None and value < at_least:
        return "FAIL"
    return "pass"


def render_table(rows: Sequence[Row]) -> str:
    """A plain-text table: figure | value | unit | target | result."""
    headers = ("figure", "value", "unit", "target", "result")
    cells = [(r.figure, r.value_text(), r.unit, r.target, r.verdict) for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) if i != 1 else h.rjust(w)
                     for i, (h, w) in enumerate(zip(headers, widths, strict=True)))
    out = [line.rstrip(), "  ".join("-" * w for w in widths)]
    for cell in cells:
        out.append("  ".join(c.rjust(w) if i == 1 else c.ljust(w)
                             for i, (c, w) in enumerate(zip(cell, widths, strict=True))).rstrip())
    return "\n".join(out)
