"""How far the crawl has got, as a long job reports it: done / total known, the rate, an ETA.

- done: URLs whose outcome is recorded, a result or a dead letter (the done-set ``done:{b}``,
  which trimming the streams does not touch);
- to do: ready in the work queues + delayed in the hold queues + in flight at the workers;
- total known: the seen-set (every URL accepted), or done + to do when that is more (a
  ``--recrawl`` enqueues URLs seen before);
- rate: outcomes per second (``results`` + ``failures`` entries) over the last minute, or
  over the time since the first of them when that is under a minute: dividing a 12 s crawl's
  results by 60 s showed 15 pages/s while the queue drained at 78/s. Counted from the
  streams' ids while they hold the whole window; while a sink trims them (they then keep
  only what it has not written), from their ``entries-added`` counters between two readings:
  the earliest of the last minute's ``--watch`` refreshes, else a reading SAMPLE_S apart;
- ETA: to do / rate.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import redis

from common.store.keys import FAILURES_STREAM, RESULTS_STREAM

WINDOW_S = 60
#: The wait for a second reading of the counters when no earlier one is at hand.
SAMPLE_S = 2.0
#: Shortest time a rate is taken over: one result 50 ms after the start is not 20 pages/s.
MIN_SPAN_S = 1.0
#: Entries read per XRANGE page when counting: the reply (and Redis's output buffer for it)
#: stays small however many results the last minute holds.
_COUNT_PAGE = 200


@dataclass(frozen=True)
class Reading:
    """The streams' ``entries-added`` counters at one moment (Redis clock, ms)."""

    at_ms: int
    results: int
    failures: int


@dataclass(frozen=True)
class Window:
    """What one stream holds of the last minute."""

    count: int               # entries held since the window's start
    first_ms: int | None     # time of the oldest entry held
    complete: bool           # nothing of the window has been trimmed


class RateHistory:
    """The readings of the last minute's ``--watch`` refreshes, oldest first."""

    def __init__(self) -> None:
        self.readings: deque[Reading] = deque()

    def add(self, reading: Reading) -> None:
        self.readings.append(reading)
        while reading.at_ms - self.readings[0].at_ms > WINDOW_S * 1000:
            self.readings.popleft()


def redis_now_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def measure(client: redis.Redis, *, seen: int, done: int, to_do: int,
            history: RateHistory | None = None) -> dict[str, Any]:
    """The progress part of the status snapshot (see the module docstring).

    Args:
        seen: URLs in the seen-set; done: in the done-set; to_do: queued, delayed, in flight.
        history: the watch loop's readings, kept across calls (None: a one-off status).
    """
    now_ms = redis_now_ms(client)
    since_ms = now_ms - WINDOW_S * 1000
    (results, results_added), (failures, failures_added) = (
        _window(client, stream, since_ms) for stream in (RESULTS_STREAM, FAILURES_STREAM))
    reading = Reading(now_ms, results_added, failures_added)
    previous = None
    if history is not None:
        history.add(reading)
        previous = history.readings[0]
    if results.complete and failures.complete:
        first = min((w.first_ms for w in (results, failures) if w.first_ms), default=since_ms)
        span_s = max(MIN_SPAN_S, (now_ms - max(since_ms, first)) / 1000)
        pages, outcomes, source = results.count, results.count + failures.count, "window"
    else:
        if previous is None or now_ms - previous.at_ms < MIN_SPAN_S * 1000:
            previous = reading
            time.sleep(SAMPLE_S)
            now_ms = redis_now_ms(client)
            reading = Reading(now_ms, *(_window(client, stream, now_ms)[1]
                                        for stream in (RESULTS_STREAM, FAILURES_STREAM)))
        span_s = (reading.at_ms - previous.at_ms) / 1000
        pages = reading.results - previous.results
        outcomes = pages + reading.failures - previous.failures
        source = "counters"
    rate = outcomes / span_s
    total = max(seen, done + to_do)
    eta_s = 0.0 if to_do == 0 else (to_do / rate if rate > 0 else None)
    return {"done": done, "to_do": to_do, "total": total,
            "percent": round(100 * done / total, 1) if total else None,
            "outcomes_per_s": round(rate, 2), "pages_per_s": round(pages / span_s, 2),
            "rate_over_s": round(span_s, 1), "rate_from": source,
            "eta_s": None if eta_s is None else round(eta_s, 1)}


def _window(client: redis.Redis, stream: str, since_ms: int) -> tuple[Window, int]:
    """What ``stream`` holds since ``since_ms``, and its ``entries-added`` counter."""
    try:
        info = client.xinfo_stream(stream)
    except redis.ResponseError:  # no such key: nothing recorded yet
        return Window(0, None, True), 0
    first = info.get("first-entry")
    first_ms = _ms(first[0]) if first else None
    added, length = int(info["entries-added"]), int(info["length"])
    # Trimming removes the oldest entries (and Redis 7.0 does not count it in
    # max-deleted-entry-id, which only XDEL moves): the window is whole when nothing was
    # removed, or everything removed is older than it.
    removed_before = (first_ms if length else _ms(info["last-generated-id"]) + 1)
    complete = ((added == length or removed_before <= since_ms)
                and _ms(info["max-deleted-entry-id"]) < since_ms)
    count = count_since(client, stream, since_ms) if complete else 0
    return Window(count, first_ms, complete), added


def count_since(client: redis.Redis, stream: str, since_ms: int) -> int:
    """How many entries ``stream`` holds since ``since_ms``, read a page at a time."""
    count, start = 0, str(since_ms)
    while True:
        page = client.xrange(stream, min=start, max="+", count=_COUNT_PAGE)
        count += len(page)
        if len(page) < _COUNT_PAGE:
            return count
        start = "(" + _text(page[-1][0])


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _ms(stream_id: bytes | str) -> int:
    return int(_text(stream_id).split("-")[0])


def format_duration(seconds: float | None) -> str:
    """``45s``, ``4m05s``, ``2h07m``, ``3d04h``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def progress_line(progress: dict[str, Any]) -> str:
    """``progress: 120 of 600 done (20.0%), 480 to do | 25.3/s over the last 12s | ETA 19s``."""
    percent = "-" if progress["percent"] is None else f"{progress['percent']:.1f}%"
    eta = "done" if progress["to_do"] == 0 else format_duration(progress["eta_s"])
    return (f"progress: {progress['done']:,} of {progress['total']:,} done ({percent}), "
            f"{progress['to_do']:,} to do | {progress['outcomes_per_s']:g}/s over the last "
            f"{format_duration(progress['rate_over_s'])} | ETA {eta}")
