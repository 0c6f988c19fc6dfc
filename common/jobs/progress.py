"""How far a job's run has got, from its counters (``job:{name}:run:{n}``): URLs known, done,
failed by reason, cancelled, expired, the rate over the last minute and an ETA.

``done`` is the URLs with their one outcome (:func:`common.jobs.registry.outcomes`: results,
failed, cancelled, expired), so ``known - done`` is what the run still has to do. The rate is
taken from the run's own readings: every call stores one (its Redis clock, results and
outcomes so far) in ``job:{name}:run:{n}:readings`` (a ZSET kept READINGS_KEEP_S, PX an hour
after the last call), and the rate is the change since the oldest reading of the last minute
that is at least MIN_SPAN_S old. Without one, a run started within the last minute is measured
since its start (its counters were 0 then); otherwise the caller may ``sample_s``: read the
counters again that much later (``job show``, ``job list``). ETA = (known - done) / outcomes
per second; None while nothing finishes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from common.jobs.registry import JobState, outcomes
from common.store.keys import job_run_key

logger = logging.getLogger(__name__)

WINDOW_S = 60
#: Shortest span a rate is taken over: one result 50 ms after a reading is not 20 pages/s.
MIN_SPAN_S = 1.0
READINGS_KEEP_S = 600
_READINGS_TTL_MS = 3_600_000


def readings_key(name: str, run: int) -> str:
    """``job:{name}:run:{n}:readings``: ZSET of "{ms} {results} {outcomes}" by Redis ms."""
    return job_run_key(name, run) + ":readings"


@dataclass(frozen=True)
class RunProgress:
    """One run's figures (``job list``/``show``/``status`` and their ``--json``)."""

    name: str
    state: str
    run: int
    known: int = 0
    done: int = 0
    results: int = 0
    failed: int = 0
    failed_by_reason: dict[str, int] = field(default_factory=dict)
    cancelled: int = 0
    expired: int = 0
    paused: int = 0
    bytes: int = 0
    pages_per_s: float | None = None
    outcomes_per_s: float | None = None
    rate_over_s: float | None = None
    eta_s: float | None = None
    started: int = 0  # ms
    ended: int = 0

    @property
    def left(self) -> int:
        return max(0, self.known - self.done)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Reading:
    at_ms: int
    results: int
    outcomes: int


def measure(client: redis.Redis, states: Sequence[JobState], *,
            sample_s: float = 0.0) -> list[RunProgress]:
    """The progress of each job's current run (a job with no run yet: zeros).

    Args:
        states: the jobs (``JobRegistry.states()``).
        sample_s: for a running run with no stored reading to measure from, read its counters
            again after this many seconds (once for all of them); 0: no rate for those.
    """
    counters, now_ms = _read(client, states)
    rates: dict[str, tuple[float, float, float] | None] = {}
    waiting = []
    for state in states:
        rates[state.name] = None
        if not state.run:
            continue
        reading = _Reading(now_ms, counters[state.name].get("results", 0),
                           outcomes(counters[state.name]))
        earlier = _earliest(client, state, now_ms)
        if earlier is None and state.started and now_ms - state.started < WINDOW_S * 1000:
            earlier = _Reading(state.started, 0, 0)  # its counters started at 0
        if earlier is not None and reading.at_ms - earlier.at_ms >= MIN_SPAN_S * 1000:
            rates[state.name] = _rate(earlier, reading)
        elif state.state == "running":
            waiting.append((state, reading))
        _store(client, state, reading)
    if waiting and sample_s > 0:
        time.sleep(sample_s)
        later, later_ms = _read(client, [state for state, _r in waiting])
        for state, first in waiting:
            reading = _Reading(later_ms, later[state.name].get("results", 0),
                               outcomes(later[state.name]))
            counters[state.name] = later[state.name]
            rates[state.name] = _rate(first, reading)
            _store(client, state, reading)
    return [_progress(state, counters.get(state.name, {}), rates[state.name])
            for state in states]


def _progress(state: JobState, counters: dict[str, int],
              rate: tuple[float, float, float] | None) -> RunProgress:
    done = outcomes(counters)
    known = counters.get("known", 0)
    by_reason = dict(sorted(((k.split(":", 1)[1], v) for k, v in counters.items()
                             if k.startswith("failed:") and v),
                            key=lambda kv: (-kv[1], kv[0])))
    pages = outcomes_rate = span = eta = None
    if rate is not None:
        pages, outcomes_rate, span = rate
        left = max(0, known - done)
        eta = 0.0 if not left else (round(left / outcomes_rate, 1) if outcomes_rate else None)
    return RunProgress(
        name=state.name, state=state.state, run=state.run, known=known, done=done,
        results=counters.get("results", 0), failed=counters.get("failed", 0),
        failed_by_reason=by_reason, cancelled=counters.get("cancelled", 0),
        expired=counters.get("expired", 0), paused=counters.get("paused", 0),
        bytes=counters.get("bytes", 0), pages_per_s=pages, outcomes_per_s=outcomes_rate,
        rate_over_s=span, eta_s=eta, started=counters.get("started", state.started),
        ended=counters.get("ended", 0))


def _rate(earlier: _Reading, later: _Reading) -> tuple[float, float, float]:
    span_s = max(0.001, (later.at_ms - earlier.at_ms) / 1000)
    return (round((later.results - earlier.results) / span_s, 2),
            round((later.outcomes - earlier.outcomes) / span_s, 2), round(span_s, 1))


def _read(client: redis.Redis, states: Sequence[JobState]
          ) -> tuple[dict[str, dict[str, int]], int]:
    """Each job's current run's counters and the Redis clock, in one round trip."""
    pipe = client.pipeline(transaction=False)
    pipe.time()
    runs = [s for s in states if s.run]
    for state in runs:
        pipe.hgetall(job_run_key(state.name, state.run))
    (seconds, micros), *raws = pipe.execute()
    counters = {s.name: {} for s in states}
    for state, raw in zip(runs, raws, strict=True):
        counters[state.name] = {k.decode(): int(v) for k, v in raw.items()}
    return counters, int(seconds) * 1000 + int(micros) // 1000


def _earliest(client: redis.Redis, state: JobState, now_ms: int) -> _Reading | None:
    found = client.zrangebyscore(readings_key(state.name, state.run), now_ms - WINDOW_S * 1000,
                                 now_ms - MIN_SPAN_S * 1000, start=0, num=1)
    if not found:
        return None
    at_ms, results, done = (int(part) for part in found[0].decode().split())
    return _Reading(at_ms, results, done)


def _store(client: redis.Redis, state: JobState, reading: _Reading) -> None:
    if state.state != "running":
        return  # an ended or paused run's rate is over: nothing to measure later
    key = readings_key(state.name, state.run)
    pipe = client.pipeline(transaction=False)
    pipe.zadd(key, {f"{reading.at_ms} {reading.results} {reading.outcomes}": reading.at_ms})
    pipe.zremrangebyscore(key, "-inf", f"({reading.at_ms - READINGS_KEEP_S * 1000}")
    pipe.pexpire(key, _READINGS_TTL_MS)
    try:
        pipe.execute()
    except redis.exceptions.OutOfMemoryError:
        logger.info("job %s run %d: progress reading not kept, Redis is over maxmemory",
                    state.name, state.run)
