"""How far the crawl has got, as a long job reports it: where every URL known is, the rate, an ETA.

Every URL known (the seen-set, or more while a ``--recrawl`` enqueues URLs seen before) is in
exactly one of four places, so ``done + failed + to_do + other == total``:

- done: URLs with a result; failed: URLs with a dead letter. Together they are the done-set
  ``done:{b}`` (one outcome each; trimming the streams does not touch it). Its failed part is
  what is not a result: the results stream's ``entries-added`` (every result is appended once,
  in the script that marks it done, and trimming does not lower the counter) counts the rest;
- to do: still pending, and nothing else: ready in the work queues + delayed in the hold
  queues + deferred in Redis (waiting or being released) + in flight at the workers;
- other: known but neither finished nor pending: expired from a TTL queue, dropped as poison,
  or between two of the readings above (a URL finishing while they are read).

The rate is outcomes (results + failure records) per second over the last minute, or over
the time since the first of them when that is under a minute. Counted from the streams' ids
while they hold the whole window; while a sink trims them (they then keep only what it has not
written), from their ``entries-added`` counters between now and the oldest reading of the last
minute that a ``status`` call stored in Redis (``status:readings``: every call, one-off, JSON
or ``--watch``, stores one). With none, the counters are read again SAMPLE_S later, and up to
SAMPLE_MAX_S while nothing finishes (none when nothing is left to do): a 2 s reading of a
1 URL/s crawl often saw nothing. ETA = to do / rate; ``done`` when nothing is left,
``stalled`` when work is left and nothing finished over the whole span measured.

On a Redis Cluster the two streams are split into one part per shard (common/store/slots.py):
each part is read on its own and their figures merged; ``status:readings`` is one key (one
slot) of sums.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import redis

from common.store.keys import FAILURES_STREAM, RESULTS_STREAM, STATUS_READINGS
from common.store.slots import parts

logger = logging.getLogger(__name__)

WINDOW_S = 60
#: The first wait for a second reading of the counters when no stored one is at hand.
SAMPLE_S = 2.0
#: The longest a one-off status waits for an outcome (work left, nothing finished yet).
SAMPLE_MAX_S = 6.0
#: Shortest time a rate is taken over: one result 50 ms after the start is not 20 pages/s.
MIN_SPAN_S = 1.0
#: How long status readings are kept in Redis (``status:readings``).
STATUS_READINGS_KEEP_S = 600
_READINGS_TTL_MS = 3_600_000
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


def redis_now_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def store_reading(client: redis.Redis, reading: Reading) -> None:
    """Keep ``reading`` for the next status calls' rate (``status:readings``)."""
    pipe = client.pipeline(transaction=False)
    pipe.zadd(STATUS_READINGS,
              {f"{reading.at_ms} {reading.results} {reading.failures}": reading.at_ms})
    pipe.zremrangebyscore(STATUS_READINGS, "-inf",
                          f"({reading.at_ms - STATUS_READINGS_KEEP_S * 1000}")
    pipe.pexpire(STATUS_READINGS, _READINGS_TTL_MS)
    try:
        pipe.execute()
    except redis.exceptions.OutOfMemoryError:
        logger.info("status reading not kept: Redis is over maxmemory (the fleet is paused)")


def earliest_reading(client: redis.Redis, now_ms: int) -> Reading | None:
    """The oldest stored reading of the last minute that is at least MIN_SPAN_S old."""
    found = client.zrangebyscore(STATUS_READINGS, now_ms - WINDOW_S * 1000,
                                 now_ms - MIN_SPAN_S * 1000, start=0, num=1)
    if not found:
        return None
    at_ms, results, failures = (int(part) for part in _text(found[0]).split())
    return Reading(at_ms, results, failures)


def read_counters(client: redis.Redis) -> Reading:
    """The streams' ``entries-added`` counters now."""
    now_ms = redis_now_ms(client)
    return Reading(now_ms, *(_window(client, stream, now_ms)[1]
                             for stream in (RESULTS_STREAM, FAILURES_STREAM)))


def measure(client: redis.Redis, *, seen: int, finished: int, results: int,
            to_do: int) -> dict[str, Any]:
    """The progress part of the status snapshot (see the module docstring).

    Args:
        seen: URLs in the seen-set; finished: in the done-set; results: results recorded
            (``entries-added``, read with ``finished`` in one transaction); to_do: pending
            (queued, delayed, deferred, in flight).

    Returns:
        done, failed, to_do, other, total, percent (done of total), outcomes_per_s,
        pages_per_s, rate_over_s, rate_from ("window": stream ids; "counters": entries-added
        between two readings), eta_s (None unless it can be told) and state ("done",
        "running", "stalled" or "idle": nothing known).
    """
    now_ms = redis_now_ms(client)
    since_ms = now_ms - WINDOW_S * 1000
    (kept, results_added), (failed, failures_added) = (
        _window(client, stream, since_ms) for stream in (RESULTS_STREAM, FAILURES_STREAM))
    reading = Reading(now_ms, results_added, failures_added)
    if kept.complete and failed.complete:
        first = min((w.first_ms for w in (kept, failed) if w.first_ms), default=since_ms)
        span_s = max(MIN_SPAN_S, (now_ms - max(since_ms, first)) / 1000)
        pages, outcomes, source = kept.count, kept.count + failed.count, "window"
    else:
        previous = earliest_reading(client, now_ms)
        if previous is None:  # nothing left to do: no ETA to give, no wait for a sample
            previous, reading = reading, (_sample(client, reading) if to_do else reading)
        span_s = max(0.001, (reading.at_ms - previous.at_ms) / 1000)
        pages = reading.results - previous.results
        outcomes = pages + reading.failures - previous.failures
        source = "counters"
    store_reading(client, reading)
    rate = outcomes / span_s
    done = min(finished, results)
    total = max(seen, finished + to_do)
    if to_do == 0:
        state, eta_s = ("done" if total else "idle"), 0.0
    else:
        state, eta_s = ("running", to_do / rate) if rate > 0 else ("stalled", None)
    return {"done": done, "failed": finished - done, "to_do": to_do,
            "other": total - finished - to_do, "total": total,
            "percent": round(100 * done / total, 1) if total else None,
            "outcomes_per_s": round(rate, 2), "pages_per_s": round(pages / span_s, 2),
            "rate_over_s": round(span_s, 1), "rate_from": source,
            "eta_s": None if eta_s is None else round(eta_s, 1), "state": state}


def _sample(client: redis.Redis, first: Reading) -> Reading:
    """A second reading SAMPLE_S after ``first``; while nothing finished, later ones, up to
    SAMPLE_MAX_S after it."""
    time.sleep(SAMPLE_S)
    reading = read_counters(client)
    while ((reading.results, reading.failures) == (first.results, first.failures)
           and reading.at_ms - first.at_ms < SAMPLE_MAX_S * 1000):
        time.sleep(min(1.0, SAMPLE_MAX_S - (reading.at_ms - first.at_ms) / 1000))
        reading = read_counters(client)
    return reading


def _window(client: redis.Redis, stream: str, since_ms: int) -> tuple[Window, int]:
    """What ``stream`` holds since ``since_ms``, and its ``entries-added`` counter; on a
    cluster, every part of it (common/store/slots.py) merged: the counts and counters summed,
    the oldest entry of any part, whole when every part is."""
    found = [_part_window(client, name, since_ms) for name in parts(stream)]
    if len(found) == 1:
        return found[0]
    firsts = [window.first_ms for window, _added in found if window.first_ms is not None]
    return (Window(sum(window.count for window, _added in found), min(firsts, default=None),
                   all(window.complete for window, _added in found)),
            sum(added for _window, added in found))


def _part_window(client: redis.Redis, stream: str, since_ms: int) -> tuple[Window, int]:
    """:func:`_window` of one stream or part."""
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


def eta_text(progress: dict[str, Any]) -> str:
    """``19s``, ``done``, ``nothing to do`` or ``stalled (nothing finished in 6s)``."""
    if progress["state"] == "done":
        return "done"
    if progress["state"] == "idle":
        return "nothing to do"
    if progress["eta_s"] is None:
        return f"stalled (nothing finished in {format_duration(progress['rate_over_s'])})"
    return format_duration(progress["eta_s"])


def progress_lines(progress: dict[str, Any], width: int | None = None) -> list[str]:
    """``progress: 100 done (16.7%), 20 failed, 470 to do, 10 other; 600 URLs`` and the rate
    with the ETA: one line when ``width`` allows, else two."""
    percent = "-" if progress["percent"] is None else f"{progress['percent']:.1f}%"
    other = f", {progress['other']:,} other" if progress["other"] else ""
    counts = (f"progress: {progress['done']:,} done ({percent}), {progress['failed']:,} failed, "
              f"{progress['to_do']:,} to do{other}; {progress['total']:,} URLs")
    rate = (f"{progress['outcomes_per_s']:g}/s over the last "
            f"{format_duration(progress['rate_over_s'])}" if progress["rate_over_s"] >= 0.1
            else "no rate measured") + f" | ETA {eta_text(progress)}"
    if width is None or len(counts) + 3 + len(rate) <= width:
        return [f"{counts} | {rate}"]
    return [counts, f"  rate {rate}"]
