"""Backpressure: when a worker stops taking deliveries, and when it takes them again.

A paused worker has cancelled its consumers, so new messages wait in RabbitMQ, where they are
durable; what it had already received (fetch tasks, the local buffer: at most the prefetch
window) finishes normally. It pauses while any of these holds, and resumes once none does:

* ``Redis memory``: used_memory above REDIS_MEMORY_HIGH of maxmemory, until it is below
  REDIS_MEMORY_LOW (never without a maxmemory);
* ``results backlog``: the largest registered sink's backlog (lag + pending on ``results`` and
  ``failures``, common/store/backlog.py) above RESULTS_BACKLOG_HIGH, until below
  RESULTS_BACKLOG_LOW;
* ``Redis unavailable`` / ``Redis refusing``: the check itself got no answer / an error reply,
  until a check succeeds;
* ``Redis errors``: the fetch tasks met at least :func:`unhealthy_after` error replies in a
  row, OOM not counted (memory has its own watermark and a restart frees none). The worker is
  then unhealthy (/healthz answers 503, so an orchestrator restarts it) until a delivery
  succeeds. Meanwhile it pauses until ERRORS_RETRY_S passed without a new error, then takes
  deliveries again to find out: a success ends the streak, another error pauses it again.

The monitor thread reads Redis every PRESSURE_CHECK_S, one round trip, and publishes a
:class:`Verdict`. The I/O thread (common/work/worker.py) looks at it each turn and cancels or
re-creates the consumers: only it touches pika, and it never waits on Redis.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from common.core.config import Settings
from common.core.errors import REDIS_UNAVAILABLE
from common.store.backlog import Fill, read_fill
from common.work import metrics

logger = logging.getLogger(__name__)

MEMORY = "Redis memory"
BACKLOG = "results backlog"
ERRORS = "Redis errors"
UNAVAILABLE = "Redis unavailable"
REFUSING = "Redis refusing"
#: Every reason and its ``fleet_worker_paused`` label.
REASON_LABELS = {MEMORY: "redis_memory", BACKLOG: "results_backlog", ERRORS: "redis_errors",
                 UNAVAILABLE: "redis_unavailable", REFUSING: "redis_refusing"}

#: Error replies in a row per fetch task before the worker is unhealthy (see unhealthy_after).
UNHEALTHY_ROUNDS = 3
UNHEALTHY_MIN = 10
#: A worker paused for Redis errors tries again after this long without a new one.
ERRORS_RETRY_S = 10.0


def unhealthy_after(concurrency: int) -> int:
    """N, the error replies in a row that make a worker unhealthy: three per fetch task, at
    least 10. One transient refusal (a failed BGSAVE, a blip) hits at most the ``concurrency``
    deliveries running at that moment, and one success ends the streak; three rounds of
    every thread refused without a single success is, with the growing wait between refusals
    (0.2-0.4 s, doubling up to 2.5-5 s), about ten seconds of nothing but refusals."""
    return max(UNHEALTHY_MIN, UNHEALTHY_ROUNDS * concurrency)


@dataclass(frozen=True)
class Streak:
    """Error replies the fetch tasks met in a row (OOM not counted)."""

    count: int = 0
    last_at: float = 0.0  #: time.monotonic() of the last one
    last_error: str = ""


class Watermark:
    """A latch with hysteresis: engaged above ``high``, released below ``low``."""

    def __init__(self, high: float, low: float) -> None:
        self.high = high
        self.low = low
        self.engaged = False

    def update(self, value: float | None) -> bool:
        """Take a new value (None: nothing to watch, released); returns ``engaged``."""
        if value is None:
            self.engaged = False
        elif self.engaged:
            self.engaged = not value < self.low
        else:
            self.engaged = value > self.high
        return self.engaged


@dataclass(frozen=True)
class Verdict:
    """Whether the worker pauses, why, and the figures behind it."""

    reasons: tuple[str, ...] = ()
    unhealthy: str | None = None  #: why /healthz answers 503; None: healthy
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def paused(self) -> bool:
        return bool(self.reasons)

    @property
    def reason(self) -> str | None:
        return self.reasons[0] if self.reasons else None

    def as_dict(self) -> dict[str, Any]:
        """What the heartbeat carries (``pressure`` in workers:{id})."""
        return {"paused": self.paused, "reason": self.reason, "reasons": list(self.reasons),
                "healthy": self.unhealthy is None, "unhealthy": self.unhealthy, **self.figures}


class Pressure:
    """The decision, from one reading: no Redis, no clock, no threads (unit-tested alone)."""

    def __init__(self, settings: Settings, unhealthy_after_errors: int,
                 errors_retry_s: float = ERRORS_RETRY_S) -> None:
        self.memory = Watermark(settings.redis_memory_high, settings.redis_memory_low)
        self.backlog = Watermark(settings.results_backlog_high, settings.results_backlog_low)
        self.unhealthy_after = unhealthy_after_errors
        self.errors_retry_s = errors_retry_s

    def decide(self, fill: Fill | None, failure: BaseException | None, streak: Streak,
               now: float) -> Verdict:
        """``fill``: this check's reading, or None when it failed with ``failure`` (the
        watermarks then keep their state). ``now``: time.monotonic()."""
        reasons: list[str] = []
        figures: dict[str, Any] = {
            "memory_high": self.memory.high, "memory_low": self.memory.low,
            "backlog_high": self.backlog.high, "backlog_low": self.backlog.low,
            "errors_in_a_row": streak.count, "unhealthy_after": self.unhealthy_after}
        if fill is None:
            reasons.append(UNAVAILABLE if isinstance(failure, REDIS_UNAVAILABLE) else REFUSING)
            figures["error"] = f"{type(failure).__name__}: {failure}"[:300]
        else:
            self.memory.update(fill.memory_ratio)
            self.backlog.update(fill.backlog)
            figures.update(fill.figures())
        reasons += [reason for reason, mark in ((MEMORY, self.memory), (BACKLOG, self.backlog))
                    if mark.engaged]
        unhealthy = None
        if streak.count >= self.unhealthy_after:
            unhealthy = f"{streak.count} Redis errors in a row, the last: {streak.last_error}"
            if now - streak.last_at < self.errors_retry_s:
                reasons.append(ERRORS)
        return Verdict(tuple(reasons), unhealthy, figures)


class PressureMonitor:
    """A thread that checks every ``interval_s`` and keeps :attr:`verdict` current.

    Args:
        streak: the fetch tasks' error streak, asked once per check.
    """

    def __init__(self, client: redis.Redis, pressure: Pressure, streak: Callable[[], Streak],
                 interval_s: float) -> None:
        self.client = client
        self.pressure = pressure
        self.streak = streak
        self.interval_s = interval_s
        self.verdict = Verdict()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pressure", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval_s + 15)

    def health(self) -> tuple[bool, str]:
        """For /healthz: (healthy, why not)."""
        unhealthy = self.verdict.unhealthy
        return unhealthy is None, unhealthy or "ok"

    def check(self) -> Verdict:
        """One check: one Redis round trip, then the decision."""
        try:
            fill, failure = read_fill(self.client), None
        except redis.RedisError as exc:
            fill, failure = None, exc
        verdict = self.pressure.decide(fill, failure, self.streak(), time.monotonic())
        if verdict.reasons != self.verdict.reasons:
            if verdict.paused:
                logger.warning("pressure: %s %s", ", ".join(verdict.reasons), _brief(verdict))
            else:
                logger.info("pressure gone %s", _brief(verdict))
        if (verdict.unhealthy is None) != (self.verdict.unhealthy is None):
            logger.log(logging.ERROR if verdict.unhealthy else logging.INFO, "health: %s",
                       verdict.unhealthy or "ok again")
        self.verdict = verdict
        _export(verdict)
        return verdict

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.check()
            except Exception:  # noqa: BLE001 - the monitor must outlive a bug in one check
                logger.exception("pressure check failed")
            self._stop.wait(self.interval_s)


def _brief(verdict: Verdict) -> str:
    f = verdict.figures
    if "error" in f:
        return f"({f['error']})"
    ratio = f.get("memory_ratio")
    memory = "no maxmemory" if ratio is None else f"memory {ratio:.2f} of maxmemory"
    return (f"({memory}, high {f['memory_high']}/low {f['memory_low']}; backlog "
            f"{f.get('backlog')}, high {f['backlog_high']}/low {f['backlog_low']}; "
            f"{f['errors_in_a_row']} Redis errors in a row)")


def _export(verdict: Verdict) -> None:
    for reason, label in REASON_LABELS.items():
        metrics.PAUSED.labels(label).set(1 if reason in verdict.reasons else 0)
    metrics.HEALTHY.set(1 if verdict.unhealthy is None else 0)
    figures = verdict.figures
    if "used_memory" in figures:
        metrics.REDIS_USED_MEMORY.set(figures["used_memory"])
        metrics.REDIS_MAXMEMORY.set(figures["maxmemory"])
        metrics.RESULTS_BACKLOG.set(figures["backlog"])
